"""How the tests share the cores: pytest-xdist's workers (scripts/test.sh runs one more than the
cores, `--dist loadscope`), what goes to one worker, in what order, and what is made once for the whole run.
tests/conftest.py registers it; its docstring says how a test joins.

Work units. UnitScheduling, xdist's loadscope scheduler with our units for scopes, sends each unit
whole to one worker. (xdist's own loadgroup would group by the `xdist_group` mark, but under pytest 9
it cannot: it renames `item._nodeid`, which pytest 9's `nodeid` no longer reads, and every test
becomes a unit of its own. So the workers write each test's unit into the run's folder as they
collect, UNITS, and the controller's scheduler reads it.)
- a test marked `@pytest.mark.xdist_group("NAME")` is in the unit NAME, with every test of that mark;
- the container tier is one unit, ENGINE: its tests share one engine, one image store and the tags
  `localhost/IMAGE:test`, and each rehearsal asserts that nothing of any rehearsal is left on the
  machine (tests/containers.py's leftovers), so they run one after another. A container module
  marked `pytestmark = pytest.mark.no_rehearsal` (it runs no rehearsal, retags no shared image and
  checks nothing of the machine that another test's containers change) leaves that unit: its tests
  follow the integration tier's rule below, beside the rehearsals;
- a unit module is one unit (its tests take milliseconds; its module fixtures are built once);
- an integration or gpu test that uses a fixture of its module (scope "module": a training run
  that several tests read) is in its module's unit, so that fixture runs once; any other such test
  is a unit of its own and may run beside its module's others.

Order: in a worker, units are sorted longest first by the durations recorded in
tests/durations.json (tests/timings.py), so the run ends on short units instead of one worker
finishing a long one while the other waits.

The machine: a test marked `@pytest.mark.quiet` measures something that other work on the cores
would move; it runs only when no other test of this run is running (an exclusive lock, taken before
any new test of another worker may start), and every other test holds the lock shared.

Made once per run (`once`): the first worker to ask makes the value under a file lock in the run's
shared directory; the others wait for it and read it. The value is JSON (an image name, a folder's
path and what the run printed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Iterator

import pytest
from xdist.scheduler import LoadScopeScheduling

ENGINE = "engine"
NO_REHEARSAL = "no_rehearsal"
GROUP = "xdist_group"
# The unit scope of fixtures that tie a module's tests to one worker.
SHARED_SCOPES = ("module", "class", "package")
# Seconds assumed for a test tests/durations.json does not list yet, by tier (the budget test,
# tests/unit/test_suite_budget.py, asks for a recorded figure for every integration and container test).
UNRECORDED_SECONDS = {"unit": 0.5, "integration": 60.0, "container": 60.0, "gpu": 60.0}


def tier_of(nodeid: str) -> str:
    """`tests/integration/test_x.py::test_y[z]` -> integration."""
    return Path(nodeid.split("::")[0]).parent.name


def plain_id(nodeid: str) -> str:
    """The node id without the `@group` suffix that xdist's loadgroup adds."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[0]
    return nodeid


def in_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def run_root(config: pytest.Config) -> Path:
    """The folder every worker of this run shares: pytest's base temp, which xdist's workers each
    get a folder inside."""
    base = config._tmp_path_factory.getbasetemp()  # noqa: SLF001 (xdist's own way to it)
    return base.parent if in_worker(config) else base


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in item.fixturenames:
        definitions = info.name2fixturedefs.get(name) or ()
        if definitions and definitions[-1].scope in SHARED_SCOPES:
            return True
    return False


def unit_of(item: pytest.Item) -> str | None:
    """The work unit the item belongs to; None: a unit of its own."""
    marked = item.get_closest_marker(GROUP)
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    tier = tier_of(item.nodeid)
    if tier == "container" and item.get_closest_marker(NO_REHEARSAL) is None:
        return ENGINE
    module = item.nodeid.split("::")[0]
    if tier == "unit" or _uses_module_fixture(item):
        return module
    return None


def longest_first(items: list[pytest.Item], seconds: Callable[[pytest.Item], float]) -> list[pytest.Item]:
    """The items regrouped by work unit, the units longest first; within a unit, collection order.
    Ties keep the order in which units first appear."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item) or item.nodeid, []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(seconds(item) for item in unit))
    return [item for unit in ordered for item in unit]


UNITS = "units.json"


class Scheduler:
    """The plugin: units, order, the scheduler, the machine lock. Registered by tests/conftest.py."""

    def __init__(self, durations: dict[str, float], keep: Callable[[str], bool] | None = None):
        self.durations = durations
        self.keep = keep  # --quick: which node ids to run

    def seconds(self, item: pytest.Item) -> float:
        nodeid = plain_id(item.nodeid)
        return self.durations.get(nodeid, UNRECORDED_SECONDS.get(tier_of(nodeid), 0.0))

    # tryfirst: the group marks must be on the items before xdist's own hook reads them.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.keep is not None:
            left_out = [item for item in items if not self.keep(plain_id(item.nodeid))]
            if left_out:
                config.hook.pytest_deselected(items=left_out)
                items[:] = [item for item in items if self.keep(plain_id(item.nodeid))]
        for item in items:
            if item.get_closest_marker(GROUP) is None:
                unit = unit_of(item)
                if unit is not None:
                    item.add_marker(pytest.mark.xdist_group(unit))
        if in_worker(config):  # what xdist hands out, in this order (the controller collects nothing)
            items[:] = longest_first(items, self.seconds)
            units = {plain_id(item.nodeid): unit_of(item) or plain_id(item.nodeid) for item in items}
            path = run_root(config) / UNITS
            staged = path.with_name(f".{UNITS}.{os.getpid()}")
            staged.write_text(json.dumps(units))
            staged.replace(path)  # every worker writes the same: whole, whichever is last

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        return UnitScheduling(config, log)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        if not in_worker(item.config):
            yield
            return
        with machine_share(run_root(item.config), exclusive=item.get_closest_marker("quiet") is not None):
            yield


class UnitScheduling(LoadScopeScheduling):
    """xdist's loadscope scheduling, whose scopes are our work units: each one whole to a worker, in
    the order the workers collected them (longest first), never reordered by size."""

    def __init__(self, config: pytest.Config, log=None):
        config.option.loadscopereorder = False
        super().__init__(config, log)
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:  # written by the workers before they reported their collection
            self._units = json.loads((run_root(self.config) / UNITS).read_text())
        return self._units.get(plain_id(nodeid), nodeid)


@contextlib.contextmanager
def machine_share(root: Path, exclusive: bool) -> Iterator[None]:
    """Holds the run's machine lock, shared or (for a quiet test) exclusive. A writer first takes
    the turnstile, which every reader passes through before it takes its share: once a quiet test
    waits, no new test starts beside it, and it gets the machine as soon as the running ones end."""
    with open(root / "turnstile.lock", "a") as turnstile, open(root / "machine.lock", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing), across processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_name(key: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-")[:60]
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def once(root: Path, key: str, make: Callable[[], object]) -> object:
    """make()'s value, made once per run whatever the number of workers. The first caller makes it
    while holding the key's lock; the others wait for the lock and read what it wrote. A make() that
    raises writes nothing: the next caller tries again (and reports its own error)."""
    folder = root / "once"
    folder.mkdir(exist_ok=True)
    name = _file_name(key)
    made = folder / f"{name}.json"
    with locked(folder / f"{name}.lock"):
        if made.exists():
            return json.loads(made.read_text())["value"]
        value = make()
        staged = folder / f".{name}.{os.getpid()}"
        staged.write_text(json.dumps({"key": key, "value": value}))
        staged.replace(made)
        return value
