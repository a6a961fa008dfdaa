"""Which Keras dtype policy this process trains in: `--mixed-precision auto|float16|bfloat16|off`.

`choose` is pure: from what was asked for and what the machine has, it returns the policy and,
when the machine has no fast path for it, a warning. `apply` is the edge: it reads the local
devices, sets the global policy (before any model is built) and logs the choice once.

auto picks the fastest policy the hardware runs natively:
- mixed_float16 when there are GPUs and every one has compute capability 7.0 or more (tensor cores);
- mixed_bfloat16 on a machine without GPUs whose CPU has AMX (Sapphire Rapids and later), where
  oneDNN runs bf16 convolutions on the tile units: a ResNet50 train step (160 px, batch 16) ran
  2.0-2.4x float32 there. AVX512-BF16 alone is not enough: on such a CPU (Cooper Lake class, no
  AMX) the same step ran at 0.74-0.8x float32, so auto keeps float32 there;
- float32 otherwise.
Under both mixed policies the variables stay float32 and the model's softmax is float32, so
checkpoints load into a model built under any policy.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Sequence

log = logging.getLogger("trainer")

CHOICES = ("auto", "float16", "bfloat16", "off")
POLICY = {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16", "off": "float32"}
# Tensor cores arrived with Volta (7.0); older GPUs run float16 no faster than float32.
MIN_FLOAT16_CAPABILITY = (7, 0)
# The /proc/cpuinfo flag of CPUs whose bfloat16 matrix units beat float32 (see above).
BFLOAT16_CPU_FLAGS = frozenset({"amx_bf16"})


@dataclasses.dataclass(frozen=True)
class Devices:
    """What precision depends on: each local GPU's compute capability, and the CPU's flags."""

    gpu_capabilities: tuple[tuple[int, int], ...]
    cpu_flags: frozenset[str]

    @property
    def float16_fast(self) -> bool:
        return bool(self.gpu_capabilities) and all(cc >= MIN_FLOAT16_CAPABILITY for cc in self.gpu_capabilities)

    @property
    def bfloat16_fast(self) -> bool:
        # With GPUs, the compute runs there, whatever the host CPU can do.
        return not self.gpu_capabilities and bool(self.cpu_flags & BFLOAT16_CPU_FLAGS)

    def describe(self) -> str:
        if self.gpu_capabilities:
            return "GPUs with compute capability " + ", ".join(f"{a}.{b}" for a, b in self.gpu_capabilities)
        if self.cpu_flags & BFLOAT16_CPU_FLAGS:
            return "no GPU; CPU has AMX bfloat16"
        if "avx512_bf16" in self.cpu_flags:
            return "no GPU; CPU has AVX512-BF16 but no AMX"
        return "no GPU; CPU has no bfloat16 matrix instructions"


@dataclasses.dataclass(frozen=True)
class Choice:
    policy: str  # a Keras policy name: mixed_float16, mixed_bfloat16 or float32
    reason: str
    warning: str | None = None


def choose(requested: str, devices: Devices) -> Choice:
    if requested not in CHOICES:
        raise ValueError(f"--mixed-precision must be one of {', '.join(CHOICES)}, got {requested!r}")
    if requested == "auto":
        if devices.float16_fast:
            return Choice("mixed_float16", f"auto: {devices.describe()}")
        if devices.bfloat16_fast:
            return Choice("mixed_bfloat16", f"auto: {devices.describe()}")
        return Choice("float32", f"auto: no fast reduced-precision path ({devices.describe()})")
    policy = POLICY[requested]
    fast = {"float16": devices.float16_fast, "bfloat16": devices.bfloat16_fast, "off": True}[requested]
    warning = None
    if not fast:
        warning = (f"--mixed-precision {requested}: this machine has no fast path for it "
                   f"({devices.describe()}); training in {policy} anyway, likely slower than float32")
    return Choice(policy, f"--mixed-precision {requested}", warning)


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


def apply(requested: str) -> str:
    """Sets the global Keras policy for every model built after it, logs it, and returns its name."""
    import tensorflow as tf

    choice = choose(requested, local_devices())
    if choice.warning:
        log.warning("%s", choice.warning)
    # Keras checks the devices too and logs a three-line warning for mixed_float16 without a GPU;
    # the line above has said it once already, with the reason.
    keras_log = logging.getLogger("tensorflow")
    level = keras_log.level
    keras_log.setLevel(logging.ERROR)
    try:
        tf.keras.mixed_precision.set_global_policy(choice.policy)
    finally:
        keras_log.setLevel(level)
    log.info("precision: %s (%s)", choice.policy, choice.reason)
    return choice.policy
