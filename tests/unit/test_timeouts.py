"""Every test runs under a pytest-timeout, and each tier's is above the longest single wait its tests
give a subprocess, so a hung test fails with its stack and a slow one is never cut short by the guard."""

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
WAIT = re.compile(r"\btimeout(?:\s*:\s*float)?\s*=\s*(\d+)")


def longest_wait(tier: str) -> int:
    files = [f for f in (TESTS / tier).glob("*.py") if f.name != "conftest.py"] + [TESTS / name for name in SHARED[tier]]
    waits = [int(n) for f in files for n in WAIT.findall(f.read_text())]
    assert waits, f"no subprocess timeout found for the {tier} tier: this check reads nothing"
    return max(waits)


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
