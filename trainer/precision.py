"""Which Keras dtype policy this process trains in: `--mixed-precision auto|float16|bfloat16|off`.

`choose` is pure: from what was asked for and what the machine has, it returns the policy and,
when the machine has no fast path for it, a warning. `apply` is the edge: it reads the local
devices, sets the global policy (before any model is built) and logs the choice once.

auto picks the fastest policy for the machine it runs on:
- mixed_float16 when there are GPUs and every one has compute capability 7.0 or more (tensor cores);
- on a machine without GPUs whose CPU has bfloat16 instructions (AVX512-BF16 or AMX), it measures
  the task's own model: its forward and backward pass on a batch of its data, built once in float32
  and once in bfloat16 (`measure_model`), and takes mixed_bfloat16 only when that is at least
  BFLOAT16_MARGIN faster. Neither the flags nor any one model can decide it for every model: on
  one AVX512-BF16 CPU without AMX a ResNet50 step ran at 0.74-0.8x float32 in bfloat16, on another
  (AMD EPYC, family 26) at 1.3-1.9x; there, an MLP of a few thousand weights and a small convnet
  on 32 px images ran at 0.84x and 0.95x, the same convnet on 96 px images and a transformer
  block at 1.3-1.4x (benchmarks/precision.py). Every task of a synchronous job decides on the
  mean of all tasks' figures (one all-reduce), so all train in the same policy;
- float32 otherwise (without bfloat16 instructions it is emulated, about 6x slower).
Under both mixed policies the variables stay float32 and the model's softmax is float32, so
checkpoints load into a model built under any policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Iterable, Iterator, Sequence

log = logging.getLogger("trainer")

CHOICES = ("auto", "float16", "bfloat16", "off")
POLICY = {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16", "off": "float32"}
# Tensor cores arrived with Volta (7.0); older GPUs run float16 no faster than float32.
MIN_FLOAT16_CAPABILITY = (7, 0)
# The /proc/cpuinfo flags of CPUs that compute in bfloat16 natively; auto measures on them.
BFLOAT16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# bfloat16 must beat float32 by this much: below it, run-to-run noise could flip the choice,
# and the gain would not pay for bfloat16's coarser gradients.
BFLOAT16_MARGIN = 1.15


@dataclasses.dataclass(frozen=True)
class Devices:
    """What precision depends on: each local GPU's compute capability, and the CPU's flags."""

    gpu_capabilities: tuple[tuple[int, int], ...]
    cpu_flags: frozenset[str]

    @property
    def float16_fast(self) -> bool:
        return bool(self.gpu_capabilities) and all(cc >= MIN_FLOAT16_CAPABILITY for cc in self.gpu_capabilities)

    @property
    def bfloat16_native(self) -> bool:
        # With GPUs, the compute runs there, whatever the host CPU can do.
        return not self.gpu_capabilities and bool(self.cpu_flags & BFLOAT16_CPU_FLAGS)

    def describe(self) -> str:
        if self.gpu_capabilities:
            return "GPUs with compute capability " + ", ".join(f"{a}.{b}" for a, b in self.gpu_capabilities)
        if "amx_bf16" in self.cpu_flags:
            return "no GPU; CPU has AMX bfloat16"
        if "avx512_bf16" in self.cpu_flags:
            return "no GPU; CPU has AVX512-BF16 but no AMX"
        return "no GPU; CPU has no bfloat16 matrix instructions"


@dataclasses.dataclass(frozen=True)
class Choice:
    policy: str  # a Keras policy name: mixed_float16, mixed_bfloat16 or float32
    reason: str
    warning: str | None = None


@dataclasses.dataclass(frozen=True)
class Speeds:
    """Milliseconds per step of the same work in float32 and in bfloat16 (measure_model)."""

    float32_ms: float
    bfloat16_ms: float
    what: str = "the model"  # what was timed, for the log line

    @property
    def bfloat16_gain(self) -> float:
        return self.float32_ms / self.bfloat16_ms


def choose(requested: str, devices: Devices, speeds: Speeds | None = None) -> Choice:
    """`speeds` is what measure_model found on this machine (auto on a CPU with bfloat16
    instructions); without it, auto keeps float32 there."""
    if requested not in CHOICES:
        raise ValueError(f"--mixed-precision must be one of {', '.join(CHOICES)}, got {requested!r}")
    if requested == "auto":
        if devices.float16_fast:
            return Choice("mixed_float16", f"auto: {devices.describe()}")
        if devices.bfloat16_native and speeds is not None:
            policy = "mixed_bfloat16" if speeds.bfloat16_gain >= BFLOAT16_MARGIN else "float32"
            return Choice(policy, f"auto: {devices.describe()}; timed {speeds.what}, forward and backward: "
                                  f"{speeds.float32_ms:.1f} ms in float32, {speeds.bfloat16_ms:.1f} ms in bfloat16 "
                                  f"(x{speeds.bfloat16_gain:.2f}; bfloat16 needs x{BFLOAT16_MARGIN:.2f})")
        return Choice("float32", f"auto: no fast reduced-precision path ({devices.describe()})")
    policy = POLICY[requested]
    fast = {"float16": devices.float16_fast, "bfloat16": devices.bfloat16_native, "off": True}[requested]
    warning = None
    if not fast:
        warning = (f"--mixed-precision {requested}: this machine has no fast path for it "
                   f"({devices.describe()}); training in {policy} anyway, likely slower than float32")
    return Choice(policy, f"--mixed-precision {requested}", warning)


def _best_step_ms(model, inputs, repeats: int = 2, seconds: float = 0.5) -> float:
    """The fastest of the compiled forward and backward passes, after one untimed one: at least
    `repeats` of them, more while they have taken less than `seconds` (a step of a few
    milliseconds is timed many times), at most 50."""
    import time

    import tensorflow as tf

    @tf.function(autograph=False)  # the model traced as the loop traces it (trainer.library.loop)
    def step():
        with tf.GradientTape() as tape:
            outputs = tf.nest.flatten(model(inputs, training=True))
            loss = tf.add_n([tf.reduce_mean(tf.cast(output, tf.float32) ** 2) for output in outputs])
        return tape.gradient(loss, model.trainable_variables)

    step()  # traces and warms up
    best, spent, done = float("inf"), 0.0, 0
    while done < repeats or (spent < seconds and done < 50):
        started = time.perf_counter()
        for tensor in tf.nest.flatten(step(), expand_composites=True):  # IndexedSlices too
            tensor.numpy()
        elapsed = time.perf_counter() - started
        best, spent, done = min(best, elapsed), spent + elapsed, done + 1
    return best * 1e3


def measure_model(build, inputs) -> Speeds:
    """Times `build()`'s model (a Keras model, built here twice, outside any strategy) on `inputs`,
    a batch of its own data, in float32 and under mixed_bfloat16."""
    import tensorflow as tf

    milliseconds = []
    for policy in ("float32", "mixed_bfloat16"):
        with _policy(policy):
            milliseconds.append(_best_step_ms(build(), inputs))
    batch = int(tf.shape(tf.nest.flatten(inputs)[0])[0])
    return Speeds(*milliseconds, what=f"this task's model on a batch of {batch}")


def cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo."""
    for line in cpuinfo_text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def parse_capability(text: str | Sequence[int] | None) -> tuple[int, int]:
    """TensorFlow reports (major, minor); some builds give "8.6"."""
    if text is None:
        return (0, 0)
    if isinstance(text, str):
        major, _, minor = text.partition(".")
        return int(major), int(minor or 0)
    return int(text[0]), int(text[1])


def local_devices(gpus: Iterable | None = None, cpuinfo_path: str = "/proc/cpuinfo") -> Devices:
    """This machine's devices, from TensorFlow (GPUs) and /proc/cpuinfo (CPU flags)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    capabilities = tuple(
        parse_capability(tf.config.experimental.get_device_details(gpu).get("compute_capability")) for gpu in gpus
    )
    try:
        with open(cpuinfo_path) as handle:
            flags = cpu_flags(handle.read())
    except OSError:
        flags = frozenset()
    return Devices(capabilities, flags)


def apply(requested: str, agree=None, measure=None) -> str:
    """Sets the global Keras policy for every model built after it, logs it, and returns its name.

    auto on a CPU with bfloat16 instructions measures first (`measure`, which returns Speeds;
    without it, auto keeps float32 there);
    `agree`, given by synchronous jobs, maps this task's [float32 ms, bfloat16 ms] to the mean over
    every task, so that all of them choose alike. A policy asked for by name is never measured over.
    """
    import keras

    devices = local_devices()
    speeds = None
    if requested == "auto" and not devices.float16_fast and devices.bfloat16_native and measure is not None:
        speeds = measure()
        if agree is not None:
            speeds = Speeds(*agree([speeds.float32_ms, speeds.bfloat16_ms]), what=speeds.what)
    choice = choose(requested, devices, speeds)
    if choice.warning:
        log.warning("%s", choice.warning)
    # Keras checks the devices too and logs a three-line warning for mixed_float16 without a GPU;
    # the line above has said it once already, with the reason.
    keras_log = logging.getLogger("tensorflow")
    level = keras_log.level
    keras_log.setLevel(logging.ERROR)
    try:
        keras.mixed_precision.set_global_policy(choice.policy)
    finally:
        keras_log.setLevel(level)
    log.info("precision: %s (%s)", choice.policy, choice.reason)
    return choice.policy


@contextlib.contextmanager
def _policy(name: str) -> Iterator[None]:
    import keras

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def float32_policy() -> contextlib.AbstractContextManager[None]:
    """Keras layers built inside compute in float32, whatever policy the job trains in: what an
    export or an evaluation builds (the variables are float32 under every policy)."""
    return _policy("float32")
