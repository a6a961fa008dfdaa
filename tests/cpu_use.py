"""Where a run's CPU went, by kind of process: the figure that says what to cut when the suite is
CPU-bound (issue 53), which per-test times cannot say. A container's processes, an image build's
pip and a training task started by a test all count, whoever started them.

The controller samples /proc once a second in a thread of its own: each process's CPU time
(utime + stime) since the last sample is added to its kind (`kind_of`, from its command line).
A process seen for the first time counts all the CPU it has used so far; one that lived less
than a second between two samples is not seen, so the summary also gives the machine's busy
time (/proc/stat) over the run and the share of it the samples hold. Processes that were running
before the run began count only from then on. Another session on the same cores is counted too:
the kinds say whose processes they were.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")
PERIOD_SECONDS = 1.0
SHOWN = 15
# Engines and their helpers: the subcommand says what they did (a build, a push, a service).
ENGINES = ("podman", "buildah", "docker")
SUBCOMMANDS = ("system", "service", "build", "push", "pull", "run", "start", "create", "cp", "rm", "rmi", "commit",
               "tag", "save", "load", "exec", "stop", "kill", "cleanup", "network", "volume", "images", "inspect")


def kind_of(argv: list[str]) -> str:
    """A command line -> the kind it is counted as: `python -m MODULE`, `python SCRIPT` (its last
    two path parts), `python -c` (its first line), `podman build`, or the program's name."""
    if not argv:
        return "kernel threads"
    program = os.path.basename(argv[0])
    if program.startswith("python"):
        words = argv[1:]
        for index, word in enumerate(words):
            if word == "-m" and index + 1 < len(words):
                module = words[index + 1]
                return "python -m pytest" if module in ("pytest", "xdist") else f"python -m {module}"
            if word == "-c" and index + 1 < len(words):
                first = words[index + 1].strip().splitlines()[0] if words[index + 1].strip() else ""
                if first.startswith("import sys;exec(eval(sys.stdin"):
                    return "python -m pytest"  # an xdist worker, as execnet starts it
                return f"python -c {first[:50]}"
            if word.startswith("-"):
                continue
            return "python " + "/".join(Path(word).parts[-2:])
        return "python"
    if program in ENGINES:
        said = [word for word in argv[1:] if word in SUBCOMMANDS]
        return " ".join([program, *said[:2]])
    return program


def read_snapshot(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """pid -> (start time, CPU ticks used so far), for every process /proc lists now."""
    found = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            stat = (proc / entry / "stat").read_text()
            # The command name, in parentheses, may hold spaces: the fields after it are fixed.
            fields = stat[stat.rfind(")") + 2:].split()
            found[int(entry)] = (int(fields[19]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


def read_argv(proc: Path, pid: int) -> list[str] | None:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def busy_ticks(proc: Path = PROC) -> tuple[int, int]:
    """(busy, all) CPU ticks of the machine since boot, from /proc/stat's first line."""
    # user nice system idle iowait irq softirq steal; guest time is in user's already.
    values = [int(value) for value in (proc / "stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle and iowait
    return sum(values) - idle, sum(values)


def available(proc: Path = PROC) -> bool:
    """Whether this machine has a /proc to sample (Linux; not macOS)."""
    return (proc / "stat").is_file()


class Tally:
    """CPU ticks by kind, from successive snapshots. The first snapshot is the baseline: what ran
    before it is not counted."""

    def __init__(self, proc: Path = PROC):
        self.proc = proc
        self.ticks: dict[str, int] = {}
        self.processes: dict[str, int] = {}  # kind -> how many of its processes used CPU while sampled
        self.counted: set[tuple[int, int]] = set()  # (pid, start time) of each one counted
        self.known: dict[int, tuple[int, int, str]] = {}  # pid -> (start time, ticks, kind)
        self.baseline = True

    def add(self, snapshot: dict[int, tuple[int, int]]) -> None:
        seen = {}
        for pid, (start, ticks) in snapshot.items():
            before = self.known.get(pid)
            if before is not None and before[0] == start:
                kind, used = before[2], ticks - before[1]
            else:  # new, or its pid reused by a new process
                argv = read_argv(self.proc, pid)
                kind, used = (kind_of(argv) if argv is not None else "unknown"), ticks
            if used > 0 and not self.baseline:
                self.ticks[kind] = self.ticks.get(kind, 0) + used
                if (pid, start) not in self.counted:
                    self.counted.add((pid, start))
                    self.processes[kind] = self.processes.get(kind, 0) + 1
            seen[pid] = (start, ticks, kind)
        self.known = seen
        self.baseline = False


class Sampler:
    """The thread: samples until stopped; `lines()` is the summary."""

    def __init__(self, proc: Path = PROC, period: float = PERIOD_SECONDS):
        self.proc, self.period = proc, period
        self.tally = Tally(proc)
        self.hertz = os.sysconf("SC_CLK_TCK")
        self.cores = os.cpu_count() or 1
        self.stop_event = threading.Event()
        self.busy_start = busy_ticks(proc)
        self.busy_end = self.busy_start
        self.thread = threading.Thread(target=self._run, name="cpu-use", daemon=True)

    def start(self) -> "Sampler":
        self.tally.add(read_snapshot(self.proc))
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop_event.wait(self.period):
            self.tally.add(read_snapshot(self.proc))

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()
        self.tally.add(read_snapshot(self.proc))
        self.busy_end = busy_ticks(self.proc)

    def lines(self) -> list[str]:
        return summary(self.tally.ticks, self.hertz, self.busy_start, self.busy_end, self.cores, self.tally.processes)


def summary(ticks: dict[str, int], hertz: int, busy_start: tuple[int, int], busy_end: tuple[int, int],
            cores: int, processes: dict[str, int] | None = None) -> list[str]:
    """The kinds that used the most CPU, each in CPU minutes and as a share of what was sampled,
    with how many processes of it ran and what each used on average (`processes`: whether a kind
    costs by its count or by each one), then the machine's busy time and how much of it the
    samples hold."""
    sampled = sum(ticks.values())
    lines = []
    for kind, used in sorted(ticks.items(), key=lambda entry: -entry[1])[:SHOWN]:
        count = (processes or {}).get(kind)
        each = f"  ({count} processes, {used / hertz / count:.1f} CPU s each)" if count else ""
        lines.append(f"{used / hertz / 60:8.1f} CPU-min  {used / max(sampled, 1):4.0%}  {kind}{each}")
    rest = sorted(ticks.values(), reverse=True)[SHOWN:]
    if rest:
        lines.append(f"{sum(rest) / hertz / 60:8.1f} CPU-min  {sum(rest) / max(sampled, 1):4.0%}  "
                     f"{len(rest)} other kinds")
    # /proc/stat counts in USER_HZ summed over the cores.
    busy, total = busy_end[0] - busy_start[0], busy_end[1] - busy_start[1]
    lines.append(f"sampled {sampled / hertz / 60:.1f} CPU-min; the machine was busy {busy / hertz / 60:.1f} CPU-min "
                 f"of {total / hertz / 60:.1f} ({busy / max(total, 1):.0%} of {cores} cores), so the samples hold "
                 f"{sampled / max(busy, 1):.0%} of it (a process that lived under {PERIOD_SECONDS:g} s between two "
                 "samples is not seen)")
    return lines
