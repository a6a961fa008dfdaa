"""The suite's tiers, its timeouts, how its tests share the machine, and what it reports.

Tiers live in folders (unit/, integration/, container/, gpu/); each folder's tests carry the marker
of the same name, so `pytest -m unit` runs only the fast ones. `--quick` runs what a developer
runs before a commit: the unit tier and the integration tests recorded at 2.5 s or less
(tests/timings.py), no container test.

scripts/test.sh runs the tests on every core (pytest-xdist, one worker more than the cores, `--dist loadscope`;
tests/parallel.py says how). For a new test:
- Nothing to do when it owns what it uses (its own tmp_path, ports from the kernel, its own
  processes). An integration test that reads a module-scoped fixture (a training run several tests
  check) is kept on one worker with the module's other such tests, so that training runs once.
  The container tier runs on one worker, one test after another (tests/parallel.py, ENGINE).
- Tests that must not run at the same time as each other: the same
  `@pytest.mark.xdist_group("NAME")` puts them on one worker, one after another.
- A test that measures time, or whatever else other work on the cores would move, and asserts on
  it: `@pytest.mark.quiet`, and no other test of the run runs beside it. (Better still, assert on
  something noise cannot move.)
- Something that costs minutes and several modules need (an image, a trained model, generated
  data): make it in a session fixture through `once`, which makes it once per run, not once per
  worker, e.g. `once("image tf-runtime-cpu", lambda: built("tf-runtime-cpu", base_image))`
  (tests/container/conftest.py), `small_export` below. Its value must be JSON (a name, a path).
- Record its duration in tests/durations.json (tests/timings.py says how); the unit tier's budget
  test fails until every integration and container test has one.
"""

import os
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # the trainer package, and helpers.py

import cpu_per_test  # noqa: E402
import parallel  # noqa: E402
import timings  # noqa: E402

# Seconds one test's own call may take before pytest-timeout fails it (the default, pyproject.toml's
# `timeout`, covers the unit tier, fixtures included). Each is above the longest single wait the tier's
# tests give a subprocess (tests/unit/test_timeouts.py checks it), so those report first, and covers a
# test that makes several: integration runs up to three 600 s jobs in one test (test_learning.py),
# container rebuilds an image for up to 1800 s (test_images.py), gpu waits up to 3600 s for an H100's
# first step. func_only: the session fixtures that build images (up to 3000 s for the GPU image,
# tests/container/conftest.py) run under their own subprocess timeouts, not the first test's.
TIER_TIMEOUTS = {"integration": 2400, "container": 3600, "gpu": 5400}


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="only what a developer runs before a commit: the unit tier and the integration tests "
                          f"tests/durations.json records at {timings.QUICK_TEST_SECONDS:g} s or less")
    parser.addoption("--record-durations", metavar="PATH",
                     help="write each test's seconds into PATH (pytest-split's format; tests/timings.py)")


def pytest_configure(config):
    # The ISO week images.sh builds with, fixed for the run before xdist starts its workers (which
    # inherit it), as scripts/test.sh fixes it: a run past Monday 00:00 UTC builds on one week.
    os.environ.setdefault("OS_UPDATES", time.strftime("%G-W%V", time.gmtime()))
    durations = timings.recorded()
    quick = (lambda nodeid: timings.in_quick(nodeid, durations)) if config.getoption("quick") else None
    config.pluginmanager.register(parallel.Scheduler(durations, quick), "suite-scheduler")
    config.pluginmanager.register(cpu_per_test.Meter(), "suite-cpu-per-test")
    if not parallel.in_worker(config):
        config.pluginmanager.register(timings.Timings(config), "suite-timings")


def pytest_collection_modifyitems(items):
    for item in items:
        tier = Path(item.fspath).parent.name
        if tier in ("unit", "integration", "container", "gpu"):
            item.add_marker(getattr(pytest.mark, tier))
        if tier in TIER_TIMEOUTS and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUTS[tier], func_only=True))


def pytest_sessionfinish(session):
    timings.worker_finished(session.config)


@pytest.fixture(scope="session")
def once(tmp_path_factory, request):
    """once(key, make): make()'s value (JSON), made by one worker for the whole run (tests/parallel.py)."""
    root = parallel.run_root(request.config)
    return lambda key, make: parallel.once(root, key, make)


@pytest.fixture(scope="session")
def small_export(once, request):
    """A tiny cassava export (the small architecture at 48 px, one epoch of 2 steps on synthetic:32,
    one process), trained once per run for the tests that only serve an export: the prediction
    server's (tests/integration/test_prediction_server.py) and the prediction image's
    (tests/container/test_serving_image.py). They read it and change nothing in it."""
    from helpers import FLOAT32, run_module

    def make() -> str:
        root = parallel.run_root(request.config) / "small-export"
        result = run_module("cassava.task", "--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2",
                            "--image-size", "48", "--architecture", "small", "--weights", "none",
                            "--per-replica-batch-size", "4", *FLOAT32, "--data-dir", str(root / "data"),
                            "--model-dir", str(root / "model"))
        assert result.returncode == 0, result.stderr[-3000:]
        return str(root / "model")

    return Path(once("small cassava export", make))


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The local Cloud Storage server (scripts/rehearsal/local_gcs/), one per worker; every test makes
    buckets of its own."""
    from scripts.rehearsal.local_gcs import LocalGCS

    with LocalGCS(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gcs(gcs_server):
    """The server, with the faults and latency a test injected cleared after it."""
    yield gcs_server
    gcs_server.clear_faults()
