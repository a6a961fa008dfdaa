"""What one small training task costs a process, from its start to its exported model: the
project as it is ("as written") against a baseline that undoes one of its start-up choices, in one
run. `--baseline autograph` (the default): the project's functions converted by AutoGraph first
(tf.function's default) where they are traced as written (`autograph=False`: trainer.library.loop,
cassava.signature, the runtime's votes). `--baseline collector`: Python's garbage collector left as
CPython sets it, running through TensorFlow's import and walking its objects ever after, where the
runtime pauses it for the import and then freezes them (trainer.runtime.heap).

    python benchmarks/task_startup.py [--baseline autograph|collector] [--rounds 5] [--steps 2]
                                      [--image-size 32] [--results-dir DIR]

Each measurement is a fresh process that runs `python -m cassava.task` as the test tiers' jobs
run it (the small model, one epoch of --steps steps, its validation and its export), and the
figure is that process's CPU seconds, TensorFlow's import included: what every task of every job
pays once, since AutoGraph's conversions are cached only within a process. In the autograph
baseline every `tf.function` the project's own modules create is made with `autograph=True`;
TensorFlow's and Keras' own are left as they are in both. The two configurations alternate, each
round starting with the other one, and each round records what other processes used meanwhile
(benchmarks/rounds.py). The summary gives each one's median and their ratio; the table goes to
benchmarks/results/task_startup/KIND.md (task_startup_collector/ for the collector baseline;
benchmarks/machine.py), the raw figures to KIND.json beside it, unless --results-dir ''.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import RESULTS_ROOT  # noqa: E402
from pipeline_startup import OURS, alternate, children_cpu_seconds, finish, rounds_report  # noqa: E402
from trainer import cli  # noqa: E402
import rounds  # noqa: E402

OWN_MODULES = ("trainer", "cassava")

# The baseline configuration each --baseline names.
BASELINES = {"autograph": "converted", "collector": "collected"}

# One measurement's process: argv is the configuration, then cassava.task's arguments. TensorFlow
# is imported first as trainer.runtime.entry imports it, so that tf.function can be replaced.
_RUN_TASK = """
import importlib, runpy, sys
from trainer.runtime import heap
if sys.argv[1] == "collected":
    heap.import_frozen = lambda *modules: [importlib.import_module(module) for module in modules]
heap.import_frozen("tensorflow", "keras")
import tensorflow as tf
if sys.argv[1] == "converted":
    traced = tf.function
    def converting(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").split(".")[0] in OWN_MODULES:
            kwargs["autograph"] = True  # tf.function's own default
        return traced(*args, **kwargs)
    tf.function = converting
sys.argv = ["cassava.task", *sys.argv[2:]]
runpy.run_module("cassava.task", run_name="__main__")
""".replace("OWN_MODULES", repr(OWN_MODULES))


def task_arguments(data_dir: str, model_dir: str, steps: int, image_size: int) -> list[str]:
    return ["--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", str(steps), "--image-size", str(image_size),
            "--architecture", "small", "--weights", "none", "--per-replica-batch-size", "4", "--data-dir", data_dir,
            "--model-dir", model_dir]


def measure(configuration: str, work: str, steps: int, image_size: int, index: int) -> tuple[float, float]:
    """(CPU seconds of the task's process, cores' worth other processes used meanwhile)."""
    model_dir = os.path.join(work, f"model-{index}-{configuration.replace(' ', '-')}")
    timer = rounds.Timer(cpu=children_cpu_seconds).start()
    result = subprocess.run([sys.executable, "-c", _RUN_TASK, configuration,
                             *task_arguments(os.path.join(work, "data"), model_dir, steps, image_size)],
                            cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    sample = timer.sample(1)
    if result.returncode != 0 or not os.path.isdir(model_dir):
        raise SystemExit(f"task_startup: the {configuration} task failed (exit {result.returncode}): "
                         f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    return sample.cpu, sample.others


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/task_startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", choices=sorted(BASELINES), default="autograph",
                        help="the start-up choice the baseline undoes (default autograph)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each measuring both (default 5)")
    parser.add_argument("--steps", type=int, default=2, help="the task's train steps (default 2)")
    parser.add_argument("--image-size", type=int, default=32, help="the task's image size (default 32)")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="where the table goes, in TASK_STARTUP/KIND.md ('' to only print it)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    with tempfile.TemporaryDirectory(prefix="task-startup-") as work:
        # The data is generated once, by a first task that is not measured.
        measure(OURS, work, args.steps, args.image_size, -1)
        results = alternate(lambda name, index: measure(name, work, args.steps, args.image_size, index), args.rounds,
                            BASELINES[args.baseline])
    sizes = {"steps": args.steps, "image_size": args.image_size, "baseline": BASELINES[args.baseline]}
    finish("task_startup", argv, sizes, results, report, args.results_dir,
           "task_startup" if args.baseline == "autograph" else f"task_startup_{args.baseline}")
    return 0


def report(raw: dict) -> str:
    """The results file's body, from the run's raw measurements alone."""
    return rounds_report(raw, f"One `python -m cassava.task` process from start to exported model, TensorFlow's import "
                              f"included: the small model, one epoch of {raw['steps']} steps of 4 images at "
                              f"{raw['image_size']} px, its validation and its export", "task")


if __name__ == "__main__":
    sys.exit(main())
