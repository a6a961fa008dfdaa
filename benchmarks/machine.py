"""Which machine a benchmark ran on, for every figure it prints, and where its tables go: figures
from two CPU kinds must never be compared unlabelled, so each kind has its own results file."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex

RESULTS_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def cpu_model() -> str:
    """The CPU's name and the vector extensions that decide these figures, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            text = cpuinfo.read()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next(iter(re.findall(r"^model name\s*:\s*(.+)$", text, re.M)), "unknown CPU").strip()
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
    if family and model:  # VMs often name only the brand; family 25 is AMD Zen 3/4, 26 Zen 5
        name += f" (family {family.group(1)}, model {model.group(1)})"
    flags = set(next(iter(re.findall(r"^flags\s*:\s*(.+)$", text, re.M)), "").split())
    shown = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name}: {' '.join(shown) or 'no AVX2'}"


def kind_slug(model: str | None = None) -> str:
    """A file name for the machine kind: 'amd-epyc-family-25-model-1-avx2'. Figures are kept per
    kind because a ratio measured on one CPU says nothing about another."""
    text = (model or cpu_model()).lower()
    text = re.sub(r"\b(processor|cpu|\d+-core)\b", " ", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def command_line(script: str, argv: list[str] | None) -> str:
    """The command as it was run, for the results file: `python benchmarks/SCRIPT.py ARGS`."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, args)])


def heading(benchmark: str, command: str, date: str) -> dict:
    """What a results file's first lines say: the benchmark, this machine, the date and the command."""
    return {"benchmark": benchmark, "cpu_model": cpu_model(), "date": date, "command": command,
            "cpus": os.cpu_count(), "arch": platform.machine()}


def results_text(head: dict, body: str) -> str:
    """A results file: a heading naming the machine, the date, the command that produced it and the
    core count (every benchmark here is bound by the CPU), then `body`."""
    return (f"# {head['benchmark']} on {head['cpu_model']}\n\n{head['date']}, `{head['command']}`, {head['cpus']} CPUs, "
            f"{head['arch']}.\n\n{body.strip()}\n")


def write_results(benchmark: str, command: str, date: str, body: str, root: str | None = None, raw=None) -> str:
    """Writes one benchmark's results on this machine kind to ROOT/BENCHMARK/KIND.md (ROOT is
    benchmarks/results unless given), replacing that kind's earlier file (results_text). With `raw`
    (the run's measurements, as JSON values), KIND.json beside it holds the heading and `raw`, from
    which the benchmark's report() writes `body` again (tests/unit/test_benchmark_results.py checks
    that it does, byte for byte). Returns the path of the .md."""
    directory = os.path.join(root or RESULTS_ROOT, benchmark)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, kind_slug() + ".md")
    head = heading(benchmark, command, date)
    with open(path, "w") as out:
        out.write(results_text(head, body))
    raw_path = path[:-len(".md")] + ".json"
    if raw is not None:
        with open(raw_path, "w") as out:
            json.dump({"heading": head, "raw": raw}, out, indent=1, sort_keys=True)
            out.write("\n")
    elif os.path.exists(raw_path):
        os.remove(raw_path)  # the raw data of an earlier run would no longer match the .md
    return path
