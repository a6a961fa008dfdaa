"""ResNet50 training throughput: the lab's configuration against the trainer's defaults, side by side.

    python benchmarks/train_step.py [--steps 4] [--rounds 8] [--batch 16] [--image-size 160] [--results-dir DIR]

Every configuration trains the same ResNet50 + head on one generated batch already in memory, so
only the train step is measured. Each configuration's model is built and compiled once, and a
warm-up round (not recorded) pays its first calls; then --rounds short rounds of --steps steps
each, the configurations interleaved and their order rotated from round to round, so that a
change in the cores this process gets hits every configuration alike (benchmarks/rounds.py).
Each round records the wall rate, the CPU seconds per image (every thread of this process), the
cores that makes, and what other processes and the hypervisor took meanwhile. A round whose cores
depart from its configuration's median is flagged; the ratios come from the wall rates of the
rounds where nothing was flagged, or, when fewer than half are clean, from CPU per image.

  lab                          float32, float32 input scaled on the host (the codelab's model)
  trainer default              uint8 input normalised in the model, `--mixed-precision auto` on this
                               machine: mixed_float16 on GPUs with tensor cores; on CPUs with
                               bfloat16 instructions, what trainer.precision's measurement picks
                               (the same measurement a job makes at start); else float32
  trainer, float32             when the default is not float32: the same model in float32
  trainer, mixed_bfloat16      asked for explicitly, on a CPU: shows what bfloat16 does here
  trainer default + XLA + 8 steps/execution   on a GPU: the remaining speed flags

The last line, `summary: default_over_lab=R default_over_best=B (...)`, gives the default's speed
over the lab and over the faster of the trainer in float32 and in mixed_bfloat16 (on CPUs), and
the measure they came from. The table also goes to benchmarks/results/train_step/KIND.md, one
file per machine kind (benchmarks/machine.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer import precision, selfcheck  # noqa: E402  (trainer selects legacy Keras first)
import tensorflow as tf  # noqa: E402

# benchmarks/ is first on the path when this runs as a script
import rounds as rounds_lib  # noqa: E402
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402


def lab_model(image_size: int) -> tf.keras.Model:
    """The lab's model: ResNet50 on float32 input in [0, 1], GAP, Dense(1016), softmax, float32."""
    tf.keras.mixed_precision.set_global_policy("float32")
    base = tf.keras.applications.ResNet50(weights=None, include_top=False, input_shape=(image_size, image_size, 3))
    x = tf.keras.layers.GlobalAveragePooling2D()(base.output)
    x = tf.keras.layers.Dense(1016, activation="relu")(x)
    outputs = tf.keras.layers.Dense(5, activation="softmax")(x)
    model = tf.keras.Model(base.input, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def trainer_model(policy: str, jit_compile: bool, image_size: int, steps_per_execution: int) -> tf.keras.Model:
    """The trainer's own ResNet50 + head under `policy`, compiled as a job compiles it (the
    cassava task's optimizer, loss and metrics through trainer.plan, with the input-wait metric)."""
    from cassava import model as model_lib
    from cassava.task import CassavaTask
    from trainer import config as config_lib, plan
    from trainer.cluster import resolve

    task, single = CassavaTask(), resolve({})
    argv = ["--weights", "none", "--learning-rate", "1e-4", "--image-size", str(image_size),
            "--steps-per-execution", str(steps_per_execution), *(["--jit-compile"] if jit_compile else [])]
    config = config_lib.parse(argv, {}, single, task)
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        run = plan.make_run(config, single, "one_device", replicas_in_sync=1, num_input_pipelines=1,
                            steps_per_epoch=1000, validation_steps=None, shuffle_seed=config.seed)
        model = model_lib.build(5, image_size, "none")
        plan.compile_model(task, run, model, config, input_lanes=1)
        return model
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


class Configuration:
    """A model built once, and a round of `steps` train steps on one in-memory batch."""

    def __init__(self, name: str, model: tf.keras.Model, images, labels, steps_per_execution: int = 1):
        self.name, self.model = name, model
        self.dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
        self.batch = int(images.shape[0])
        self.steps_per_execution = steps_per_execution

    def run(self, steps: int) -> rounds_lib.Sample:
        steps = max(steps, self.steps_per_execution)
        with rounds_lib.Timer() as timer:
            self.model.fit(self.dataset, steps_per_epoch=steps, epochs=1, verbose=0)
            return timer.sample(steps * self.batch)


def configurations(default_policy: str, gpu: bool, batch: int, image_size: int) -> list[Configuration]:
    images, labels = selfcheck.generated_batch(batch, image_size)

    def trainer(name, policy, jit=False, spe=1):
        return Configuration(name, trainer_model(policy, jit, image_size, spe), images, labels, spe)

    configs = [Configuration("lab (float32, float32 input)", lab_model(image_size), images.astype("float32") / 255.0,
                             labels),
               trainer(f"trainer default ({default_policy})", default_policy)]
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
    table = {name: [rounds_lib.Sample(**sample) for sample in samples] for name, samples in raw["table"].items()}
    options, lab_name, default_name = raw["options"], raw["lab"], raw["default"]
    header = ("| configuration | images/s (wall) | CPU s/image | cores | others' cores | rounds flagged | over the lab |\n"
              "|---|---|---|---|---|---|---|")
    lines = [header]
    for name, samples in table.items():
        rate, cpu, cores, others, flagged = rounds_lib.summary_row(samples)
        over = rounds_lib.compare(table, lab_name, name)
        lines.append(f"| {name} | {rate:.2f} | {cpu:.4f} | {cores:.2f} | {others:.2f} | {flagged} of {len(samples)} "
                     f"| x{over.value:.2f} |")
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
    others = [name for name in table if name in policies and name != default_name]
    over_best = min([rounds_lib.compare(table, other, default_name) for other in others], key=lambda c: c.value,
                    default=rounds_lib.Comparison(1.0, over_lab.measure, over_lab.clean_rounds, over_lab.rounds))
    over_best_value = min(over_best.value, 1.0) if others else 1.0
    measure_line = f"Ratios from {over_lab.describe()}."
    summary = (f"summary: default_over_lab={over_lab.value:.2f} default_over_best={over_best_value:.2f} "
               f"(batch {options['batch']}, {options['image_size']} px, {options['rounds']} rounds of {options['steps']} "
               f"steps, from {over_lab.measure})")
    return (f"TensorFlow {raw['tensorflow']}; {raw['device']}. The `others' cores` column: what other processes on the "
            f"machine used while each configuration ran (0 on a quiet machine).\n\n" + "\n".join(lines)
            + "\n\n" + "\n".join(per_round) + f"\n\n{measure_line}\n\n`{summary}`")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/train_step/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        print("train_step.py: --steps and --rounds must be positive", file=sys.stderr)
        return 2
    devices = precision.local_devices()
    measured = precision.measure_cpu() if devices.bfloat16_native and not devices.float16_fast else None
    default = precision.choose("auto", devices, measured)
    gpu = bool(devices.gpu_capabilities)
    print(f"machine: {cpu_model()}", flush=True)
    device_line = f"device: {devices.describe()}; --mixed-precision auto picks {default.policy} ({default.reason})"
    print(device_line, flush=True)
    configs = configurations(default.policy, gpu, args.batch, args.image_size)
    table = measure(configs, args.steps, args.rounds)
    raw = {"tensorflow": tf.__version__, "device": device_line[len("device: "):], "default_policy": default.policy,
           "options": {"batch": args.batch, "image_size": args.image_size, "steps": args.steps, "rounds": args.rounds},
           "lab": configs[0].name, "default": configs[1].name,
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
