"""Figures that hold when the cores a benchmark gets come and go.

On a shared machine (or a VM whose host is busy) a configuration can run on two cores in one
round and on one in the next: its wall rate halves while the CPU time each image costs stays put.
So every timed round records both, plus what the rest of the machine did meanwhile:

  wall rate       images per wall second;
  CPU per image   CPU seconds this benchmark's processes spent per image (every thread);
  cores           CPU seconds per wall second: how many cores the round really had;
  others          cores' worth of CPU other processes used meanwhile (/proc/stat minus ours);
  steal           cores' worth the hypervisor gave other guests (/proc/stat's steal column).

Configurations are measured in interleaved rounds, so that a change of regime hits every one of
them alike. A round is flagged when its cores depart from that configuration's median by more
than CORES_TOLERANCE: its wall rate no longer tracks its CPU rate. Ratios then come from the
measure that survives: the median over the rounds where no configuration was flagged, and where
the two configurations compared had the same cores (within CORES_TOLERANCE), of the round's
wall-rate ratio, when at least half the rounds are such; else the ratio of the median CPU
seconds per image, which a lost core does not move. Either way the line says which.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import time

CORES_TOLERANCE = 0.25
_TICK = os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process, every thread, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of process `root` and every live descendant, plus its children already reaped
    (their times are added to the parent's when it waits for them)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, parent = int(entry), int(fields[1])
        children.setdefault(parent, []).append(pid)
        # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the name
        times[pid] = sum(int(value) for value in fields[11:15]) / _TICK
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy CPU seconds, stolen CPU seconds) of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


@dataclasses.dataclass
class Sample:
    """One timed round of one configuration."""

    wall: float
    cpu: float
    images: int
    others: float  # cores' worth used by other processes meanwhile
    steal: float  # cores' worth stolen by the hypervisor meanwhile

    @property
    def rate(self) -> float:
        return self.images / self.wall

    @property
    def cpu_per_image(self) -> float:
        return self.cpu / self.images

    @property
    def cores(self) -> float:
        return self.cpu / self.wall


class Timer:
    """Times one round: `cpu` reads this benchmark's CPU seconds (own_cpu_seconds, or the tree of
    a job's processes); `baseline` is their value at the start (0 for processes just started),
    read then when not given."""

    def __init__(self, cpu=own_cpu_seconds, baseline: float | None = None):
        self.read_cpu = cpu
        self.baseline = baseline

    def start(self) -> "Timer":
        self.started = time.perf_counter()
        self.cpu_before = self.read_cpu() if self.baseline is None else self.baseline
        self.busy_before, self.steal_before = machine_cpu()
        return self

    def __enter__(self):
        return self.start()

    def sample(self, images: int) -> Sample:
        wall = time.perf_counter() - self.started
        cpu = self.read_cpu() - self.cpu_before
        busy, steal = machine_cpu()
        others = max(0.0, (busy - self.busy_before) - cpu) / wall
        return Sample(wall, cpu, images, others, (steal - self.steal_before) / wall)

    def __exit__(self, *exc):
        return False


def flags(samples: list[Sample]) -> list[bool]:
    """Which of one configuration's rounds ran on a different number of cores than its median."""
    typical = statistics.median(s.cores for s in samples)
    return [abs(s.cores - typical) > CORES_TOLERANCE * typical for s in samples]


@dataclasses.dataclass
class Comparison:
    """`value` (b's speed over a's) and which measure it came from."""

    value: float
    measure: str  # "wall" or "cpu"
    clean_rounds: int
    rounds: int

    def describe(self) -> str:
        if self.measure == "wall":
            return (f"wall rate, median of the {self.clean_rounds} of {self.rounds} rounds where no configuration was "
                    f"flagged and both had the same cores")
        return (f"CPU seconds per image: only {self.clean_rounds} of {self.rounds} rounds kept their cores and gave both "
                f"the same cores, so the wall rates mix regimes")


def clean_rounds(table: dict[str, list[Sample]]) -> list[bool]:
    """Per round: True when no configuration was flagged in it."""
    flagged = [flags(samples) for samples in table.values()]
    return [not any(column) for column in zip(*flagged)]


def same_cores(x: Sample, y: Sample) -> bool:
    """Whether two rounds ran on the same number of cores, within CORES_TOLERANCE."""
    return abs(x.cores - y.cores) <= CORES_TOLERANCE * max(x.cores, y.cores)


def compare(table: dict[str, list[Sample]], a: str, b: str) -> Comparison:
    """How much faster `b` ran than `a`: per image, from the measure that survives. A round's wall
    ratio counts only when nothing was flagged in it and `a` and `b` had the same cores in it: a
    configuration that got (or used) more cores than the other would otherwise win by them."""
    clean = clean_rounds(table)
    rounds = len(clean)
    kept = [i for i, ok in enumerate(clean) if ok and same_cores(table[a][i], table[b][i])]
    if kept and 2 * len(kept) >= rounds:
        value = statistics.median(table[b][i].rate / table[a][i].rate for i in kept)
        return Comparison(value, "wall", len(kept), rounds)
    value = statistics.median(s.cpu_per_image for s in table[a]) / statistics.median(s.cpu_per_image for s in table[b])
    return Comparison(value, "cpu", len(kept), rounds)


def summary_row(samples: list[Sample]) -> tuple[float, float, float, float, int]:
    """(median wall rate, median CPU s per image, median cores, median others' cores, rounds flagged)."""
    return (statistics.median(s.rate for s in samples), statistics.median(s.cpu_per_image for s in samples),
            statistics.median(s.cores for s in samples), statistics.median(s.others for s in samples),
            sum(flags(samples)))
