"""Tiers live in folders (unit/, integration/, container/, gpu/); each folder's tests carry the
marker of the same name, so `pytest -m unit` runs only the fast ones."""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # the trainer package, and helpers.py


# Seconds one test's own call may take before pytest-timeout fails it (the default, pyproject.toml's
# `timeout`, covers the unit tier, fixtures included). Each is above the longest single wait the tier's
# tests give a subprocess (tests/unit/test_timeouts.py checks it), so those report first, and covers a
# test that makes several: integration runs up to three 600 s jobs in one test (test_learning.py),
# container rebuilds an image for up to 1800 s (test_images.py), gpu waits up to 3600 s for an H100's
# first step. func_only: the session fixtures that build images (up to 3000 s for the GPU image,
# tests/container/conftest.py) run under their own subprocess timeouts, not the first test's.
TIER_TIMEOUTS = {"integration": 2400, "container": 3600, "gpu": 5400}


def pytest_collection_modifyitems(items):
    for item in items:
        tier = Path(item.fspath).parent.name
        if tier in ("unit", "integration", "container", "gpu"):
            item.add_marker(getattr(pytest.mark, tier))
        if tier in TIER_TIMEOUTS and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUTS[tier], func_only=True))


# Seconds spent per test file (setup, call and teardown; a session fixture counts against the first
# file that asks for it), for the summary: where the whole run's time goes, against CI's 40-minute aim.
FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    from helpers import BUDGETS

    if FILE_SECONDS:
        terminalreporter.section("time by tier and file")
        tiers: dict[str, float] = {}
        for path, seconds in FILE_SECONDS.items():
            tier = Path(path).parent.name
            tiers[tier] = tiers.get(tier, 0.0) + seconds
        terminalreporter.write_line("  ".join(f"{tier} {seconds / 60:.1f} min" for tier, seconds in sorted(tiers.items())))
        for path, seconds in sorted(FILE_SECONDS.items(), key=lambda item: -item[1])[:20]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    if BUDGETS:
        terminalreporter.section("budgets")
        for line in BUDGETS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The local Cloud Storage server (scripts/rehearsal/local_gcs/), one for the whole session; every
    test makes buckets of its own."""
    from scripts.rehearsal.local_gcs import LocalGCS

    with LocalGCS(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gcs(gcs_server):
    """The server, with the faults and latency a test injected cleared after it."""
    yield gcs_server
    gcs_server.clear_faults()
