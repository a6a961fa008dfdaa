"""trainer.runtime.heap: TensorFlow's import with the garbage collector paused, then frozen. Here on
a module of the test's own (importing TensorFlow would start nothing, but takes seconds: the
integration tier's every task imports it this way, and benchmarks/task_startup.py --baseline
collector measures what it saves)."""

from __future__ import annotations

import gc
import sys

import pytest

from trainer.runtime import heap

pytestmark = pytest.mark.unit

# A module that records whether the collector ran while it was imported, and leaves a cycle.
MODULE = """
import gc
ENABLED_DURING_IMPORT = gc.isenabled()
class Node:
    pass
CYCLE = Node()
CYCLE.self = CYCLE
"""


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    was_enabled = gc.isenabled()
    yield tmp_path
    gc.unfreeze()
    (gc.enable if was_enabled else gc.disable)()
    for name in [name for name in sys.modules if name.startswith("heap_case_")]:
        del sys.modules[name]


def test_the_import_runs_with_the_collector_paused_and_what_it_made_is_frozen(module_dir):
    (module_dir / "heap_case_a.py").write_text(MODULE)
    gc.enable()
    frozen_before = gc.get_freeze_count()
    heap.import_frozen("heap_case_a")
    module = sys.modules["heap_case_a"]
    assert module.ENABLED_DURING_IMPORT is False
    assert gc.isenabled()
    assert gc.get_freeze_count() > frozen_before
    # The module's objects are out of the collector's generations, where gc.is_tracked still holds.
    assert not any(obj is module.CYCLE for generation in range(3) for obj in gc.get_objects(generation))


def test_a_collector_paused_before_stays_paused(module_dir):
    (module_dir / "heap_case_b.py").write_text(MODULE)
    gc.disable()
    heap.import_frozen("heap_case_b")
    assert sys.modules["heap_case_b"].ENABLED_DURING_IMPORT is False
    assert not gc.isenabled()


def test_a_failed_import_raises_and_gives_the_collector_back(module_dir):
    (module_dir / "heap_case_c.py").write_text("raise ImportError('heap_case_c: broken on purpose')\n")
    gc.enable()
    with pytest.raises(ImportError, match="broken on purpose"):
        heap.import_frozen("heap_case_c")
    assert gc.isenabled()


def test_objects_made_after_the_freeze_are_collected_as_ever(module_dir):
    (module_dir / "heap_case_d.py").write_text(MODULE)
    gc.enable()
    heap.import_frozen("heap_case_d")

    class Later:
        pass

    later = Later()
    later.self = later
    del later
    assert gc.collect() >= 1
