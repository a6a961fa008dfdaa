"""Every test runs under a pytest-timeout, and each tier's is above the longest single wait its tests
give a subprocess, so a hung test fails with its stack and a slow one is never cut short by the guard.
The unit tier starts no process at all, as its marker says (pyproject.toml): a command's main runs
in the test's own process (tests/helpers.py's run_main); what needs a process is integration."""

import ast
import re
import tomllib

import pytest

from helpers import REPO


def top_conftest():
    """tests/conftest.py itself: in a whole run the module named `conftest` may be a tier's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tests_top_conftest", REPO / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CONFTEST = top_conftest()
TIER_TIMEOUTS, pytest_collection_modifyitems = _CONFTEST.TIER_TIMEOUTS, _CONFTEST.pytest_collection_modifyitems

TESTS = REPO / "tests"
# Code a tier's tests call, besides their own folder (conftest.py is left out: fixtures run outside
# the func_only timeout of the slower tiers).
SHARED = {"unit": [], "integration": ["helpers.py"], "container": ["helpers.py", "containers.py"], "gpu": ["helpers.py"]}
WAIT = re.compile(r"\btimeout(?:\s*:\s*(?:float|int))?\s*=\s*(\d+)")


# Unit tests that still start a process (the stand-in base's shell), named so the list stays true.
# test_suite_budget.py asks pytest itself which tests there are (`--collect-only`).
STARTS_PROCESSES = {"test_standin_base.py", "test_suite_budget.py"}
PROCESS_CALLS = {("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "call"), ("subprocess", "check_call"),
                 ("subprocess", "check_output"), ("os", "fork"), ("os", "system"), ("os", "spawnv"),
                 ("multiprocessing", "Process")}
PROCESS_HELPERS = {"run_module", "launch_until"}  # tests/helpers.py's runners of processes


def started_processes(path) -> list[int]:
    """Lines of `path` that start a process: a subprocess or os call, or a helper that does."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name) and \
                (called.value.id, called.attr) in PROCESS_CALLS:
            lines.append(node.lineno)
        elif isinstance(called, ast.Name) and called.id in PROCESS_HELPERS:
            lines.append(node.lineno)
    return lines


def longest_wait(tier: str) -> int:
    files = [f for f in (TESTS / tier).glob("*.py") if f.name != "conftest.py"] + [TESTS / name for name in SHARED[tier]]
    waits = [int(n) for f in files for n in WAIT.findall(f.read_text())]
    assert waits or tier == "unit", f"no subprocess timeout found for the {tier} tier: this check reads nothing"
    return max(waits, default=0)


def test_the_unit_tier_starts_no_process():
    starting = {path.name: started_processes(path) for path in sorted((TESTS / "unit").glob("test_*.py"))}
    assert {name: lines for name, lines in starting.items() if lines and name not in STARTS_PROCESSES} == {}
    assert {name for name, lines in starting.items() if lines} == STARTS_PROCESSES  # the list stays true


def test_the_check_sees_a_process_started(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os, subprocess\nsubprocess.run(['true'])\nrun_module('x')\nos.getpid()\nrun_main(print)\n")
    assert started_processes(probe) == [2, 3]


def default_timeout() -> float:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "timeout" in options, "pyproject.toml sets no default pytest timeout"
    return float(options["timeout"])


def test_the_unit_tiers_default_timeout_outlasts_its_longest_wait():
    assert default_timeout() > longest_wait("unit")


def test_each_slow_tiers_timeout_outlasts_its_longest_wait():
    for tier in ("integration", "container", "gpu"):
        assert TIER_TIMEOUTS[tier] > longest_wait(tier), f"{tier}: {TIER_TIMEOUTS[tier]} s"


def test_the_slow_tiers_get_their_timeout_on_the_test_call_only():
    class Item:
        def __init__(self, path):
            self.fspath, self.markers = path, []

        def add_marker(self, marker):
            self.markers.append(marker.mark if hasattr(marker, "mark") else marker)

        def get_closest_marker(self, name):
            return next((m for m in self.markers if m.name == name), None)

    items = {tier: Item(str(TESTS / tier / "test_x.py")) for tier in ("unit", "integration", "container", "gpu")}
    pinned = Item(str(TESTS / "container" / "test_y.py"))
    pinned.add_marker(pytest.mark.timeout(10))
    pytest_collection_modifyitems([*items.values(), pinned])
    assert items["unit"].get_closest_marker("timeout") is None  # the ini default applies
    for tier, seconds in TIER_TIMEOUTS.items():
        marker = items[tier].get_closest_marker("timeout")
        assert marker.args == (seconds,) and marker.kwargs == {"func_only": True}, tier
    assert [m.args for m in pinned.markers if m.name == "timeout"] == [(10,)]  # a test's own marker wins
