"""Time to accuracy, the MLPerf way: wall time until a stated validation accuracy, for the lab's
recipe and for the trainer's defaults, in one run, on the same data and the same workers.

    python benchmarks/time_to_accuracy.py [--weights FILE] [--rounds 3] [--target 0.8] [--scratch-rounds 1]
                                          [--scratch-target 0.6] [--workers 2] [--images 384] [--image-size 64]
                                          [--batch 16] [--results-dir DIR]

The setting that counts is the lab's own: FINE-TUNING pretrained ResNet50 weights. Both recipes
start from one weights file. ImageNet's cannot be downloaded everywhere, so unless --weights
names a file (real ImageNet no-top weights, where a user has them), the benchmark makes its own
once (benchmarks/pretrain.py): ResNet50 pretrained on generated textures and shapes, a task that
is not the evaluation task, with the preprocessing Keras' ImageNet weights expect, cached outside
the repository; the report says what that cost.

Each recipe trains as one MultiWorkerMirrored job of --workers processes on the same generated
cassava-like TFRecords (`synthetic:N`, 5 classes, chance 0.20):

  lab      the codelab's recipe (seed 001), written as the codelab writes it: images decoded,
           resized and scaled to [0, 1] as float32 on the host, shuffle(1000), batched by the
           global batch, AutoShardPolicy.DATA; ResNet50 without top (the weights file),
           GlobalAveragePooling2D, Dense(1016, relu), Dense(5, softmax); Adam(1e-4); float32.
           Validation after every epoch on the validation split through the same pipeline.
  trainer  `python -m trainer.launch --workers N -- ... --weights FILE` with every trainer
           default except the sizes below: learning rate auto, batch-norm momentum,
           --mixed-precision auto, its input pipeline, cache and augmentation.

Only the sizes are shared and set here (--images, --image-size, --batch per replica), smaller
than both recipes' own (300 px, 64 per replica), so that the whole benchmark fits about half an
hour on 2 cores with its defaults (29 min on the EPYC family 25 model 17, most of it the lab's
runs reaching --max-seconds). Each clock starts when the job's processes are started (start-up, tracing
and the first epoch's decoding count, as they do for a user) and stops at the end of the first
epoch whose val_accuracy reaches the target; the job is then stopped. A recipe that has not
reached it within --max-epochs or --max-seconds is stopped there, and its round's ratio becomes
a bound.

Rounds (benchmarks/rounds.py): the fine-tune comparison runs --rounds times, the two recipes one
after the other, their order swapped each round, so that a change in the cores the machine gives
hits both alike. Each run records the CPU seconds of all its processes up to the target (per
image trained, beside its wall rate) and what other processes took meanwhile. A run whose cores
(CPU seconds per wall second) depart from its recipe's median is flagged. The ratio is the median
over the rounds where neither run was flagged of the trainer's time over the lab's; when fewer
than half the rounds are clean, it is the ratio of the median CPU seconds to the target.

The second table trains both recipes from random weights (--scratch-rounds, 0 to leave it out):
the lab's recipe is not made for that (Adam 1e-4 and Keras' batch-norm momentum are fine-tuning
settings), and it says so. Its trainer run also checks the pretrained weights: fine-tuning from
them must reach the target sooner than the trainer's best from random weights.

The last line, `summary: trainer_over_lab=R` (or `<=R`), is the trainer's time over the lab's
when both fine-tune. The results go to benchmarks/results/time_to_accuracy/<machine kind>.md
(machine.write_results), and the raw rounds report() writes them from to the .json beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
sys.path[:0] = [REPO, BENCHMARKS]
import pretrain  # noqa: E402
import rounds as rounds_lib  # noqa: E402
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402

NUM_CLASSES = 5


@dataclasses.dataclass
class Run:
    """One recipe's job: each epoch's (seconds since start, val_accuracy) and when it reached the target."""

    name: str
    images_per_epoch: int = 0
    epochs: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    reached: float | None = None
    elapsed: float = 0.0  # seconds from start until the job was stopped or ended
    stopped: str = ""
    sample: rounds_lib.Sample | None = None  # wall, CPU and the machine's load, up to the target (or the stop)

    def describe(self) -> str:
        return " ".join(f"{accuracy:.2f}" for _, accuracy in self.epochs) or "none"

    @property
    def cpu_to_target(self) -> float | None:
        return self.sample.cpu if self.reached is not None and self.sample else None


# ---------------------------------------------------------------------------------------------
# The lab's recipe, run as one task of a MultiWorkerMirrored job (`--lab-task`).

def lab_task(args) -> int:
    """The codelab's task.py on generated TFRecords, plus validation each epoch; prints one JSON
    line per epoch on the chief."""
    import trainer  # noqa: F401  (selects tf-keras before TensorFlow is imported, as the trainer does)
    import tensorflow as tf

    from cassava import data

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(args.seed)
    global_batch = args.batch * strategy.num_replicas_in_sync

    def preprocess(serialized):
        example = tf.io.parse_single_example(serialized, data.RECORD_FEATURES)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.image.resize(image, (args.image_size, args.image_size))
        return tf.cast(image, tf.float32) / 255.0, example["label"]

    def dataset(pattern, training):
        files = sorted(tf.io.gfile.glob(os.path.join(args.data, pattern)))
        ds = tf.data.TFRecordDataset(files).map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        if training:
            ds = ds.shuffle(1000)
        ds = ds.batch(global_batch).prefetch(tf.data.AUTOTUNE)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return ds.with_options(options)

    with strategy.scope():
        base = tf.keras.applications.ResNet50(weights=None if args.weights == "none" else args.weights,
                                              include_top=False, input_shape=(args.image_size, args.image_size, 3))
        x = tf.keras.layers.GlobalAveragePooling2D()(base.output)
        x = tf.keras.layers.Dense(1016, activation="relu")(x)
        outputs = tf.keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)
        model = tf.keras.Model(base.input, outputs)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(0.0001),
                      metrics=["accuracy"])

    chief = strategy.cluster_resolver.task_type in (None, "chief")

    class Report(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if chief:
                print(json.dumps({"epoch": epoch + 1, "val_accuracy": float(logs["val_accuracy"])}), flush=True)

    model.fit(dataset("train-*", True), validation_data=dataset("validation-*", False), epochs=args.max_epochs,
              callbacks=[Report()], verbose=0)
    return 0


# ---------------------------------------------------------------------------------------------
# Running both jobs and watching their epochs.

def watch(run: Run, processes: list[subprocess.Popen], stream, parse, target: float, max_seconds: float,
          started: float, signum: int, clock: rounds_lib.Timer) -> None:
    """Reads `stream` (the chief's output) until the target is reached, the job ends or time is up;
    `parse(line)` gives an epoch's val_accuracy or None. Stops every process at the end. `clock`
    (started with the job) samples the job's CPU and the machine's load at each epoch's end."""
    timer = threading.Timer(max_seconds, lambda: stop(processes, signum))
    timer.start()
    try:
        for line in stream:
            accuracy = parse(line)
            if accuracy is None:
                continue
            if time.monotonic() - started > max_seconds:
                break  # an epoch that ended after the limit, while the job was being stopped
            run.epochs.append((time.monotonic() - started, accuracy))
            run.sample = clock.sample(len(run.epochs) * run.images_per_epoch)
            print(f"{run.name}: epoch {len(run.epochs)} val_accuracy={accuracy:.4f} at {run.epochs[-1][0]:.1f} s "
                  f"({run.sample.cpu:.0f} CPU s, {run.sample.cores:.2f} cores, others {run.sample.others:.2f})", flush=True)
            if accuracy >= target:
                run.reached = run.epochs[-1][0]
                break
    finally:
        timer.cancel()
        run.elapsed = min(time.monotonic() - started, max_seconds)
        if run.reached is None:
            run.sample = clock.sample(max(len(run.epochs), 1) * run.images_per_epoch)
        stop(processes, signum)
    if run.reached is None:
        how = "stopped" if run.elapsed >= max_seconds else "ended"
        run.stopped = f"{how} after {len(run.epochs)} epochs, {run.elapsed:.0f} s"


def stop(processes: list[subprocess.Popen], signum: int) -> None:
    """`signum` to each process group: SIGKILL for the lab's tasks; SIGTERM for trainer.launch,
    which then stops its tasks at once (they run in sessions of their own, out of reach of a
    signal to the launcher's group)."""
    from trainer import stopping

    stopping.stop(processes, 60, signum=signum, group=True)


def images_per_epoch(args) -> int:
    """Images one epoch trains on, over every worker (both recipes take whole global batches)."""
    global_batch = args.batch * args.workers
    return max(1, args.images // global_batch) * global_batch


def run_lab(args, data_dir: str, weights: str, target: float) -> Run:
    from trainer import launch

    cluster, tasks = launch.plan_cluster(args.workers, 0, False, launch.free_ports(args.workers))
    started = time.monotonic()
    processes = []
    clock = rounds_lib.Timer(lambda: sum(rounds_lib.tree_cpu_seconds(p.pid) for p in processes), baseline=0.0).start()
    for task in tasks:
        env = dict(os.environ, PYTHONPATH=REPO)
        if args.workers > 1:
            env["TF_CONFIG"] = launch.tf_config(cluster, task)
        chief = task.task_type == "chief"
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--lab-task", "--data", data_dir, "--batch", str(args.batch),
             "--image-size", str(args.image_size), "--max-epochs", str(args.max_epochs), "--weights", weights,
             "--seed", str(args.seed)],
            stdout=subprocess.PIPE if chief else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True, env=env))

    def parse(line):
        return json.loads(line)["val_accuracy"] if line.startswith("{") else None

    run = Run("lab", images_per_epoch(args))
    watch(run, processes, processes[0].stdout, parse, target, args.max_seconds, started, signal.SIGKILL, clock)
    return run


def run_trainer(args, data_root: str, work: str, weights: str, target: float) -> Run:
    shutil.rmtree(work, ignore_errors=True)  # a fresh job: no backup to resume from
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer.launch", "--workers", str(args.workers), "--work-dir", os.path.join(work, "launch"),
         "--", "python", "-m", "cassava.task", "--dataset", f"synthetic:{args.images}", "--data-dir", data_root, "--image-size", str(args.image_size),
         "--per-replica-batch-size", str(args.batch), "--epochs", str(args.max_epochs), "--weights", weights,
         "--model-dir", os.path.join(work, "model")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=REPO))
    clock = rounds_lib.Timer(lambda: rounds_lib.tree_cpu_seconds(launcher.pid), baseline=0.0).start()
    policy = []

    def parse(line):
        found = re.search(r"^\[chief-0\] .*trainer: precision: (\S+)", line)
        if found:
            policy.append(found.group(1))
        found = re.search(r"^\[chief-0\] .*trainer: epoch \d+/\d+ ends: .*\bval_accuracy=(\d\.\d+)", line)
        return float(found.group(1)) if found else None

    run = Run("trainer", images_per_epoch(args))
    watch(run, [launcher], launcher.stdout, parse, target, args.max_seconds, started, signal.SIGTERM, clock)
    run.name = f"trainer ({policy[0]})" if policy else "trainer"
    return run


@dataclasses.dataclass
class Verdict:
    """The trainer's time over the lab's: `value`, a bound when `bound`, from `measure`."""

    value: float | None
    bound: bool
    measure: str
    text: str

    @property
    def summary(self) -> str:
        if self.value is None:
            return "none"
        return f"{'<=' if self.bound else '='}{self.value:.2f}"


def run_flags(runs: list[Run]) -> list[bool]:
    """Which of one recipe's runs had other cores than its median (benchmarks/rounds.py)."""
    samples = [run.sample for run in runs]
    return rounds_lib.flags(samples) if all(samples) else [False] * len(runs)


def verdict(labs: list[Run], trainers: list[Run], target: float) -> Verdict:
    """From the rounds: the median over clean rounds of the trainer's time over the lab's (a bound
    when the lab did not reach the target), else the ratio of CPU seconds to the target."""
    if not any(run.reached is not None for run in trainers):
        return Verdict(None, False, "none", "the trainer did not reach the target: no ratio")
    flagged = [a or b for a, b in zip(run_flags(labs), run_flags(trainers))]
    usable = [i for i, (lab, mine) in enumerate(zip(labs, trainers)) if mine.reached is not None]
    clean = [i for i in usable if not flagged[i]]
    if clean and 2 * len(clean) >= len(labs):
        ratios = [(trainers[i].reached / (labs[i].reached or labs[i].elapsed), labs[i].reached is None) for i in clean]
        value = statistics.median(r for r, _ in ratios)
        bound = any(b for _, b in ratios)
        how = f"wall time, median of the {len(clean)} of {len(labs)} rounds where neither run was flagged"
        return Verdict(value, bound, "wall", how)
    lab_cpu = [run.sample.cpu for run in labs if run.sample]
    mine_cpu = [run.cpu_to_target for run in trainers if run.cpu_to_target is not None]
    value = statistics.median(mine_cpu) / statistics.median(lab_cpu)
    bound = any(run.reached is None for run in labs)
    how = (f"CPU seconds to the target: only {len(clean)} of {len(labs)} rounds kept their cores, so their wall times "
           f"mix regimes")
    return Verdict(value, bound, "cpu", how)


def table(runs: list[tuple[int, Run]], flagged: dict[int, bool]) -> list[str]:
    lines = ["| round | recipe | time to target | epochs | val_accuracy after each epoch | CPU s to target | "
             "images/s (wall) | CPU s/image | cores | others' cores | flagged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for index, (round_number, run) in enumerate(runs):
        reached = f"{run.reached:.1f} s" if run.reached is not None else f"not reached ({run.stopped})"
        epochs = str(len(run.epochs)) if run.reached is not None else "-"
        sample = run.sample
        figures = (f"{sample.cpu:.0f} | {sample.rate:.1f} | {sample.cpu_per_image:.3f} | {sample.cores:.2f} | "
                   f"{sample.others:.2f}" if sample else "- | - | - | - | -")
        if run.reached is None and sample:
            figures = "- |" + figures.split("|", 1)[1]
        lines.append(f"| {round_number} | {run.name} | {reached} | {epochs} | {run.describe()} | {figures} | "
                     f"{'yes' if flagged.get(index) else 'no'} |")
    return lines


def rounds_table(labs: list[Run], trainers: list[Run]) -> list[str]:
    flags_lab, flags_mine = run_flags(labs), run_flags(trainers)
    rows, flagged = [], {}
    for number, (lab, mine) in enumerate(zip(labs, trainers), start=1):
        flagged[len(rows)] = flags_lab[number - 1]
        rows.append((number, lab))
        flagged[len(rows)] = flags_mine[number - 1]
        rows.append((number, mine))
    return table(rows, flagged)


def pretraining_check(tuned: list[Run], from_scratch: list[Run]) -> str:
    """Whether fine-tuning from the pretrained weights beats the trainer from random weights,
    epoch by epoch: val_accuracy after the same number of epochs, the median over the rounds.
    Epochs, not seconds: the runs may have had different cores, and an epoch is the same work."""
    def medians(runs):
        longest = max((len(run.epochs) for run in runs), default=0)
        return [statistics.median(run.epochs[k][1] for run in runs if len(run.epochs) > k) for k in range(longest)]

    ours, theirs = medians(tuned), medians(from_scratch)
    compared = min(len(ours), len(theirs))
    if not compared:
        return "The pretrained weights were not checked: a run has no epoch."
    better = all(a > b for a, b in zip(ours[:compared], theirs[:compared]))
    return (f"The pretrained weights {'help' if better else 'DO NOT help'}: after each of the first {compared} epochs the "
            f"trainer's val_accuracy was {' '.join(f'{a:.2f}' for a in ours[:compared])} fine-tuning, against "
            f"{' '.join(f'{b:.2f}' for b in theirs[:compared])} from random weights (medians over the rounds).")


# What report() reads of the command's options.
REPORTED_OPTIONS = ("images", "image_size", "batch", "workers", "target", "scratch_target")


def run_record(run: Run) -> dict:
    """A run as JSON values, for the raw data beside the results file."""
    return dataclasses.asdict(run)


def run_of(record: dict) -> Run:
    sample = rounds_lib.Sample(**record["sample"]) if record.get("sample") else None
    return Run(**{**record, "epochs": [tuple(epoch) for epoch in record["epochs"]], "sample": sample})


def raw_data(args, weights_line: str, fine: tuple[list[Run], list[Run]], scratch: tuple[list[Run], list[Run]]) -> dict:
    """Everything report() reads, as JSON values: the run's raw rounds."""
    return {"options": {name: getattr(args, name) for name in REPORTED_OPTIONS}, "weights_line": weights_line,
            **{setting: {"labs": [run_record(r) for r in runs[0]], "trainers": [run_record(r) for r in runs[1]]}
               for setting, runs in (("fine", fine), ("scratch", scratch))}}


def report(raw: dict) -> str:
    """The results file's body, from the raw data (raw_data) alone."""
    args = argparse.Namespace(**raw["options"])
    weights_line = raw["weights_line"]
    fine, scratch = ((list(map(run_of, raw[s]["labs"])), list(map(run_of, raw[s]["trainers"]))) for s in ("fine", "scratch"))
    labs, trainers = fine
    lines = [
        f"task: synthetic:{args.images} ({max(8, args.images // 4)} validation images), {args.image_size} px, "
        f"{args.batch} per replica, {args.workers} worker(s); 5 classes, chance 0.20. `others' cores`: what other "
        f"processes on the machine used while each run ran (0 on a quiet machine).",
        "",
        f"## Fine-tuning, the lab's own setting: both from the same pretrained weights, to val_accuracy {args.target:.2f}",
        "",
        f"Weights: {weights_line}.",
        "",
        *rounds_table(labs, trainers),
        "",
    ]
    fine_verdict = verdict(labs, trainers, args.target)
    if fine_verdict.value is None:
        lines.append(fine_verdict.text + ".")
    else:
        goal = "meets" if fine_verdict.value <= 0.5 else ("does not show" if fine_verdict.bound else "MISSES")
        lines.append(f"When both fine-tune, the trainer took x{fine_verdict.value:.2f}"
                     f"{' at most' if fine_verdict.bound else ''} the lab's time to {args.target:.2f} "
                     f"({goal} the x0.5 goal); from {fine_verdict.text}.")
    scratch_labs, scratch_trainers = scratch
    if scratch_labs:
        lines += ["", f"## From random weights, to val_accuracy {args.scratch_target:.2f}: a setting the lab's recipe is not made for",
                  "",
                  "The lab's recipe is a fine-tuning recipe (Adam 1e-4, Keras' batch-norm momentum 0.99, inputs in [0, 1] "
                  "where the weights expect the ImageNet preprocessing); it is run from random weights here only to show "
                  "what the trainer's from-scratch defaults (learning rate 1e-3 with a one-epoch warm-up, batch-norm "
                  "momentum 0.9) do there. This table is not the comparison that counts.", "",
                  *rounds_table(scratch_labs, scratch_trainers), ""]
        scratch_verdict = verdict(scratch_labs, scratch_trainers, args.scratch_target)
        lines.append(f"From random weights: trainer_over_lab{scratch_verdict.summary}"
                     + (f" ({scratch_verdict.text})." if scratch_verdict.value is not None else "."))
        lines.append(pretraining_check(trainers, scratch_trainers))
    lines += ["", f"summary: trainer_over_lab{fine_verdict.summary}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes of each MultiWorkerMirrored job")
    parser.add_argument("--images", type=int, default=384, help="generated training images (a quarter as many validate)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="per replica, for both recipes")
    parser.add_argument("--weights", default=None,
                        help="a ResNet50 no-top weights file both recipes fine-tune from (ImageNet's, where you have "
                             "them); by default weights pretrained here once (benchmarks/pretrain.py)")
    parser.add_argument("--target", type=float, default=0.7, help="val_accuracy to reach when fine-tuning")
    parser.add_argument("--rounds", type=int, default=2, help="fine-tuning rounds (each runs both recipes)")
    parser.add_argument("--scratch-rounds", type=int, default=1, help="rounds from random weights (0: none)")
    parser.add_argument("--scratch-target", type=float, default=0.6, help="val_accuracy to reach from random weights")
    parser.add_argument("--max-epochs", type=int, default=100,
                        help="each run stops after this many epochs if it has not reached its target")
    parser.add_argument("--max-seconds", type=float, default=600.0,
                        help="each fine-tuning run stops here if it has not reached its target")
    parser.add_argument("--scratch-max-seconds", type=float, default=330.0,
                        help="each run from random weights stops here if it has not reached its target")
    parser.add_argument("--pretrain-steps", type=int, default=600, help="steps of the pretraining, when it is done here")
    parser.add_argument("--weights-cache", default=pretrain.CACHE_DIR, help="where weights pretrained here are kept")
    parser.add_argument("--seed", type=int, default=42, help="the lab's seed (the trainer's --seed default is 42)")
    parser.add_argument("--data-dir", default=None, help="where the generated data is kept; default a temp dir")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/time_to_accuracy/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    parser.add_argument("--lab-task", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lab_task:
        return lab_task(args)
    if (args.workers < 1 or args.images < 1 or args.rounds < 1 or args.scratch_rounds < 0
            or not 0 <= args.target <= 1 or not 0 <= args.scratch_target <= 1):
        print("time_to_accuracy: --workers, --images and --rounds must be positive, --scratch-rounds at least 0, "
              "and the targets within [0, 1]", file=sys.stderr)
        return 2
    if args.weights and not os.path.exists(args.weights):
        print(f"time_to_accuracy: --weights {args.weights}: no such file", file=sys.stderr)
        return 2

    import trainer  # noqa: F401
    from cassava import synthetic

    print(f"machine: {cpu_model()}", flush=True)
    if args.weights:
        weights, weights_line = os.path.abspath(args.weights), f"{args.weights}, given with --weights"
    else:
        weights, cost = pretrain.ensure(args.weights_cache, image_size=args.image_size, steps=args.pretrain_steps)
        weights_line = f"{pretrain.describe(cost)}; cached in {weights}"
    print(f"weights: {weights_line}", flush=True)
    with tempfile.TemporaryDirectory(prefix="time-to-accuracy-") as work:
        data_root = args.data_dir or os.path.join(work, "data")
        print(f"generating synthetic:{args.images} ...", flush=True)
        data_dir = synthetic.ensure(data_root, args.images)

        def rounds(count, weights_file, target, max_seconds):
            labs, trainers = [], []
            for number in range(count):
                print(f"round {number + 1} of {count} ({'fine-tuning' if weights_file != 'none' else 'from random weights'})",
                      flush=True)
                order = ("lab", "trainer") if number % 2 == 0 else ("trainer", "lab")
                for recipe in order:
                    limited = argparse.Namespace(**{**vars(args), "max_seconds": max_seconds})
                    if recipe == "lab":
                        labs.append(run_lab(limited, data_dir, weights_file, target))
                    else:
                        trainers.append(run_trainer(limited, data_root, os.path.join(work, "trainer"), weights_file, target))
            return labs, trainers

        fine = rounds(args.rounds, weights, args.target, args.max_seconds)
        scratch = rounds(args.scratch_rounds, "none", args.scratch_target, args.scratch_max_seconds)
    raw = raw_data(args, weights_line, fine, scratch)
    text = report(raw)
    print(text)
    if args.results_dir:
        path = write_results("time_to_accuracy", command_line("time_to_accuracy.py", argv),
                             datetime.date.today().isoformat(), text, args.results_dir, raw=raw)
        print(f"results: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
