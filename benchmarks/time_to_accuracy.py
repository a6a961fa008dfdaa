"""Time to accuracy, the MLPerf way: wall time until a stated validation accuracy, for the lab's
recipe and for the trainer's defaults, in one run, on the same data and the same workers.

    python benchmarks/time_to_accuracy.py [--workers 2] [--images 384] [--image-size 64] [--batch 16]
                                          [--target 0.6] [--max-epochs 100] [--max-seconds 330] [--results-dir DIR]

Both train the real ResNet50 from random weights (`--weights none`: ImageNet's cannot be fetched
on every machine that runs this; a weights file given with --weights goes to both) on the same
generated cassava-like TFRecords (`synthetic:N`, 5 classes, chance 0.20), as one
MultiWorkerMirrored job of --workers processes each, one after the other:

  lab      the codelab's recipe (seed 001), written as the codelab writes it: images decoded,
           resized and scaled to [0, 1] as float32 on the host, shuffle(1000), batched by the
           global batch, AutoShardPolicy.DATA; ResNet50 without top, GlobalAveragePooling2D,
           Dense(1016, relu), Dense(5, softmax); Adam(1e-4); float32. Validation after every
           epoch on the validation split through the same pipeline (the codelab has none).
  trainer  `python -m trainer.launch --workers N -- ...` with every trainer default except the
           sizes below: learning rate auto, warm-up, batch-norm momentum, --mixed-precision auto,
           its input pipeline, cache and augmentation.

Only the sizes are shared and set here, smaller than both recipes' own (300 px, 64 per replica)
so the whole benchmark fits about 10 minutes on 2 cores: --images, --image-size, --batch per
replica. Each clock starts when the job's processes are started (start-up, tracing and the first
epoch's decoding count, as they do for a user) and stops at the end of the first epoch whose
val_accuracy reaches --target; the job is then stopped. A recipe that has not reached it within
--max-epochs or --max-seconds is stopped there, and the ratio becomes a bound.

The last line, `summary: trainer_over_lab=R` (or `<=R`), is the trainer's time over the lab's.
The results go to benchmarks/results/time_to_accuracy/<machine kind>.md (machine.write_results).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
sys.path[:0] = [REPO, BENCHMARKS]
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402

NUM_CLASSES = 5


@dataclasses.dataclass
class Run:
    """One recipe's job: each epoch's (seconds since start, val_accuracy) and when it reached the target."""

    name: str
    epochs: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    reached: float | None = None
    elapsed: float = 0.0  # seconds from start until the job was stopped or ended
    stopped: str = ""

    def describe(self) -> str:
        return " ".join(f"{accuracy:.2f}" for _, accuracy in self.epochs) or "none"


# ---------------------------------------------------------------------------------------------
# The lab's recipe, run as one task of a MultiWorkerMirrored job (`--lab-task`).

def lab_task(args) -> int:
    """The codelab's task.py on generated TFRecords, plus validation each epoch; prints one JSON
    line per epoch on the chief."""
    import trainer  # noqa: F401  (selects tf-keras before TensorFlow is imported, as the trainer does)
    import tensorflow as tf

    from trainer import data

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
          started: float, signum: int) -> None:
    """Reads `stream` (the chief's output) until the target is reached, the job ends or time is up;
    `parse(line)` gives an epoch's val_accuracy or None. Stops every process at the end."""
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
            print(f"{run.name}: epoch {len(run.epochs)} val_accuracy={accuracy:.4f} at {run.epochs[-1][0]:.1f} s", flush=True)
            if accuracy >= target:
                run.reached = run.epochs[-1][0]
                break
    finally:
        timer.cancel()
        run.elapsed = min(time.monotonic() - started, max_seconds)
        stop(processes, signum)
    if run.reached is None:
        how = "stopped" if run.elapsed >= max_seconds else "ended"
        run.stopped = f"{how} after {len(run.epochs)} epochs, {run.elapsed:.0f} s"


def stop(processes: list[subprocess.Popen], signum: int) -> None:
    """`signum` to each process group: SIGKILL for the lab's tasks; SIGTERM for trainer.launch,
    which then stops its tasks at once (they run in sessions of their own, out of reach of a
    signal to the launcher's group)."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                pass
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_lab(args, data_dir: str) -> Run:
    from trainer import launch

    cluster, tasks = launch.plan_cluster(args.workers, 0, False, launch.free_ports(args.workers))
    started = time.monotonic()
    processes = []
    for task in tasks:
        env = dict(os.environ, PYTHONPATH=REPO)
        if args.workers > 1:
            env["TF_CONFIG"] = launch.tf_config(cluster, task)
        chief = task.task_type == "chief"
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--lab-task", "--data", data_dir, "--batch", str(args.batch),
             "--image-size", str(args.image_size), "--max-epochs", str(args.max_epochs), "--weights", args.weights,
             "--seed", str(args.seed)],
            stdout=subprocess.PIPE if chief else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True, env=env))

    def parse(line):
        return json.loads(line)["val_accuracy"] if line.startswith("{") else None

    run = Run("lab")
    watch(run, processes, processes[0].stdout, parse, args.target, args.max_seconds, started, signal.SIGKILL)
    return run


def run_trainer(args, data_root: str, work: str) -> Run:
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer.launch", "--workers", str(args.workers), "--work-dir", os.path.join(work, "launch"),
         "--", "--dataset", f"synthetic:{args.images}", "--data-dir", data_root, "--image-size", str(args.image_size),
         "--per-replica-batch-size", str(args.batch), "--epochs", str(args.max_epochs), "--weights", args.weights,
         "--model-dir", os.path.join(work, "model")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=REPO))
    policy = []

    def parse(line):
        found = re.search(r"^\[chief-0\] .*trainer: precision: (\S+)", line)
        if found:
            policy.append(found.group(1))
        found = re.search(r"^\[chief-0\] .*trainer: epoch \d+/\d+ ends: .*\bval_accuracy=(\d\.\d+)", line)
        return float(found.group(1)) if found else None

    run = Run("trainer")
    watch(run, [launcher], launcher.stdout, parse, args.target, args.max_seconds, started, signal.SIGTERM)
    run.name = f"trainer ({policy[0]})" if policy else "trainer"
    return run


def report(args, lab: Run, default: Run) -> str:
    lines = [
        f"machine: {cpu_model()}",
        f"task: synthetic:{args.images} ({max(8, args.images // 4)} validation images), {args.image_size} px, "
        f"{args.batch} per replica, {args.workers} worker(s), ResNet50 weights {args.weights}; target val_accuracy "
        f"{args.target:.2f} (5 classes: chance 0.20)",
        "",
        "| recipe | time to target | epochs to target | val_accuracy after each epoch |",
        "|---|---|---|---|",
    ]
    for run in (lab, default):
        reached = f"{run.reached:.1f} s" if run.reached is not None else f"not reached ({run.stopped})"
        epochs = str(len(run.epochs)) if run.reached is not None else "-"
        lines.append(f"| {run.name} | {reached} | {epochs} | {run.describe()} |")
    lines.append("")
    if default.reached is None:
        verdict, summary = "the trainer did not reach the target: no ratio", "summary: trainer_over_lab=none"
    elif lab.reached is None:
        bound = default.reached / lab.elapsed
        verdict = (f"The trainer reached {args.target:.2f} in {default.reached:.0f} s; the lab had not after "
                   f"{lab.elapsed:.0f} s, so the trainer took at most x{bound:.2f} the lab's time "
                   f"({'meets' if bound <= 0.5 else 'does not show'} the x0.5 goal).")
        summary = f"summary: trainer_over_lab<={bound:.2f}"
        if args.weights == "none" and lab.epochs and max(a for _, a in lab.epochs) < 1.5 / NUM_CLASSES:
            verdict += (" The lab's recipe is made to fine-tune ImageNet weights (Adam 1e-4, Keras' batch-norm "
                        "momentum 0.99); from random weights its validation stayed at chance throughout.")
    else:
        ratio = default.reached / lab.reached
        verdict = (f"The trainer reached {args.target:.2f} in x{ratio:.2f} the lab's time "
                   f"({'meets' if ratio <= 0.5 else 'MISSES'} the x0.5 goal).")
        summary = f"summary: trainer_over_lab={ratio:.2f}"
    lines += [verdict, "", summary]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes of each MultiWorkerMirrored job")
    parser.add_argument("--images", type=int, default=384, help="generated training images (a quarter as many validate)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="per replica, for both recipes")
    parser.add_argument("--target", type=float, default=0.6, help="val_accuracy to reach")
    parser.add_argument("--max-epochs", type=int, default=100,
                        help="each recipe stops after this many epochs if it has not reached the target")
    parser.add_argument("--max-seconds", type=float, default=330.0, help="each recipe stops here if it has not reached the target")
    parser.add_argument("--weights", default="none", help="none, or a ResNet50 no-top weights file, for both")
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
    if args.workers < 1 or args.images < 1 or not 0 <= args.target <= 1:
        print("time_to_accuracy: --workers and --images must be positive and --target within [0, 1]", file=sys.stderr)
        return 2

    import trainer  # noqa: F401
    from trainer import synthetic

    with tempfile.TemporaryDirectory(prefix="time-to-accuracy-") as work:
        data_root = args.data_dir or os.path.join(work, "data")
        print(f"machine: {cpu_model()}\ngenerating synthetic:{args.images} ...", flush=True)
        data_dir = synthetic.ensure(data_root, args.images)
        print("lab ...", flush=True)
        lab = run_lab(args, data_dir)
        print(f"lab: {lab.describe()}", flush=True)
        print("trainer ...", flush=True)
        default = run_trainer(args, data_root, work)
    text = report(args, lab, default)
    print(text)
    if args.results_dir:
        path = write_results("time_to_accuracy", command_line("time_to_accuracy.py", argv),
                             datetime.date.today().isoformat(), text.split("\n", 1)[1], args.results_dir)
        print(f"results: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
