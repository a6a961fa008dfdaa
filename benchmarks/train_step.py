"""ResNet50 training throughput: the lab's configuration, tf-keras `fit` and the trainer's Keras 3 loop, side by side.

    python benchmarks/train_step.py [--steps 4] [--rounds 8] [--batch 16] [--image-size 160] [--matmul-size 4096]
                                    [--matmul-repeats 5] [--results-dir DIR]

Every configuration trains the same ResNet50 + head on one generated batch already in memory, so
only the train step is measured. Each configuration's model is built and compiled once, and a
warm-up round (not recorded) pays its first calls; then --rounds short rounds of --steps steps
each, the configurations interleaved and their order rotated from round to round, so that a
change in the cores this process gets hits every configuration alike (benchmarks/rounds.py).
Each round records the wall rate, the CPU seconds per image (every thread of this process), the
cores that makes, and what other processes and the hypervisor took meanwhile. A round whose cores
depart from its configuration's median is flagged; the ratios come from the wall rates of the
rounds where nothing was flagged, or, when fewer than half are clean, from CPU per image.

  lab                          tf-keras `fit`, float32, float32 input scaled on the host (the
                               codelab's model, as it ran multi-worker before this runtime's loop)
  tf-keras fit, trainer's model the trainer's ResNet50 + head (uint8 input normalised and augmented
                               in the model) built with tf-keras and trained by tf-keras `fit`, in
                               the default's policy: what the runtime trained with until it moved to
                               Keras 3
  trainer default              the same model in Keras 3, trained by the runtime's own loop
                               (trainer.loop, as a job compiles and steps it), `--mixed-precision
                               auto` on this machine: mixed_float16 on GPUs with tensor cores; on
                               CPUs with bfloat16 instructions, what trainer.precision's measurement
                               of this model picks (the same measurement a job makes at start); else
                               float32
  trainer, float32             when the default is not float32: the Keras 3 loop in float32
  trainer, mixed_bfloat16      asked for explicitly, on a CPU: shows what bfloat16 does here
  trainer default + XLA + 8 steps/execution   on a GPU: the remaining speed flags

Distance to the machine's limit: before the rounds, `matmul_peak` times `tf.matmul` on two
--matmul-size square operands in each precision a configuration multiplies in (float32, and
bfloat16 for mixed_bfloat16), best of --matmul-repeats, on every core; `train_flops_per_image`
counts a train step's FLOPs per image with TensorFlow's profiler. Each row's GFLOP/s is its wall
rate times that, and its share of the peak in its own precision. The batch is fed with tf.data's
autotuning off (in_memory_batches says why: with it on, every round ended on a mark of a
doubling timer, which made the rates 25.0 or 12.5 images/s whatever the configuration).

The last line, `summary: default_over_tf_keras=K default_over_lab=R default_over_best=B
default_share_of_peak=S (...)`, gives the default's speed over tf-keras `fit` of the same model in
the same policy (K, the Keras 3 loop against what it replaced), over the lab and over the faster
of the trainer in float32 and in mixed_bfloat16 (on CPUs), its share of the peak, and the measure
the ratios came from (wall rates of rounds where both had the same cores, or CPU seconds per
image). The table also goes to benchmarks/results/train_step/KIND.md, one
file per machine kind (benchmarks/machine.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer import cli, precision  # noqa: E402
from trainer.checks import selfcheck  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

# benchmarks/ is first on the path when this runs as a script
import legacy_keras  # noqa: E402
import rounds as rounds_lib  # noqa: E402
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402


# What each configuration's policy multiplies in: the peak it is measured against.
POLICY_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def matmul_peak(dtype: str, size: int = 4096, repeats: int = 5) -> float:
    """This machine's matrix-multiply rate in `dtype`, FLOP/s: the best of `repeats` timed calls of
    `tf.matmul` on two `size` x `size` operands, on every core TensorFlow's intra-op pool has (a
    matmul of this size is split over all of them). 2 size^3 FLOPs a call. The result is reduced
    to one element inside the function, so that copying it out costs nothing, while the whole
    product is still computed (no graph rewrite slices a MatMul)."""
    operands = [tf.cast(tf.random.stateless_uniform((size, size), (seed, 0)), dtype) for seed in (1, 2)]
    product = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)[0, 0]))
    product(*operands).numpy()  # traced, and oneDNN's kernel set up, outside the timing
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        product(*operands).numpy()
        best = min(best, time.perf_counter() - started)
    return 2.0 * size ** 3 / best


def gflop_rate(flops_per_second: float) -> str:
    """A FLOP/s figure in GFLOP/s to three significant figures, whole ones from 100 up: a smoke
    run's small matmul on a loaded machine peaks below 1, which whole GFLOP/s printed as 0."""
    value = flops_per_second / 1e9
    decimals = 0 if value >= 100 or value <= 0 else 2 - math.floor(math.log10(value))
    return f"{value:.{decimals}f}"


FLOPS_SOURCE = ("counted by TensorFlow's profiler (tf.compat.v1.profiler, float_operation) on the graph of one "
                "forward and backward pass of ResNet50 + the dense head at batch 1, float32; the optimizer's update "
                "and the augmentation's resize are left out (well under 1%)")


def train_flops_per_image(image_size: int) -> float:
    """FLOPs of one image's forward and backward pass through ResNet50 (no top, average pooling)
    and a 1024-unit dense head over 5 classes, at `image_size` px: the convolutions, their two
    gradients (input and filter), batch normalisation and the dense layers, as the profiler's
    registered statistics count them (a multiply-add is 2 FLOPs)."""
    from tensorflow.python.profiler import model_analyzer, option_builder

    base = keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
                                       input_shape=(image_size, image_size, 3))
    model = keras.Sequential([base, keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(5, activation="softmax")])
    loss = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, model(images, training=True))
        return tape.gradient(value, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([1, image_size, image_size, 3], tf.float32),
                                       tf.TensorSpec([1], tf.int32)).graph
    options = option_builder.ProfileOptionBuilder(
        option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build()
    return float(model_analyzer.profile(graph, options=options).total_float_ops)


def lab_model(image_size: int) -> tf_keras.Model:
    """The lab's model in tf-keras: ResNet50 on float32 input in [0, 1], GAP, Dense(1016), softmax, float32."""
    import tf_keras  # legacy Keras by name, here only: a TensorFlow without a tf-keras yet (2.22.0rc0) still reads results
    tf_keras.mixed_precision.set_global_policy("float32")
    base = tf_keras.applications.ResNet50(weights=None, include_top=False, input_shape=(image_size, image_size, 3))
    x = tf_keras.layers.GlobalAveragePooling2D()(base.output)
    x = tf_keras.layers.Dense(1016, activation="relu")(x)
    outputs = tf_keras.layers.Dense(5, activation="softmax")(x)
    model = tf_keras.Model(base.input, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def tf_keras_trainer_model(policy: str, image_size: int) -> tf_keras.Model:
    """The trainer's model as the runtime built it before Keras 3: cassava's layers (the same
    `call` code) on tf-keras' Layer, tf-keras' ResNet50 at batch-norm momentum 0.9, the dense head,
    compiled with Adam, the sparse cross-entropy and accuracy, for tf-keras `fit`."""
    import tf_keras

    from cassava import model as model_lib

    class Preprocess(tf_keras.layers.Layer):
        call = model_lib.ResNetPreprocess.call

    class Augment(tf_keras.layers.Layer):
        call = model_lib.RandomCropFlip.call

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.crop_fraction, self.seed = model_lib.CROP_FRACTION, 0

    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        images = tf_keras.Input((image_size, image_size, 3), dtype=tf.uint8)
        base = tf_keras.applications.ResNet50(include_top=False, weights=None, input_shape=(image_size, image_size, 3),
                                              pooling="avg")
        for layer in base.layers:
            if isinstance(layer, tf_keras.layers.BatchNormalization):
                layer.momentum = model_lib.BATCH_NORM_MOMENTUM
        x = tf_keras.layers.Dense(model_lib.HEAD_UNITS, activation="relu")(base(Augment()(Preprocess()(images))))
        outputs = tf_keras.layers.Dense(5, activation="softmax", dtype="float32")(x)
        model = tf_keras.Model(images, outputs)
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def trainer_steps(policy: str, jit_compile: bool, image_size: int, steps_per_execution: int, spec):
    """The trainer's own ResNet50 + head under `policy` in Keras 3, compiled as a job compiles it
    (the cassava task's optimizer, loss and metrics through trainer.runtime.training) and stepped
    by the runtime's loop (trainer.loop.Steps, with the input-wait measurement a job gives it)
    under a one-device strategy, as a single-process job runs."""
    from cassava import model as model_lib
    from cassava.task import CassavaTask
    from trainer import loop
    from trainer.library import input_wait
    from trainer.runtime import plan, training

    class WithoutWeights(CassavaTask):
        def build_model(self, run):
            return model_lib.build(5, image_size, "none")

    task, strategy = WithoutWeights(), tf.distribute.OneDeviceStrategy("/gpu:0" if tf.config.list_physical_devices("GPU")
                                                                       else "/cpu:0")
    keras.mixed_precision.set_global_policy(policy)
    try:
        run = plan.make_run(_config(image_size, steps_per_execution, jit_compile), _single(), "one_device",
                            replicas_in_sync=1, num_input_pipelines=1, steps_per_epoch=1000, validation_steps=None,
                            shuffle_seed=0, mixed_precision=policy)
        model = training.build_model(task, run, strategy)
        with strategy.scope():
            waits = input_wait.InputWait(lanes=1)
        steps = loop.Steps(strategy, model, steps_per_execution=steps_per_execution, jit_compile=jit_compile,
                           input_wait=waits)
        steps.build(spec)
        return steps
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _single():
    from trainer.cluster import resolve

    return resolve({})


def _config(image_size: int, steps_per_execution: int, jit_compile: bool):
    from cassava.task import CassavaTask
    from trainer.runtime import config as config_lib

    argv = ["--weights", "none", "--learning-rate", "1e-4", "--image-size", str(image_size),
            "--steps-per-execution", str(steps_per_execution), *(["--jit-compile"] if jit_compile else [])]
    return config_lib.parse(argv, {}, _single(), CassavaTask())


def in_memory_batches(images, labels) -> tf.data.Dataset:
    """One batch, repeated, with tf.data's autotuning off.

    With autotuning on (tf.data's default), every iterator runs a thread that re-tunes the
    pipeline at intervals doubling from 10 ms (tensorflow/core/framework/model.cc, the model's
    optimisation loop; older releases in model_dataset_op.cc). Tearing the iterator down at the
    end of `fit` often waited for that thread's next wake-up, at 10 ms x (2^k - 1) after the
    iterator started: 2.55, 5.11 or 10.23 s. Every round of 4 steps (64 images) then ended on one
    of those marks, whatever its configuration did in between: the 25.0, 12.5 and 6.25 images/s
    every configuration landed on (64 / 2.56, 5.12, 10.24), and the "one core" of the lab's rounds,
    which was CPU seconds divided by a wall time padded with that idle wait. (Measured here: a
    4-step fit of a small dense model took 5.13 s where its steps ended at 3.14 s; 2.55 s where
    they ended at 1.56 s; with autotuning off, it ended with its last step.) A repeated constant
    has nothing to tune, so turning it off changes nothing but the wait. With this benchmark's own
    lab model (160 px, batch 16, 4 steps a round, on a busy machine): autotuning on, `fit`
    returned at 10.25, 10.25 and 20.48 s where its fourth step ended at 9.15, 9.76 and 10.98 s
    (6.24 and 3.13 images/s, the 6.25 and 3.12 of earlier results files); off, within 0.01 s of
    its fourth step, every round.
    All configurations run in this one process, on the same TensorFlow thread pools (inter- and
    intra-op, sized once at the first op); nothing here pins or serialises threads per
    configuration."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensors((images, labels)).repeat().with_options(options)


class Configuration:
    """A model built once, and a round of `steps` train steps on one in-memory batch: tf-keras
    `fit` for a tf-keras `model`, the runtime's loop for Keras 3 `steps` (trainer.loop.Steps)."""

    def __init__(self, name: str, images, labels, *, model: tf_keras.Model | None = None, steps=None,
                 steps_per_execution: int = 1, policy: str = "float32"):
        self.name, self.model, self.steps, self.policy = name, model, steps, policy
        self.dataset = in_memory_batches(images, labels)
        self.iterator = iter(self.dataset) if steps is not None else None
        self.batch = int(images.shape[0])
        self.steps_per_execution = steps_per_execution

    def run(self, steps: int) -> rounds_lib.Sample:
        steps = max(steps, self.steps_per_execution)
        with rounds_lib.Timer() as timer:
            if self.model is not None:
                self.model.fit(self.dataset, steps_per_epoch=steps, epochs=1, verbose=0)
            else:
                for _ in range(0, steps, self.steps_per_execution):
                    self.steps.train(self.iterator, self.steps_per_execution)
                self.steps.results()  # what the loop reads at an epoch's end; waits for the last step
                self.steps.reset()
            return timer.sample(steps * self.batch)


TF_KERAS_FIT = "tf-keras fit, trainer's model"


def configurations(default_policy: str, gpu: bool, batch: int, image_size: int) -> list[Configuration]:
    images, labels = selfcheck.generated_batch(batch, image_size)
    spec = in_memory_batches(images, labels).element_spec

    def trainer(name, policy, jit=False, spe=1):
        return Configuration(name, images, labels, steps=trainer_steps(policy, jit, image_size, spe, spec),
                             steps_per_execution=spe, policy=policy)

    configs = [Configuration("lab (tf-keras fit, float32, float32 input)", images.astype("float32") / 255.0, labels,
                             model=lab_model(image_size)),
               trainer(f"trainer default ({default_policy})", default_policy),
               Configuration(f"{TF_KERAS_FIT} ({default_policy})", images, labels,
                             model=tf_keras_trainer_model(default_policy, image_size), policy=default_policy)]
    if default_policy != "float32":
        configs.append(trainer("trainer, float32 (uint8 input)", "float32"))
    if gpu:
        configs.append(trainer("trainer default + XLA + 8 steps/execution", default_policy, True, 8))
    elif default_policy != "mixed_bfloat16":
        configs.append(trainer("trainer, mixed_bfloat16 (asked for)", "mixed_bfloat16"))
    return configs


def measure(configs: list[Configuration], steps: int, rounds: int) -> dict[str, list[rounds_lib.Sample]]:
    """A warm-up round, then `rounds` interleaved rounds, each starting one configuration later."""
    for config in configs:
        config.run(1)
    table: dict[str, list[rounds_lib.Sample]] = {config.name: [] for config in configs}
    for index in range(rounds):
        for offset in range(len(configs)):
            config = configs[(index + offset) % len(configs)]
            table[config.name].append(config.run(steps))
    return table


def report(raw: dict) -> str:
    """The results file's body, from the run's raw rounds alone (main's `raw`)."""
    # In the order the configurations ran (the raw file's keys may come back sorted).
    table = {name: [rounds_lib.Sample(**sample) for sample in raw["table"][name]] for name in raw["order"]}
    options, lab_name, default_name = raw["options"], raw["lab"], raw["default"]
    flops, peaks, dtypes = raw["flops_per_image"], raw["peaks"], raw["dtypes"]
    header = ("| configuration | images/s (wall) | CPU s/image | cores | others' cores | rounds flagged | over the lab "
              "| GFLOP/s | share of the peak |\n|---|---|---|---|---|---|---|---|---|")
    lines = [header]
    shares = {}
    for name, samples in table.items():
        rate, cpu, cores, others, flagged = rounds_lib.summary_row(samples)
        over = rounds_lib.compare(table, lab_name, name)
        achieved = rate * flops
        shares[name] = achieved / peaks[dtypes[name]]
        lines.append(f"| {name} | {rate:.2f} | {cpu:.4f} | {cores:.2f} | {others:.2f} | {flagged} of {len(samples)} "
                     f"| x{over.value:.2f} | {achieved / 1e9:.0f} | {shares[name]:.0%} of {dtypes[name]} |")
    matmul = raw["matmul"]
    peak_line = (f"Peak: `tf.matmul` of two {matmul['size']}x{matmul['size']} operands on every core, best of "
                 f"{matmul['repeats']}, measured in this run: "
                 + ", ".join(f"{gflop_rate(peaks[dtype])} GFLOP/s in {dtype}" for dtype in sorted(peaks))
                 + f". A train step costs {flops / 1e9:.2f} GFLOP per image at {options['image_size']} px, "
                 f"{raw['flops_source']}. GFLOP/s: the wall rate times that; its share of the peak in the "
                 f"configuration's own precision.")
    clean = rounds_lib.clean_rounds(table)
    per_round = ["| round | " + " | ".join(table) + " | flagged |", "|---|" + "---|" * (len(table) + 1)]
    flagged = {name: rounds_lib.flags(samples) for name, samples in table.items()}
    for index in range(options["rounds"]):
        cells = [f"{table[name][index].rate:.2f} img/s, {table[name][index].cores:.2f} cores, others "
                 f"{table[name][index].others:.2f}, steal {table[name][index].steal:.2f}"
                 + (" (flagged)" if flagged[name][index] else "") for name in table]
        per_round.append(f"| {index + 1} | " + " | ".join(cells) + f" | {'no' if clean[index] else 'yes'} |")
    policies = {default_name: raw["default_policy"], "trainer, float32 (uint8 input)": "float32",
                "trainer, mixed_bfloat16 (asked for)": "mixed_bfloat16"}
    over_lab = rounds_lib.compare(table, lab_name, default_name)
    over_tf_keras = rounds_lib.compare(table, raw["tf_keras"], default_name)
    others = [name for name in table if name in policies and name != default_name]
    over_best = min([rounds_lib.compare(table, other, default_name) for other in others], key=lambda c: c.value,
                    default=rounds_lib.Comparison(1.0, over_lab.measure, over_lab.clean_rounds, over_lab.rounds))
    over_best_value = min(over_best.value, 1.0) if others else 1.0
    measure_line = (f"Ratios from {over_lab.describe()}. The trainer's default against tf-keras `fit` of the same "
                    f"model in the same policy: x{over_tf_keras.value:.2f}, from {over_tf_keras.describe()}.")
    summary = (f"summary: default_over_tf_keras={over_tf_keras.value:.2f} default_over_lab={over_lab.value:.2f} "
               f"default_over_best={over_best_value:.2f} "
               f"default_share_of_peak={shares[default_name]:.2f} "
               f"(batch {options['batch']}, {options['image_size']} px, {options['rounds']} rounds of {options['steps']} "
               f"steps, from {over_lab.measure})")
    return (f"TensorFlow {raw['tensorflow']}; {raw['device']}. The `others' cores` column: what other processes on the "
            f"machine used while each configuration ran (0 on a quiet machine).\n\n" + "\n".join(lines)
            + f"\n\n{peak_line}\n\n" + "\n".join(per_round) + f"\n\n{measure_line}\n\n`{summary}`")


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/train_step.py", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--matmul-size", type=int, default=4096, help="side of the peak microbenchmark's operands")
    parser.add_argument("--matmul-repeats", type=int, default=5, help="timed matmuls per precision; the best counts")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/train_step/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    args = parser.parse_args(argv)
    legacy_keras.require(parser)
    if min(args.steps, args.rounds, args.batch, args.image_size, args.matmul_size, args.matmul_repeats) < 1:
        print("train_step.py: --steps, --rounds, --batch, --image-size, --matmul-size and --matmul-repeats must be "
              "positive", file=sys.stderr)
        return 2
    devices = precision.local_devices()
    measured = None
    if devices.bfloat16_native and not devices.float16_fast:
        from cassava import model as model_lib

        images, _ = selfcheck.generated_batch(min(args.batch, 16), args.image_size)
        measured = precision.measure_model(lambda: model_lib.build(5, args.image_size, "none"), tf.constant(images))
    default = precision.choose("auto", devices, measured)
    gpu = bool(devices.gpu_capabilities)
    print(f"machine: {cpu_model()}", flush=True)
    device_line = f"device: {devices.describe()}; --mixed-precision auto picks {default.policy} ({default.reason})"
    print(device_line, flush=True)
    configs = configurations(default.policy, gpu, args.batch, args.image_size)
    dtypes = {config.name: POLICY_DTYPES[config.policy] for config in configs}
    peaks = {dtype: matmul_peak(dtype, args.matmul_size, args.matmul_repeats) for dtype in sorted(set(dtypes.values()))}
    print("peak: " + ", ".join(f"{gflop_rate(peak)} GFLOP/s in {dtype}" for dtype, peak in peaks.items()), flush=True)
    flops = train_flops_per_image(args.image_size)
    print(f"train step: {flops / 1e9:.2f} GFLOP per image at {args.image_size} px", flush=True)
    table = measure(configs, args.steps, args.rounds)
    raw = {"tensorflow": tf.__version__, "device": device_line[len("device: "):], "default_policy": default.policy,
           "options": {"batch": args.batch, "image_size": args.image_size, "steps": args.steps, "rounds": args.rounds},
           "lab": configs[0].name, "default": configs[1].name, "tf_keras": configs[2].name, "dtypes": dtypes,
           "peaks": peaks,
           "matmul": {"size": args.matmul_size, "repeats": args.matmul_repeats}, "flops_per_image": flops,
           "flops_source": FLOPS_SOURCE,
           "order": list(table),
           "table": {name: [dataclasses.asdict(sample) for sample in samples] for name, samples in table.items()}}
    body = report(raw)
    print(body, flush=True)
    summary = body.splitlines()[-1].strip("`")  # the body ends with the summary line
    if args.results_dir:
        path = write_results("train_step", command_line("train_step.py", argv), datetime.date.today().isoformat(),
                             body, args.results_dir, raw=raw)
        print(f"results: {path}", flush=True)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
