"""Where a run's time went, and the durations each test is known to take.

At the end of every run (and so in CI's log): each tier's tests, their summed time and when the
tier ran within the run (with several workers the tiers overlap), the 25 slowest tests (setup, call
and teardown together: a session or module fixture counts against the test that first asked for
it), the 25 tests that used the most CPU and each tier's and file's CPU (tests/cpu_per_test.py), the
20 slowest files, the figures tests measured but do not assert on (helpers.BUDGETS), and which
kinds of process used the CPU meanwhile (tests/cpu_use.py: the figure that says what to cut
when the cores are busy, which the tests' own times cannot say).

tests/durations.json holds each test's recorded seconds, in pytest-split's format (a JSON object,
node id -> seconds, sorted). The workers order their units by it (tests/parallel.py), `--quick`
picks its tests from it, and tests/unit/test_suite_budget.py holds each tier's sum to a budget and
asks for a figure for every integration and container test. `--record-durations PATH` writes this
run's figures into PATH, keeping the entries of tests the run did not run:

    .venv/bin/python -m pytest tests/integration/test_new.py --record-durations tests/durations.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import cpu_use
from parallel import in_worker, plain_id, tier_of

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "durations.json"
TIERS = ("unit", "integration", "container", "gpu")
SLOWEST = 25
# --quick: the unit tier and every integration test recorded at or under this many seconds; no
# container or gpu test (a container test from nothing waits minutes for its image).
QUICK_TEST_SECONDS = 2.5


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {nodeid: float(seconds) for nodeid, seconds in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def in_quick(nodeid: str, durations: dict[str, float]) -> bool:
    tier = tier_of(nodeid)
    if tier == "unit":
        return True
    return tier == "integration" and durations.get(nodeid, float("inf")) <= QUICK_TEST_SECONDS


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class Timings:
    """The plugin (in the controller, or the one process of a run without workers)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.started = time.time()
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}  # tests/cpu_per_test.py
        self.spans: dict[str, tuple[float, float]] = {}  # tier -> (first start, last stop)
        self.figures: list[str] = []  # helpers.BUDGETS of every worker
        self.cpu = cpu_use.Sampler().start() if cpu_use.available() else None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_id(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration
        self.cpu_seconds[nodeid] = self.cpu_seconds.get(nodeid, 0.0) + (getattr(report, "cpu_seconds", 0.0) or 0.0)
        tier = tier_of(nodeid)
        start, stop = getattr(report, "start", 0.0) or 0.0, getattr(report, "stop", 0.0) or 0.0
        if start and stop:
            first, last = self.spans.get(tier, (start, stop))
            self.spans[tier] = (min(first, start), max(last, stop))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # xdist: a worker's figures, sent as it ends
        self.figures += getattr(node, "workeroutput", {}).get("budgets", [])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("record_durations")
        if path and self.seconds:
            kept = recorded(Path(path))
            kept.update({nodeid: round(seconds, 3) for nodeid, seconds in self.seconds.items()})
            Path(path).write_text(json.dumps(dict(sorted(kept.items())), indent=4) + "\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        from helpers import BUDGETS

        write = terminalreporter.write_line
        if self.seconds:
            terminalreporter.section("time by tier")
            for tier in TIERS:
                tests = {n: s for n, s in self.seconds.items() if tier_of(n) == tier}
                if not tests:
                    continue
                cpu = sum(self.cpu_seconds.get(n, 0.0) for n in tests)
                line = (f"{tier:12} {len(tests):5} tests  {minutes(sum(tests.values())):>9} of test time"
                        f"  {cpu / 60:5.1f} CPU-min")
                if tier in self.spans:
                    first, last = self.spans[tier]
                    line += f"  ran from {minutes(first - self.started)} to {minutes(last - self.started)} of the run"
                write(line)
            write(f"{'whole run':12} {len(self.seconds):5} tests  {minutes(sum(self.seconds.values())):>9} of test time"
                  f"  {sum(self.cpu_seconds.values()) / 60:5.1f} CPU-min"
                  f"  {minutes(time.time() - self.started)} from start to this line")
            terminalreporter.section(f"{SLOWEST} slowest tests (setup + call + teardown)")
            for nodeid, seconds in sorted(self.seconds.items(), key=lambda entry: -entry[1])[:SLOWEST]:
                write(f"{seconds:8.1f} s  {nodeid}")
            terminalreporter.section(f"{SLOWEST} tests that used the most CPU (tests/cpu_per_test.py)")
            for nodeid, seconds in sorted(self.cpu_seconds.items(), key=lambda entry: -entry[1])[:SLOWEST]:
                write(f"{seconds / 60:8.2f} CPU-min  {nodeid}")
            files: dict[str, tuple[float, float]] = {}
            for nodeid, seconds in self.seconds.items():
                path = nodeid.split("::")[0]
                so_far, cpu = files.get(path, (0.0, 0.0))
                files[path] = (so_far + seconds, cpu + self.cpu_seconds.get(nodeid, 0.0))
            terminalreporter.section("20 slowest files")
            for path, (seconds, cpu) in sorted(files.items(), key=lambda entry: -entry[1][0])[:20]:
                write(f"{seconds:8.1f} s  {cpu / 60:6.2f} CPU-min  {path}")
        figures = self.figures + list(BUDGETS)
        if figures:
            terminalreporter.section("budgets")
            for line in figures:
                write(line)
        if self.cpu is not None:
            self.cpu.stop()
            terminalreporter.section("CPU by kind of process (tests/cpu_use.py)")
            for line in self.cpu.lines():
                write(line)


def worker_finished(config: pytest.Config) -> None:
    """In a worker: hands its measured figures to the controller (xdist's workeroutput)."""
    from helpers import BUDGETS

    if in_worker(config):
        config.workeroutput["budgets"] = list(BUDGETS)
