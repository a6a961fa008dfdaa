"""The CPU each test used: its worker's own and that of every process the test started and waited
for (a training job's launcher, and through it its tasks; an image build's tools). What a container
runs is the engine's process, not the test's, and is left out: tests/cpu_use.py counts it by kind.

A test's time cannot say what it costs when the cores are shared: one that waits for the other
worker's jobs is slow and cheap. Its CPU can. Each report of a test's phase (setup, call,
teardown) carries the CPU seconds since the phase before it, `cpu_seconds`; xdist hands the report
to the controller, which sums them (tests/timings.py). A session or module fixture counts against
the test that first asked for it, as its time does.
"""

from __future__ import annotations

import resource
from typing import Callable

import pytest


def used() -> float:
    """CPU seconds of this process and of its children that have ended and been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Meter:
    """The plugin in the process that runs the tests."""

    def __init__(self, clock: Callable[[], float] = used):
        self.clock = clock
        self.mark: float | None = None

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.mark = self.clock()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        now = self.clock()
        report.cpu_seconds = round(max(0.0, now - (self.mark if self.mark is not None else now)), 3)
        self.mark = now
        return report
