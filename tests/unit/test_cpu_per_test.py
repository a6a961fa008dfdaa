"""tests/cpu_per_test.py: each phase's report carries the CPU since the phase before it, and the
controller's summary (tests/timings.py) sums them per test, per file and per tier. No process is
started: the meter runs on a clock the test sets."""

from __future__ import annotations

import types

import cpu_per_test
import timings


def run_phases(meter: cpu_per_test.Meter, clock: list[float], spent: list[float]) -> list[float]:
    """One test's three phases through the meter's hooks, `spent` CPU seconds in each."""
    meter.pytest_runtest_logstart("tests/unit/test_x.py::test_y", ("x", 1, "y"))
    measured = []
    for seconds in spent:
        clock[0] += seconds
        hook = meter.pytest_runtest_makereport(item=None, call=None)
        next(hook)  # up to the report
        report = types.SimpleNamespace()
        try:
            hook.send(report)
        except StopIteration as stop:
            measured.append(stop.value.cpu_seconds)
    return measured


def test_each_phase_is_given_the_cpu_spent_since_the_one_before_it():
    clock = [100.0]
    meter = cpu_per_test.Meter(clock=lambda: clock[0])
    clock[0] += 7.0  # between two tests: nobody's
    assert run_phases(meter, clock, [1.5, 20.25, 0.5]) == [1.5, 20.25, 0.5]
    clock[0] += 3.0
    assert run_phases(meter, clock, [0.0, 2.0, 0.0]) == [0.0, 2.0, 0.0]


def test_the_clock_moves_with_this_processs_own_cpu():
    before = cpu_per_test.used()
    busy = sum(i * i for i in range(300_000))  # this process's own CPU
    assert busy > 0 and cpu_per_test.used() > before


def report(nodeid: str, when: str, duration: float, cpu: float | None):
    fields = dict(nodeid=nodeid, when=when, duration=duration, start=0.0, stop=0.0)
    if cpu is not None:
        fields["cpu_seconds"] = cpu
    return types.SimpleNamespace(**fields)


class Lines:
    def __init__(self):
        self.written: list[str] = []

    def write_line(self, line: str) -> None:
        self.written.append(line)

    def section(self, title: str) -> None:
        self.written.append(f"== {title}")


def test_the_summary_gives_each_tests_tiers_and_files_cpu_and_ranks_the_tests_by_it():
    config = types.SimpleNamespace(getoption=lambda name: None)
    plugin = timings.Timings.__new__(timings.Timings)
    plugin.config, plugin.started, plugin.cpu = config, 0.0, None
    plugin.seconds, plugin.cpu_seconds, plugin.spans, plugin.figures = {}, {}, {}, []
    phases = [("tests/integration/test_a.py::test_waits", 90.0, [0.5, 3.0, 0.5]),
              ("tests/integration/test_a.py::test_trains", 30.0, [60.0, 54.0, 6.0]),
              ("tests/unit/test_b.py::test_fast", 0.3, [None, 0.25, None])]  # a report without the figure counts 0
    for nodeid, seconds, cpus in phases:
        for when, cpu in zip(("setup", "call", "teardown"), cpus):
            plugin.pytest_runtest_logreport(report(nodeid, when, seconds / 3, cpu))
    lines = Lines()
    plugin.pytest_terminal_summary(lines)
    text = "\n".join(lines.written)
    ranked = text.split("tests that used the most CPU")[1].split("\n== ")[0].splitlines()[1:]
    assert [line.split()[-1] for line in ranked] == ["tests/integration/test_a.py::test_trains",
                                                     "tests/integration/test_a.py::test_waits",
                                                     "tests/unit/test_b.py::test_fast"]
    assert ranked[0].split()[:2] == ["2.00", "CPU-min"] and ranked[1].split()[0] == "0.07"
    tier = next(line for line in lines.written if line.startswith("integration"))
    assert "2.1 CPU-min" in tier, tier
    assert next(line for line in lines.written if line.startswith("whole run")).count("2.1 CPU-min") == 1
    files = text.split("20 slowest files")[1].splitlines()[1:3]
    assert files[0].split() == ["120.0", "s", "2.07", "CPU-min", "tests/integration/test_a.py"]
