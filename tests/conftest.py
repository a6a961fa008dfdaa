"""Tiers live in folders (unit/, integration/, container/, gpu/); each folder's tests carry the
marker of the same name, so `pytest -m unit` runs only the fast ones."""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # the trainer package, and helpers.py


def pytest_collection_modifyitems(items):
    for item in items:
        tier = Path(item.fspath).parent.name
        if tier in ("unit", "integration", "container", "gpu"):
            item.add_marker(getattr(pytest.mark, tier))


def pytest_terminal_summary(terminalreporter):
    from helpers import BUDGETS

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
