"""ResNet50 training throughput: the lab's configuration against the trainer's defaults, side by side.

    python benchmarks/train_step.py [--steps 8] [--batch 16] [--image-size 160] [--repeats 2] [--results-dir DIR]

Every configuration trains the same ResNet50 + head on one generated batch already in memory, so
only the train step is measured; the first (compiling) call is excluded, and the rounds alternate
so that drift on a shared machine hits every configuration alike. The median of the rounds is
printed, each as a ratio over the lab.

  lab                          float32, float32 input scaled on the host (the codelab's model)
  trainer default              uint8 input normalised in the model, `--mixed-precision auto` on this
                               machine: mixed_float16 on GPUs with tensor cores; on CPUs with
                               bfloat16 instructions, what trainer.precision's measurement picks
                               (the same measurement a job makes at start); else float32
  trainer, float32             when the default is not float32: the same model in float32
  trainer, mixed_bfloat16      asked for explicitly, on a CPU: shows what bfloat16 does here
  trainer default + XLA + 8 steps/execution   on a GPU: the remaining speed flags

The last line, `summary: default_over_lab=R default_over_best=B`, gives the default's ratio over
the lab and over the faster of the trainer in float32 and in mixed_bfloat16 (on CPUs). The table
also goes to benchmarks/results/train_step/KIND.md, one file per machine kind (benchmarks/machine.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer import precision, selfcheck  # noqa: E402  (trainer selects legacy Keras first)
import tensorflow as tf  # noqa: E402

# benchmarks/ is first on the path when this runs as a script
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402


def lab_throughput(batch: int, image_size: int, steps: int) -> float:
    """The lab's model: ResNet50 on float32 input in [0, 1], GAP, Dense(1016), softmax, float32."""
    tf.keras.mixed_precision.set_global_policy("float32")
    base = tf.keras.applications.ResNet50(weights=None, include_top=False, input_shape=(image_size, image_size, 3))
    x = tf.keras.layers.GlobalAveragePooling2D()(base.output)
    x = tf.keras.layers.Dense(1016, activation="relu")(x)
    outputs = tf.keras.layers.Dense(5, activation="softmax")(x)
    model = tf.keras.Model(base.input, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    images, labels = selfcheck.generated_batch(batch, image_size)
    return selfcheck.images_per_second(model, images.astype("float32") / 255.0, labels, steps)


def configurations(default_policy: str, gpu: bool) -> list[tuple[str, object]]:
    def trainer(policy, jit=False, spe=1):
        return lambda a: selfcheck.trainer_throughput(policy, jit, a.batch, a.image_size, a.steps, spe)

    configs = [("lab (float32, float32 input)", lambda a: lab_throughput(a.batch, a.image_size, a.steps)),
               (f"trainer default ({default_policy})", trainer(default_policy))]
    if default_policy != "float32":
        configs.append(("trainer, float32 (uint8 input)", trainer("float32")))
    if gpu:
        configs.append((f"trainer default + XLA + 8 steps/execution", trainer(default_policy, True, 8)))
    elif default_policy != "mixed_bfloat16":
        configs.append(("trainer, mixed_bfloat16 (asked for)", trainer("mixed_bfloat16")))
    return configs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per configuration per round")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=2, help="rounds; the median is reported")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/train_step/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    args = parser.parse_args(argv)
    devices = precision.local_devices()
    measured = precision.measure_cpu() if devices.bfloat16_native and not devices.float16_fast else None
    default = precision.choose("auto", devices, measured)
    gpu = bool(devices.gpu_capabilities)
    print(f"machine: {cpu_model()}", flush=True)
    device_line = f"device: {devices.describe()}; --mixed-precision auto picks {default.policy} ({default.reason})"
    print(device_line, flush=True)
    configs = configurations(default.policy, gpu)
    rates: dict[str, list[float]] = {name: [] for name, _ in configs}
    for _ in range(args.repeats):
        for name, measure in configs:
            rates[name].append(measure(args))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    lab = next(iter(medians.values()))
    for name, rate in medians.items():
        print(f"{name:45s} {rate:8.2f} img/s  x{rate / lab:.2f}")
    default_name = configs[1][0]
    policies = {name: policy for name, policy in (
        (configs[1][0], default.policy), ("trainer, float32 (uint8 input)", "float32"),
        ("trainer, mixed_bfloat16 (asked for)", "mixed_bfloat16"))}
    best = max(rate for name, rate in medians.items() if name in policies)
    summary = (f"summary: default_over_lab={medians[default_name] / lab:.2f} "
               f"default_over_best={medians[default_name] / best:.2f} "
               f"(batch {args.batch}, {args.image_size} px, median of {args.repeats} rounds of {args.steps} steps)")
    if args.results_dir:
        table = ["| configuration | images/s | over the lab |", "|---|---|---|"] + [
            f"| {name} | {rate:.2f} | x{rate / lab:.2f} |" for name, rate in medians.items()]
        body = f"TensorFlow {tf.__version__}; {device_line[len('device: '):]}.\n\n" + "\n".join(table) + f"\n\n`{summary}`"
        path = write_results("train_step", command_line("train_step.py", argv), datetime.date.today().isoformat(),
                             body, args.results_dir)
        print(f"results: {path}", flush=True)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
