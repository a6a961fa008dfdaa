"""Time to accuracy, the MLPerf way: wall time until a stated validation accuracy, for the lab's
recipe (as written, and with the preprocessing its weights expect) and for the trainer's defaults
(and at Keras' batch-norm momentum), in one run, on the same data and the same workers.

    python benchmarks/time_to_accuracy.py [--weights FILE] [--rounds 3] [--recipes lab,lab-preprocessed,trainer,...]
                                          [--target 0.7] [--max-seconds 600] [--scratch-rounds 1]
                                          [--scratch-target 0.6] [--phase-epochs 3] [--workers 2] [--images 384]
                                          [--image-size 64] [--batch 16] [--results-dir DIR]

The setting that counts is the lab's own: FINE-TUNING pretrained ResNet50 weights. Every recipe
starts from one weights file. ImageNet's cannot be downloaded everywhere, so unless --weights
names a file (real ImageNet no-top weights, where a user has them), the benchmark makes its own
once (benchmarks/pretrain.py): ResNet50 pretrained on generated textures and shapes, a task that
is not the evaluation task, with the preprocessing Keras' ImageNet weights expect, cached outside
the repository; the report says what that cost.

Each recipe trains as one MultiWorkerMirrored job of --workers processes on the same generated
cassava-like TFRecords (`synthetic:N`, 5 classes, chance 0.20). --recipes picks among:

  lab                    the codelab's recipe (seed 001) on tf-keras `fit` (TF_USE_LEGACY_KERAS=1, the
                         Keras it trains across workers with), written as the codelab writes it: images
                         decoded, resized and scaled to [0, 1] as float32 on the host, shuffle(1000),
                         batched by the global batch, AutoShardPolicy.DATA; ResNet50 without top (the
                         weights file), GlobalAveragePooling2D, Dense(1016, relu), Dense(5, softmax);
                         Adam(1e-4); float32. Validation after every epoch through the same pipeline.
  lab-preprocessed       the same, with tf.keras.applications.resnet50.preprocess_input in place of
                         the division by 255 (the one line a user would change), nothing else.
  trainer                `python -m trainer.launch --replicas N -- python -m cassava.task ...
                         --weights FILE` with every default except the sizes below: Keras 3,
                         trained by the runtime's own loop (trainer.loop).
  trainer-momentum-0.99  the same with --batch-norm-momentum 0.99 (Keras' own, the lab's), so that
                         the reader sees what the trainer's default 0.9 buys.

Only the sizes are shared and set here (--images, --image-size, --batch per replica), smaller
than the recipes' own (300 px, 64 per replica). Each clock starts when the job's processes are
started (start-up, tracing and the first epoch's decoding count, as they do for a user) and
stops at the end of the first epoch whose val_accuracy reaches the target; the job is then
stopped. A recipe that has not reached it within --max-epochs or --max-seconds is stopped there.

Rounds (benchmarks/rounds.py): the fine-tune comparison runs --rounds times, every recipe once a
round, each round starting one recipe later, so that a change in the cores the machine gives
does not always hit the same recipe. Each run records the CPU seconds of all its processes up to
the target (per image trained, beside its wall rate), its cores, and what other processes took
meanwhile. A run whose cores depart from its recipe's median by more than CORES_TOLERANCE is
flagged. The trainer is compared with the lab variant that reached the target in at least half
its rounds in the least median time: the ratio is the median over the rounds where both reached
it, neither was flagged and their cores were within CORES_TOLERANCE of each other, of the
trainer's time over the lab's, with its spread (lowest and highest); when fewer than half the
rounds qualify, it is the median ratio of CPU seconds to the target, and the line says which.
When no lab variant reaches the target, the summary says so and gives a bound.

The second table trains the lab and the trainer from random weights (--scratch-rounds, 0 to leave
it out): the lab's recipe is not made for that, and it says so. Its trainer run also checks the
pretrained weights: fine-tuning from them must reach the target sooner than from random weights.

Where the CPU goes (--phase-epochs, 0 to leave it out): one more job of the trainer and one of the
lab's recipe (with preprocess_input) run to their end; their processes' CPU is sampled every
0.1 s and split at the moments their chiefs' log lines (the lab's: JSON marks) arrive: start-up,
TensorFlow's import with the strategy and the precision probe (the trainer's), data and model
set-up, epoch 1 with its tracing, the later epochs' train steps (over the span the trainer's
steps measure themselves; the lab's from each epoch's start to its validation's), their
validation and epoch-end work, the gaps between epochs, the export (the trainer's) and the exit,
each per image trained; a line compares the two per image.

The last line, `summary: trainer_over_lab=R against=RECIPE from=wall|cpu spread=LO-HI rounds=K/N`
(or `<=R against=none`), is the fine-tuning comparison. The results go to
benchmarks/results/time_to_accuracy/<machine kind>.md (machine.write_results), and the raw runs
report() writes them from to the .json beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import resource
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
import legacy_keras  # noqa: E402
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
    line per epoch on the chief, and JSON marks of where the job is (after the imports, at the
    start of each epoch and of its validation) that the benchmark's phase trace reads; they change
    nothing in the recipe."""
    import tensorflow as tf  # tf.keras is tf-keras here: start_lab sets TF_USE_LEGACY_KERAS for the lab's job

    from cassava import data

    def mark(what, epoch=None):
        print(json.dumps({"mark": what, "epoch": epoch}), flush=True)  # only the chief's output is read

    mark("imported")

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(args.seed)
    global_batch = args.batch * strategy.num_replicas_in_sync

    def preprocess(serialized):
        example = tf.io.parse_single_example(serialized, data.RECORD_FEATURES)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.image.resize(image, (args.image_size, args.image_size))
        if args.lab_preprocess == "resnet50":
            # The one line a user would change: the preprocessing ResNet50's weights expect
            # (caffe mode: BGR, ImageNet mean subtracted) in place of the codelab's [0, 1].
            return tf.keras.applications.resnet50.preprocess_input(tf.cast(image, tf.float32)), example["label"]
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
        def on_epoch_begin(self, epoch, logs=None):
            mark("epoch", epoch + 1)

        def on_test_begin(self, logs=None):
            mark("validation", self.epoch)

        def on_epoch_end(self, epoch, logs=None):
            self.epoch = epoch + 2  # the epoch the next validation belongs to
            if chief:
                print(json.dumps({"epoch": epoch + 1, "val_accuracy": float(logs["val_accuracy"])}), flush=True)

        epoch = 1

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
    from trainer.process import stopping

    stopping.stop(processes, 60, signum=signum, group=True)


def images_per_epoch(args) -> int:
    """Images one epoch trains on, over every worker (both recipes take whole global batches)."""
    global_batch = args.batch * args.workers
    return max(1, args.images // global_batch) * global_batch


def start_lab(args, data_dir: str, weights: str, preprocess: str, epochs: int) -> list[subprocess.Popen]:
    """The lab's job, one process per worker, the chief first (its output on a pipe);
    `preprocess`: "unit" ([0, 1], the codelab's) or "resnet50" (preprocess_input)."""
    from trainer.process import launch, ports

    cluster, tasks = launch.plan_cluster(args.workers, 0, False, ports.free_ports(args.workers, "localhost"))
    processes = []
    for task in tasks:
        # The codelab's tf.keras as it ran multi-worker before this runtime's loop: legacy Keras
        # (tf-keras), whose fit trains across workers; Keras 3's fit does not (docs/keras.md).
        env = dict(os.environ, PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1")
        if args.workers > 1:
            env["TF_CONFIG"] = launch.tf_config(cluster, task)
        chief = task.task_type == "chief"
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--lab-task", "--data", data_dir, "--batch", str(args.batch),
             "--image-size", str(args.image_size), "--max-epochs", str(epochs), "--weights", weights,
             "--seed", str(args.seed), "--lab-preprocess", preprocess],
            stdout=subprocess.PIPE if chief else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True, env=env))
    return processes


def run_lab(args, data_dir: str, weights: str, target: float, preprocess: str = "unit") -> Run:
    """The lab's job, watched until it reaches `target` (run_lab's `preprocess`: start_lab's)."""
    started = time.monotonic()
    processes: list[subprocess.Popen] = []
    clock = rounds_lib.Timer(lambda: sum(rounds_lib.tree_cpu_seconds(p.pid) for p in processes), baseline=0.0).start()
    processes += start_lab(args, data_dir, weights, preprocess, args.max_epochs)

    def parse(line):
        return json.loads(line).get("val_accuracy") if line.startswith("{") else None

    run = Run(RECIPES["lab-preprocessed" if preprocess == "resnet50" else "lab"], images_per_epoch(args))
    watch(run, processes, processes[0].stdout, parse, target, args.max_seconds, started, signal.SIGKILL, clock)
    return run


def start_trainer(args, data_root: str, work: str, weights: str, epochs: int, momentum: float | None) -> subprocess.Popen:
    """`python -m trainer.launch ... -- python -m cassava.task ...` with every default but the sizes
    (and --batch-norm-momentum when `momentum` is given); its output on the returned pipe."""
    shutil.rmtree(work, ignore_errors=True)  # a fresh job: no backup to resume from
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.launch", "--replicas", str(args.workers), "--work-dir", os.path.join(work, "launch"),
         "--", "python", "-m", "cassava.task", "--dataset", f"synthetic:{args.images}", "--data-dir", data_root,
         "--image-size", str(args.image_size), "--per-replica-batch-size", str(args.batch), "--epochs", str(epochs),
         "--weights", weights, "--model-dir", os.path.join(work, "model"),
         *(["--batch-norm-momentum", str(momentum)] if momentum is not None else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=REPO))


def run_trainer(args, data_root: str, work: str, weights: str, target: float, momentum: float | None = None) -> Run:
    """The trainer's job; `momentum`: its --batch-norm-momentum, None for the default."""
    started = time.monotonic()
    launcher = start_trainer(args, data_root, work, weights, args.max_epochs, momentum)
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
    if momentum is not None:
        run.name += f", batch-norm momentum {momentum:g}"
    return run


# The recipes, by the name --recipes takes, and what their rows say. The lab's two differ in one
# line (the preprocessing); the trainer's two in one flag (--batch-norm-momentum).
RECIPES = {
    "lab": "lab",
    "lab-preprocessed": "lab + preprocess_input",
    "trainer": "trainer",
    "trainer-momentum-0.99": "trainer, batch-norm momentum 0.99",
}
LAB_RECIPES = ("lab", "lab-preprocessed")


def run_recipe(recipe: str, args, data_dir: str, data_root: str, work: str, weights: str, target: float) -> Run:
    if recipe == "lab":
        return run_lab(args, data_dir, weights, target)
    if recipe == "lab-preprocessed":
        return run_lab(args, data_dir, weights, target, preprocess="resnet50")
    return run_trainer(args, data_root, work, weights, target, 0.99 if recipe == "trainer-momentum-0.99" else None)


@dataclasses.dataclass
class Verdict:
    """`mine`'s time to the target over `theirs`': `value` (a bound when `bound`), from `measure`
    ("wall", "cpu" or "none"), the per-round ratios it is the median of (`spread`), and `text`."""

    value: float | None
    bound: bool
    measure: str
    text: str
    spread: tuple[float, float] | None = None
    rounds: str = ""

    @property
    def summary(self) -> str:
        if self.value is None:
            return "=none"
        return f"{'<=' if self.bound else '='}{self.value:.2f}"


def run_flags(runs: list[Run]) -> list[bool]:
    """Which of one recipe's runs had other cores than its median (benchmarks/rounds.py)."""
    samples = [run.sample for run in runs]
    return rounds_lib.flags(samples) if all(samples) else [False] * len(runs)


def verdict(theirs: list[Run], mine: list[Run], target: float) -> Verdict:
    """`mine`'s time to the target over `theirs`', round by round. A round counts for the wall-time
    ratio when both reached the target, neither run was flagged (cores off its recipe's median)
    and the two had the same cores (within rounds_lib.CORES_TOLERANCE): otherwise the one with
    more cores would win by them. With at least half the rounds counted, the ratio is their
    median; else it is the median over the rounds where both reached the target of the ratio of
    CPU seconds to it, which cores coming and going do not move. The spread is the lowest and
    highest of the ratios the median is taken over. When `theirs` never reached the target in a
    round, that round's ratio is a bound (mine over their time limit)."""
    rounds = len(theirs)
    if not any(run.reached is not None for run in mine):
        return Verdict(None, False, "none", "did not reach the target: no ratio")
    flagged = [a or b for a, b in zip(run_flags(theirs), run_flags(mine))]
    both = [i for i in range(rounds) if mine[i].reached is not None and theirs[i].reached is not None]
    same = [i for i in both if not flagged[i] and mine[i].sample and theirs[i].sample
            and rounds_lib.same_cores(mine[i].sample, theirs[i].sample)]
    if not both:  # they never reached it: mine over their limit, a bound
        ratios = [mine[i].reached / theirs[i].elapsed for i in range(rounds) if mine[i].reached is not None]
        return Verdict(statistics.median(ratios), True, "wall", "wall time over the other's time limit, in the rounds "
                       "where it reached the target", (min(ratios), max(ratios)), f"{len(ratios)}/{rounds}")
    if same and 2 * len(same) >= rounds:
        ratios = [mine[i].reached / theirs[i].reached for i in same]
        text = (f"wall time, median of the {len(same)} of {rounds} rounds where both reached {target:.2f}, neither was "
                f"flagged and their cores differed by at most {rounds_lib.CORES_TOLERANCE:.0%}")
        return Verdict(statistics.median(ratios), False, "wall", text, (min(ratios), max(ratios)), f"{len(same)}/{rounds}")
    ratios = [mine[i].sample.cpu / theirs[i].sample.cpu for i in both]
    text = (f"CPU seconds to {target:.2f}, median over the {len(both)} rounds where both reached it: only {len(same)} of "
            f"{rounds} rounds had both unflagged on cores within {rounds_lib.CORES_TOLERANCE:.0%} of each other, so "
            f"their wall times mix regimes")
    return Verdict(statistics.median(ratios), False, "cpu", text, (min(ratios), max(ratios)), f"{len(both)}/{rounds}")


def reached_in_most(runs: list[Run]) -> bool:
    return 2 * sum(run.reached is not None for run in runs) >= len(runs) > 0


def best_lab(recipes: dict[str, list[Run]]) -> str | None:
    """The lab variant that reached the target in at least half its rounds with the lowest median
    time to it; None when none did."""
    reaching = [name for name in LAB_RECIPES if name in recipes and reached_in_most(recipes[name])]
    return min(reaching, key=lambda name: statistics.median(run.reached for run in recipes[name] if run.reached is not None),
               default=None)


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


def rounds_table(recipes: dict[str, list[Run]]) -> list[str]:
    """Every run, round by round, in the recipes' order; `flagged`: its cores were off its recipe's median."""
    flags = {name: run_flags(runs) for name, runs in recipes.items()}
    rows, flagged = [], {}
    count = max((len(runs) for runs in recipes.values()), default=0)
    for number in range(count):
        for name, runs in recipes.items():
            if number < len(runs):
                flagged[len(rows)] = flags[name][number]
                rows.append((number + 1, runs[number]))
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


# ---------------------------------------------------------------------------------------------
# Where a whole trainer job's CPU goes, phase by phase.

class CpuTrace:
    """A job's CPU seconds (`read`), sampled every `period` seconds from a thread: the CPU spent
    between two moments is read off the samples around them (linear in between)."""

    def __init__(self, read, period: float = 0.1):
        self.read, self.period = read, period
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "CpuTrace":
        self.samples.append((time.monotonic(), 0.0))
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.period):
            value = self.read()
            if value >= self.samples[-1][1]:  # a tree whose root is gone reads as less: not a sample
                self.samples.append((time.monotonic(), value))

    def stop(self, total: float | None = None) -> None:
        """Stops sampling; `total`, the job's CPU seconds at its end, becomes the last sample."""
        self._stop.set()
        self._thread.join()
        if total is not None:
            self.samples.append((time.monotonic(), max(total, self.samples[-1][1])))

    def at(self, moment: float) -> float:
        before = max((s for s in self.samples if s[0] <= moment), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= moment), default=self.samples[-1])
        if after[0] == before[0]:
            return before[1]
        return before[1] + (after[1] - before[1]) * (moment - before[0]) / (after[0] - before[0])


FIRST_LOG_LINE = re.compile(r"^\[chief-0\] \d\d:\d\d:\d\d trainer: ")
# The chief's log lines that end a phase (trainer.precision, trainer.runtime.callbacks.EpochLog, trainer.runtime.saving).
PHASE_LINES = {
    "precision": re.compile(r"^\[chief-0\] .*trainer: precision: "),
    "begins": re.compile(r"^\[chief-0\] .*trainer: epoch (\d+)/\d+ begins"),
    "ends": re.compile(r"^\[chief-0\] .*trainer: epoch (\d+)/\d+ ends"),
    "steps": re.compile(r"^\[chief-0\] .*trainer: epoch (\d+)/\d+ input: the steps waited \d+\.\d s of (\d+\.\d) s"),
    "saved": re.compile(r"^\[chief-0\] .*trainer: saved model to "),
}
BACKUP_LINE = re.compile(r"^\[chief-0\] .*trainer: backup saved in (\d+\.\d)s")


def follow(processes: list[subprocess.Popen], classify, started: float, epochs: int, images: int,
           validation_images: int) -> dict:
    """Reads the chief's output (processes[0]) to its end, `classify(line)` giving a mark
    [what, epoch or None, the steps' own seconds or None] or None; samples every process tree's CPU
    meanwhile. Returns the raw data of phase_rows: the marks with their moments and CPU seconds."""
    reaped_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    trace = CpuTrace(lambda: sum(rounds_lib.tree_cpu_seconds(p.pid) for p in processes)).start()
    marks: list[list] = []  # [what, seconds since start, epoch or None, the steps' own seconds or None]
    for line in processes[0].stdout:
        moment = time.monotonic() - started
        found = classify(line)
        if found and not (found[0] == "first line" and any(mark[0] == "first line" for mark in marks)):
            marks.append([found[0], moment, *found[1:]])
    codes = [process.wait() for process in processes]
    ended = time.monotonic() - started
    # Once reaped, the processes' CPU (with their own reaped children's) is this process's children's.
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    trace.stop((reaped.ru_utime + reaped.ru_stime) - (reaped_before.ru_utime + reaped_before.ru_stime))
    for mark in marks:
        mark.append(trace.at(started + mark[1]))
    begins = {mark[2]: mark[1] for mark in marks if mark[0] == "begins"}
    spans = {mark[2]: mark[3] for mark in marks if mark[0] == "steps"}
    backups = [[mark[1] - mark[3], mark[1], trace.at(started + mark[1] - mark[3]), mark[4]]
               for mark in marks if mark[0] == "backup"]
    marks = [mark for mark in marks if mark[0] != "backup"]
    return {"epochs": epochs, "exit": max(codes, key=abs), "wall": ended, "cpu": trace.samples[-1][1], "marks": marks,
            "steps_end_cpu": [[epoch, trace.at(started + begins[epoch] + span)] for epoch, span in spans.items()
                              if epoch in begins],
            "images_per_epoch": images, "validation_images": validation_images, "backups": backups}


def trace_trainer(args, data_root: str, work: str, weights: str, epochs: int) -> dict:
    """One trainer job (every default, fine-tuning) run to its end over `epochs` epochs; phases
    from its chief's log lines, the steps' span from the epoch's input line (trainer.library.input_wait)."""
    started = time.monotonic()
    launcher = start_trainer(args, data_root, work, weights, epochs, None)

    def classify(line):
        backup = BACKUP_LINE.search(line)
        if backup:  # it ended as it was logged, after the seconds it names
            return ["backup", None, float(backup.group(1))]
        if FIRST_LOG_LINE.search(line):
            # The chief's first line in the trainer's log format comes after Python, the imports
            # and the command line's parsing (earlier lines are TensorFlow's and the relay's).
            first = ["first line", None, None]
        else:
            first = None
        for what, pattern in PHASE_LINES.items():
            found = pattern.search(line)
            if found:
                groups = found.groups()
                return [what, int(groups[0]) if groups else None, float(groups[1]) if len(groups) > 1 else None]
        return first

    return follow([launcher], classify, started, epochs, images_per_epoch(args), max(8, args.images // 4))


def trace_lab(args, data_dir: str, weights: str, epochs: int) -> dict:
    """One job of the lab's recipe with preprocess_input (the lab variant that learns; the CPU
    is the same either way) run to its end over `epochs` epochs; phases from its JSON marks, the
    steps' span from each epoch's start to its validation's."""
    started = time.monotonic()
    processes = start_lab(args, data_dir, weights, "resnet50", epochs)
    epoch_started: dict[int, float] = {}

    def classify(line):
        if not line.startswith("{"):
            return None
        record = json.loads(line)
        what, epoch, moment = record.get("mark"), record.get("epoch"), time.monotonic() - started
        if what == "imported":
            return ["first line", None, None]
        if what == "epoch":
            epoch_started[epoch] = moment
            return ["begins", epoch, None]
        if what == "validation" and epoch in epoch_started:
            return ["steps", epoch, moment - epoch_started[epoch]]
        if "val_accuracy" in record:
            return ["ends", record["epoch"], None]
        return None

    return follow(processes, classify, started, epochs, images_per_epoch(args), max(8, args.images // 4))


def phase_rows(phases: dict) -> list[tuple[str, float, float, int]]:
    """(phase, wall seconds, CPU seconds, images it ran over) from follow's raw data, in order.
    Epoch 1 stands alone (it holds the first step's tracing and the first validation's); each
    later epoch is split where its steps ended: at its start plus the steps' own span. The
    trainer's backups of its training state (each logged with its duration) are taken out of
    the phase they fell in and shown in a row of their own."""
    marks: dict[tuple[str, int | None], tuple[float, float, float | None]] = {}
    for what, moment, epoch, steps, cpu in phases["marks"]:
        marks.setdefault((what, epoch), (moment, cpu, steps))
    steps_end = {epoch: cpu for epoch, cpu in phases["steps_end_cpu"]}
    backups = phases.get("backups", [])
    per_epoch, validation = phases["images_per_epoch"], phases["validation_images"]
    rows: list[tuple[str, float, float, int]] = []
    at = (0.0, 0.0)

    def less_backups(name: str, start: float, end: float, wall: float, cpu: float, images: int):
        """The window (start, end] less the backups that ended in it."""
        inside = [b for b in backups if start < b[1] <= end]
        return (name, wall - sum(b[1] - b[0] for b in inside), cpu - sum(b[3] - b[2] for b in inside), images)

    def until(name: str, mark: tuple[float, float, float | None] | None, images: int = 0) -> None:
        nonlocal at
        if mark is not None:
            rows.append(less_backups(name, at[0], mark[0], mark[0] - at[0], mark[1] - at[1], images))
            at = mark[:2]

    # The trainer logs its first line before it imports TensorFlow (cassava.task imports it inside
    # the task's methods); the lab's first mark comes after.
    until("start-up: the launcher, Python, the runtime's imports, parsing" if ("precision", None) in marks
          else "start-up: Python, TensorFlow's import", marks.get(("first line", None)))
    until("TensorFlow's import, the strategy, the precision probe", marks.get(("precision", None)))
    until("data and model set-up", marks.get(("begins", 1)))
    until("epoch 1: the steps' and the validation's tracing, steps, validation, epoch-end work", marks.get(("ends", 1)),
          per_epoch)
    steady = [e for e in range(2, phases["epochs"] + 1)
              if all(key in marks for key in (("begins", e), ("ends", e), ("steps", e), ("ends", e - 1)))
              and e in steps_end]
    if steady and steady == list(range(2, steady[-1] + 1)):
        span = f"epochs {steady[0]}-{steady[-1]}" if len(steady) > 1 else f"epoch {steady[0]}"
        sums = {"gap": [0.0, 0.0], "steps": [0.0, 0.0], "validation": [0.0, 0.0]}
        for e in steady:
            previous, begins, ends = marks[("ends", e - 1)], marks[("begins", e)], marks[("ends", e)]
            stepped = begins[0] + marks[("steps", e)][2]
            windows = {"gap": (previous[0], begins[0], previous[1], begins[1]),
                       "steps": (begins[0], stepped, begins[1], steps_end[e]),
                       "validation": (stepped, ends[0], steps_end[e], ends[1])}
            for key, (t0, t1, c0, c1) in windows.items():
                _, wall, cpu, _ = less_backups(key, t0, t1, t1 - t0, c1 - c0, 0)
                sums[key][0] += wall
                sums[key][1] += cpu
        rows.append((f"{span}: between one epoch's end and the next's start", *sums["gap"], 0))
        rows.append((f"{span}: train steps (their own span)", *sums["steps"], per_epoch * len(steady)))
        rows.append((f"{span}: validation and epoch-end work", *sums["validation"], validation * len(steady)))
        at = marks[("ends", steady[-1])][:2]
    until("export (float32 copy, SavedModel)", marks.get(("saved", None)))
    until("exit", (phases["wall"], phases["cpu"], None))
    if backups:
        rows.append((f"backups of the training state ({len(backups)}, for restarts; out of the rows above)",
                     sum(b[1] - b[0] for b in backups), sum(b[3] - b[2] for b in backups), 0))
    return rows


PHASE_SOURCES = {
    "trainer": "the trainer's (every default, fine-tuning), split at the moments its chief's log lines arrived; the "
               "later epochs' steps over the span the steps measure themselves (the input-wait measurement); epoch-end work "
               "holds its checkpoint and TensorBoard writes",
    "lab": "the lab's with preprocess_input (the lab's own CPU is the same either way), split at the moments its "
           "chief's marks arrived (after the imports, at each epoch's start and its validation's: the steps' span "
           "runs from one to the other)",
}


def phase_table(phases: dict, who: str) -> list[str]:
    """One traced job's phases (follow's raw data); `who`: "trainer" or "lab"."""
    trained = phases["epochs"] * phases["images_per_epoch"]
    lines = [f"### {'The trainer' if who == 'trainer' else 'The lab'}", "",
             f"One job of {phases['epochs']} epochs to its end ({trained} images trained, exit {phases['exit']}): "
             f"{PHASE_SOURCES[who]}. Its processes' CPU was sampled every 0.1 s. CPU per image trained spreads each "
             f"phase over the job's {trained} images, so the column adds up to the job's; CPU per image of its own is "
             f"the phase's over the images it ran (validation images for validation).", "",
             "| phase | wall s | CPU s | cores | CPU s per image trained | CPU s per image of its own |",
             "|---|---|---|---|---|---|"]
    rows = phase_rows(phases)
    for name, wall, cpu, images in rows:
        own = f"{cpu / images:.4f}" if images else "-"
        lines.append(f"| {name} | {wall:.1f} | {cpu:.1f} | {cpu / wall if wall > 0 else 0:.2f} | {cpu / trained:.4f} "
                     f"| {own} |")
    lines.append(f"| whole job | {phases['wall']:.1f} | {phases['cpu']:.1f} | {phases['cpu'] / phases['wall']:.2f} | "
                 f"{phases['cpu'] / trained:.4f} | |")
    first = [row for row in rows if row[0].startswith("epoch 1:")]
    later = [row for row in rows if row[0].startswith(("epoch ", "epochs ")) and not row[0].startswith("epoch 1:")]
    steady = phases["epochs"] - 1
    if first and later and steady:
        extra_wall = first[0][1] - sum(row[1] for row in later) / steady
        extra_cpu = first[0][2] - sum(row[2] for row in later) / steady
        lines += ["", f"Epoch 1 took {extra_wall:.1f} s and {extra_cpu:.1f} CPU s more than a later epoch on average "
                      f"(tracing, first passes), {extra_cpu / trained:.4f} CPU s per image trained over this job's "
                      f"{phases['epochs']} epochs."]
    return lines


def phase_comparison(phases: dict) -> str:
    """The two traced jobs side by side, per image: the whole job, the later epochs' steps and
    their validation."""
    def per_image(job, match):
        rows = [row for row in phase_rows(job) if match(row[0]) and row[3]]
        return sum(row[2] for row in rows) / sum(row[3] for row in rows) if rows else None

    figures = []
    for label, match in (("the later epochs' train steps", lambda name: "train steps" in name),
                         ("their validation, per validation image", lambda name: "validation and epoch-end" in name)):
        mine, theirs = per_image(phases["trainer"], match), per_image(phases["lab"], match)
        if mine is not None and theirs is not None:
            figures.append(f"{label} {mine:.4f} against {theirs:.4f} (x{mine / theirs:.2f})")
    whole = [job["cpu"] / (job["epochs"] * job["images_per_epoch"]) for job in (phases["trainer"], phases["lab"])]
    return (f"CPU seconds per image, the trainer's against the lab's: the whole job {whole[0]:.4f} against "
            f"{whole[1]:.4f} (x{whole[0] / whole[1]:.2f})" + "".join(f"; {figure}" for figure in figures) + ".")


# What report() reads of the command's options.
REPORTED_OPTIONS = ("images", "image_size", "batch", "workers", "target", "scratch_target")


def run_record(run: Run) -> dict:
    """A run as JSON values, for the raw data beside the results file."""
    return dataclasses.asdict(run)


def run_of(record: dict) -> Run:
    sample = rounds_lib.Sample(**record["sample"]) if record.get("sample") else None
    return Run(**{**record, "epochs": [tuple(epoch) for epoch in record["epochs"]], "sample": sample})


def raw_data(args, weights_line: str, fine: dict[str, list[Run]], scratch: dict[str, list[Run]],
             phases: dict | None = None) -> dict:
    """Everything report() reads, as JSON values: the run's raw rounds, recipe by recipe in the
    order the tables show them, and the traced jobs ("trainer", "lab": follow's data; empty when
    not traced)."""
    return {"options": {name: getattr(args, name) for name in REPORTED_OPTIONS}, "weights_line": weights_line,
            **{setting: [[name, [run_record(r) for r in runs]] for name, runs in recipes.items()]
               for setting, recipes in (("fine", fine), ("scratch", scratch))},
            "phases": phases or {}}


def ratio_line(subject: str, other: str, result: Verdict, target: float) -> str:
    if result.value is None:
        return f"{subject} {result.text}."
    spread = f", spread {result.spread[0]:.2f}-{result.spread[1]:.2f} over {result.rounds} rounds" if result.spread else ""
    return (f"{subject} took x{result.value:.2f}{' at most' if result.bound else ''} {other}'s time to {target:.2f}"
            f"{spread}; from {result.text}.")


def report(raw: dict) -> str:
    """The results file's body, from the raw data (raw_data) alone."""
    args = argparse.Namespace(**raw["options"])
    fine = {name: list(map(run_of, runs)) for name, runs in raw["fine"]}
    scratch = {name: list(map(run_of, runs)) for name, runs in raw["scratch"]}
    lines = [
        f"task: synthetic:{args.images} ({max(8, args.images // 4)} validation images), {args.image_size} px, "
        f"{args.batch} per replica, {args.workers} worker(s); 5 classes, chance 0.20. `others' cores`: what other "
        f"processes on the machine used while each run ran (0 on a quiet machine); `flagged`: the run's cores were "
        f"more than {rounds_lib.CORES_TOLERANCE:.0%} off its recipe's median.",
        "",
        f"## Fine-tuning, the lab's own setting: every recipe from the same pretrained weights, to val_accuracy "
        f"{args.target:.2f}",
        "",
        f"Weights: {raw['weights_line']}.",
        "",
        "Recipes: `lab`, the codelab's as written ([0, 1] inputs); `lab + preprocess_input`, the same with "
        "`tf.keras.applications.resnet50.preprocess_input` (the preprocessing the weights expect) in place of the "
        "division by 255, nothing else changed; `trainer`, every default; `trainer, batch-norm momentum 0.99`, "
        "the same with Keras' momentum in place of its default 0.9.",
        "",
        *rounds_table(fine),
        "",
    ]
    mine = fine.get("trainer", [])
    against = best_lab(fine)
    if against is None:
        labs = [name for name in LAB_RECIPES if name in fine]
        limit = max((run.elapsed for name in labs for run in fine[name]), default=0.0)
        reached = [run.reached for run in mine if run.reached is not None]
        value = statistics.median(reached) / limit if reached and limit else None
        main_verdict = Verdict(value, True, "none", "no lab variant reached the target")
        lines.append(f"No lab variant ({', '.join(RECIPES[name] for name in labs)}) reached {args.target:.2f} in at least "
                     f"half its rounds" + (f"; the trainer's median time over their limit: x{value:.2f} at most." if value
                                           is not None else "."))
    else:
        main_verdict = verdict(fine[against], mine, args.target)
        lines.append(ratio_line(f"Against the fastest lab variant that reaches the target ({RECIPES[against]}), the "
                                f"trainer", RECIPES[against], main_verdict, args.target))
        for name in LAB_RECIPES:
            if name in fine and name != against:
                lines.append("")
                lines.append(ratio_line("Against `" + RECIPES[name] + "`, the trainer", RECIPES[name],
                                        verdict(fine[name], mine, args.target), args.target))
    if "trainer-momentum-0.99" in fine and mine:
        lines += ["", ratio_line("At batch-norm momentum 0.99, the trainer", "its default 0.9",
                                 verdict(mine, fine["trainer-momentum-0.99"], args.target), args.target)]
    if scratch:
        lines += ["", f"## From random weights, to val_accuracy {args.scratch_target:.2f}: a setting the lab's recipe is not made for",
                  "",
                  "The lab's recipe is a fine-tuning recipe (Adam 1e-4, Keras' batch-norm momentum 0.99, inputs in [0, 1] "
                  "where the weights expect the ImageNet preprocessing); it is run from random weights here only to show "
                  "what the trainer's from-scratch defaults (learning rate 1e-3 with a one-epoch warm-up, batch-norm "
                  "momentum 0.9) do there. This table is not the comparison that counts.", "",
                  *rounds_table(scratch), ""]
        scratch_verdict = verdict(scratch.get("lab", []), scratch.get("trainer", []), args.scratch_target)
        lines.append(f"From random weights: trainer_over_lab{scratch_verdict.summary}"
                     + (f" ({scratch_verdict.text})." if scratch_verdict.value is not None else "."))
        lines.append(pretraining_check(mine, scratch.get("trainer", [])))
    phases = raw.get("phases") or {}
    if phases:
        lines += ["", "## Where the CPU goes, phase by phase", ""]
        for who in ("trainer", "lab"):
            if who in phases:
                lines += [*phase_table(phases[who], who), ""]
        if "trainer" in phases and "lab" in phases:
            lines += [phase_comparison(phases), ""]
        lines.pop()
    spread = (f" spread={main_verdict.spread[0]:.2f}-{main_verdict.spread[1]:.2f}"
              if main_verdict.spread and main_verdict.value is not None else "")
    lines += ["", f"summary: trainer_over_lab{main_verdict.summary} against={against or 'none'} "
                  f"from={main_verdict.measure}{spread}" + (f" rounds={main_verdict.rounds}" if main_verdict.rounds else "")]
    return "\n".join(lines)


def main(argv=None) -> int:
    from trainer import cli

    parser = cli.OneLineParser(prog="python benchmarks/time_to_accuracy.py", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes of each MultiWorkerMirrored job")
    parser.add_argument("--images", type=int, default=384, help="generated training images (a quarter as many validate)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="per replica, for both recipes")
    parser.add_argument("--weights", default=None,
                        help="a ResNet50 no-top weights file both recipes fine-tune from (ImageNet's, where you have "
                             "them); by default weights pretrained here once (benchmarks/pretrain.py)")
    parser.add_argument("--target", type=float, default=0.7, help="val_accuracy to reach when fine-tuning")
    parser.add_argument("--rounds", type=int, default=3, help="fine-tuning rounds (each runs every recipe once)")
    parser.add_argument("--recipes", default=",".join(RECIPES),
                        help=f"the fine-tuning recipes each round runs, of {', '.join(RECIPES)} (trainer is required: "
                             "the ratios are its)")
    parser.add_argument("--phase-epochs", type=int, default=3,
                        help="epochs of one more trainer job, run to its end, whose CPU is split by phase (0: none)")
    parser.add_argument("--scratch-rounds", type=int, default=1, help="rounds from random weights (0: none)")
    parser.add_argument("--scratch-target", type=float, default=0.6, help="val_accuracy to reach from random weights")
    parser.add_argument("--max-epochs", type=int, default=100,
                        help="each run stops after this many epochs if it has not reached its target")
    parser.add_argument("--max-seconds", type=float, default=600.0,
                        help="each fine-tuning run stops here if it has not reached its target")
    parser.add_argument("--scratch-max-seconds", type=float, default=330.0,
                        help="each run from random weights stops here if it has not reached its target")
    parser.add_argument("--pretrain-steps", type=int, default=600, help="steps of the pretraining, when it is done here")
    parser.add_argument("--pretrain-batch", type=int, default=32,
                        help="images a pretraining step (and a held-out batch) takes, when it is done here")
    parser.add_argument("--weights-cache", default=pretrain.CACHE_DIR, help="where weights pretrained here are kept")
    parser.add_argument("--seed", type=int, default=42, help="the lab's seed (the trainer's --seed default is 42)")
    parser.add_argument("--data-dir", default=None, help="where the generated data is kept; default a temp dir")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the table goes to DIR/time_to_accuracy/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    parser.add_argument("--lab-task", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--lab-preprocess", choices=("unit", "resnet50"), default="unit", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    legacy_keras.require(parser)
    if args.lab_task:
        return lab_task(args)
    recipes = [name.strip() for name in args.recipes.split(",") if name.strip()]
    if (args.workers < 1 or args.images < 1 or args.rounds < 1 or args.pretrain_batch < 1 or args.scratch_rounds < 0
            or args.phase_epochs < 0 or not 0 <= args.target <= 1 or not 0 <= args.scratch_target <= 1):
        print("time_to_accuracy: --workers, --images, --rounds and --pretrain-batch must be positive, --scratch-rounds and "
              "--phase-epochs at least 0, and the targets within [0, 1]", file=sys.stderr)
        return 2
    if "trainer" not in recipes or any(name not in RECIPES for name in recipes) or len(set(recipes)) < len(recipes):
        print(f"time_to_accuracy: --recipes {args.recipes}: name each of {', '.join(RECIPES)} at most once, trainer "
              f"included", file=sys.stderr)
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
        weights, cost = pretrain.ensure(args.weights_cache, image_size=args.image_size, steps=args.pretrain_steps,
                                        batch=args.pretrain_batch)
        weights_line = f"{pretrain.describe(cost)}; cached in {weights}"
    print(f"weights: {weights_line}", flush=True)
    with tempfile.TemporaryDirectory(prefix="time-to-accuracy-") as work:
        data_root = args.data_dir or os.path.join(work, "data")
        print(f"generating synthetic:{args.images} ...", flush=True)
        data_dir = synthetic.ensure(data_root, args.images)

        def rounds(count, names, weights_file, target, max_seconds):
            """`count` rounds of every recipe in `names`, each round starting one recipe later, so
            that each goes first, second, ... in turn and a change of the machine's regime does not
            always hit the same one."""
            runs = {name: [] for name in names}
            limited = argparse.Namespace(**{**vars(args), "max_seconds": max_seconds})
            for number in range(count):
                print(f"round {number + 1} of {count} ({'fine-tuning' if weights_file != 'none' else 'from random weights'})",
                      flush=True)
                for offset in range(len(names)):
                    name = names[(number + offset) % len(names)]
                    runs[name].append(run_recipe(name, limited, data_dir, data_root, os.path.join(work, "trainer"),
                                                 weights_file, target))
            return runs

        fine = rounds(args.rounds, recipes, weights, args.target, args.max_seconds)
        scratch = rounds(args.scratch_rounds, ["lab", "trainer"], "none", args.scratch_target,
                         args.scratch_max_seconds) if args.scratch_rounds else {}
        phases = {}
        if args.phase_epochs:
            print(f"one job of each of the trainer and the lab (with preprocess_input), {args.phase_epochs} epochs, "
                  f"their CPU split by phase", flush=True)
            phases["trainer"] = trace_trainer(args, data_root, os.path.join(work, "trainer"), weights, args.phase_epochs)
            phases["lab"] = trace_lab(args, data_dir, weights, args.phase_epochs)
    raw = raw_data(args, weights_line, fine, scratch, phases)
    text = report(raw)
    print(text)
    if args.results_dir:
        path = write_results("time_to_accuracy", command_line("time_to_accuracy.py", argv),
                             datetime.date.today().isoformat(), text, args.results_dir, raw=raw)
        print(f"results: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
