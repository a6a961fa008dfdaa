"""What building cassava's input pipeline costs a process before its first batch: its functions
traced as written (cassava.data.as_written, the default) against converted by AutoGraph first
(tf.data's default, the baseline), in one run.

    python benchmarks/pipeline_startup.py [--rounds 5] [--images 64] [--image-size 32] [--results-dir DIR]

Every training process of every job pays it once: a job's tasks each build a training and a
validation pipeline, and AutoGraph's conversions are cached only within a process. So each
measurement is a fresh process that imports TensorFlow, then times (CPU seconds of every thread)
building both pipelines and taking each one's first batch. The two configurations alternate,
each round starting with the other one, and each round records what other processes used
meanwhile (benchmarks/rounds.py). The summary gives each one's median and their ratio; the table
goes to benchmarks/results/pipeline_startup/KIND.md (benchmarks/machine.py), the raw figures to
KIND.json beside it, unless --results-dir ''.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402
from trainer import cli  # noqa: E402
import rounds  # noqa: E402

CONFIGURATIONS = ("converted", "as written")
# The project as it is: the other configuration of every start-up benchmark is a baseline.
OURS = CONFIGURATIONS[1]

# One measurement, in a process of its own: argv is the configuration, the records' folder, the
# number of images and the image size. Prints the CPU seconds as JSON.
_MEASURE = """
import json, sys
from pathlib import Path
import tensorflow as tf
sys.path[:0] = [sys.argv[5], sys.argv[5] + "/benchmarks"]
import rounds
from cassava import data, synthetic
if sys.argv[1] == "converted":
    data.as_written = lambda function: function  # tf.data's own default: AutoGraph converts each function
files = tuple(sorted(str(path) for path in Path(sys.argv[2]).glob("train-*.tfrecord")))
split = data.Split(name="train", num_examples=int(sys.argv[3]), class_names=synthetic.CLASS_NAMES, files=files)
before = rounds.own_cpu_seconds()
for training in (True, False):
    options = data.PipelineOptions(image_size=int(sys.argv[4]), per_replica_batch_size=4, training=training,
                                   cache=training, seed=0)
    next(iter(data.make_dataset(split, options)))
print(json.dumps({"cpu": rounds.own_cpu_seconds() - before}))
"""


def generate(directory: str, images: int) -> None:
    code = ("import sys; from cassava import records, synthetic\n"
            "records.write_shards(synthetic.examples(int(sys.argv[2]), 0, 'bench', (64, 64)), sys.argv[1], 'train', 4)")
    subprocess.run([sys.executable, "-c", code, directory, str(images)], cwd=REPO, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.DEVNULL)


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(configuration: str, directory: str, images: int, image_size: int) -> tuple[float, float]:
    """(CPU seconds the pipelines took, cores' worth other processes used meanwhile: the machine's
    busy time less the whole measuring process's)."""
    timer = rounds.Timer(cpu=children_cpu_seconds).start()
    result = subprocess.run([sys.executable, "-c", _MEASURE, configuration, directory, str(images), str(image_size),
                             str(REPO)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0:
        raise SystemExit(f"pipeline_startup: the {configuration} measurement failed: "
                         f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    cpu = json.loads(result.stdout.strip().splitlines()[-1])["cpu"]
    return cpu, timer.sample(1).others


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/pipeline_startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each measuring both (default 5)")
    parser.add_argument("--images", type=int, default=64, help="generated images the pipelines read (default 64)")
    parser.add_argument("--image-size", type=int, default=32, help="the pipelines' image size (default 32)")
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="where the table goes, in PIPELINE_STARTUP/KIND.md ('' to only print it)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.images < 8:
        parser.error("--rounds must be at least 1 and --images at least 8")
    with tempfile.TemporaryDirectory(prefix="pipeline-startup-") as directory:
        generate(directory, args.images)
        results = alternate(lambda name, _: measure(name, directory, args.images, args.image_size), args.rounds)
    finish("pipeline_startup", argv, {"images": args.images, "image_size": args.image_size}, results, report,
           args.results_dir)
    return 0


def alternate(measure: Callable[[str, int], tuple[float, float]], rounds: int, baseline: str = CONFIGURATIONS[0]
              ) -> dict[str, list[tuple[float, float]]]:
    """configuration -> its (CPU seconds, others' cores) per round: `measure(configuration, round)`
    for `baseline` and OURS each round, each round starting with the one the round before ended
    with; each figure is printed as it comes."""
    configurations = (baseline, OURS)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in configurations}
    for index in range(rounds):
        for name in configurations if index % 2 == 0 else configurations[::-1]:
            cpu, others = measure(name, index)
            results[name].append((cpu, others))
            print(f"round {index + 1}: {name:10} {cpu:5.2f} CPU s  (others used {others:.2f} cores meanwhile)", flush=True)
    return results


def finish(benchmark: str, argv, sizes: dict, results: dict, render: Callable[[dict], str], results_dir: str,
           results_name: str | None = None) -> None:
    """Prints the machine and the report `render` makes of the raw figures, and writes both to
    RESULTS_DIR/RESULTS_NAME/KIND.md and .json (RESULTS_NAME: the benchmark's, unless given) unless
    `results_dir` is ''."""
    raw = {**sizes, "cpu_model": cpu_model(), "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
           "rounds": {name: [list(run) for run in runs] for name, runs in results.items()}}
    body = render(raw)
    print(f"machine: {cpu_model()}")
    print(body)
    if results_dir:
        path = write_results(results_name or benchmark, command_line(f"{benchmark}.py", argv), datetime.date.today().isoformat(), body,
                             results_dir, raw=raw)
        print(f"results: {path}")


def report(raw: dict) -> str:
    """The results file's body, from the run's raw measurements alone."""
    return rounds_report(raw, f"Building a training and a validation pipeline and taking each one's first batch, one "
                              f"fresh process a measurement ({raw['images']} generated images, {raw['image_size']} px, "
                              f"4 per batch)", "process")


def rounds_report(raw: dict, what: str, per: str) -> str:
    """`what` was measured, on which machine; the rounds as a table, each configuration's median,
    and their ratio, with the CPU seconds saved per `per`. The baseline is raw's (the results of a
    run that named none were measured against AutoGraph's conversion)."""
    results = raw["rounds"]
    baseline = raw.get("baseline", CONFIGURATIONS[0])
    configurations = (baseline, OURS)
    medians = {name: statistics.median(cpu for cpu, _ in runs) for name, runs in results.items()}
    lines = [f"{what}; {raw['cpu_model']}, {raw['cores']} cores, load {raw['load']:.2f} at the end.", "",
             "| round | " + " | ".join(f"{name}: CPU s (others' cores)" for name in configurations) + " |",
             "|---|" + "---|" * len(configurations)]
    for index in range(len(results[baseline])):
        cells = [f"{results[name][index][0]:.2f} ({results[name][index][1]:.2f})" for name in configurations]
        lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in configurations:
        lines.append(f"{name}: median {medians[name]:.2f} CPU s over {len(results[name])} rounds")
    lines.append(f"{OURS} / {baseline}: x{medians[OURS] / medians[baseline]:.2f} of the CPU "
                 f"({medians[baseline] - medians[OURS]:+.2f} s saved per {per})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
