"""trainer.run's exit hook (trainer/process/exit_hook/sitecustomize.py), executed in this process
the way Python's `site` runs a sitecustomize as an interpreter starts: it registers the orderly
end (trainer.library.ending.at_exit) and notes a traceback, then runs the sitecustomize it hides;
in a process that runs no multi-worker strategy, its end does nothing."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from trainer.library import ending
from trainer.process import command

pytestmark = pytest.mark.unit

HOOK = Path(command.EXIT_HOOK) / "sitecustomize.py"
# A sitecustomize of a distribution or a virtualenv: it leaves a file beside itself when it runs.
HIDDEN = "import os\nopen(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ran'), 'w').close()\n"


@pytest.fixture
def fresh(monkeypatch):
    """atexit and sys.excepthook caught for the test, and the end's state as at a process start."""
    registered = []
    monkeypatch.setattr(atexit, "register", lambda function, *args, **kwargs: registered.append(function) or function)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(ending, "_state", {"ended": False, "failed": False})
    return registered


def start_interpreter(monkeypatch, *path: Path) -> None:
    """Runs the hook as `site` does, first on a sys.path of the hook's folder and then `path`."""
    monkeypatch.setattr(sys, "path", [command.EXIT_HOOK, *map(str, path)])
    spec = importlib.util.spec_from_file_location("sitecustomize", HOOK)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_hook_registers_the_orderly_end_then_runs_the_sitecustomize_it_hides(fresh, monkeypatch, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDDEN)
    start_interpreter(monkeypatch, tmp_path)
    assert fresh.count(ending.at_exit) == 1
    assert (tmp_path / "ran").exists()


def test_only_the_first_sitecustomize_after_the_hook_runs(fresh, monkeypatch, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "sitecustomize.py").write_text(HIDDEN)
    start_interpreter(monkeypatch, tmp_path / "empty", first, second)
    assert (first / "ran").exists() and not (second / "ran").exists()


def test_with_no_other_sitecustomize_the_hook_alone_runs(fresh, monkeypatch, tmp_path):
    start_interpreter(monkeypatch, tmp_path)
    assert fresh.count(ending.at_exit) == 1 and list(tmp_path.iterdir()) == []


def test_a_traceback_is_noted_and_still_printed_by_the_hook_it_wraps(fresh, monkeypatch, tmp_path):
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: printed.append(args))
    start_interpreter(monkeypatch, tmp_path)
    error = ValueError("the script's own")
    sys.excepthook(ValueError, error, None)
    assert ending._state["failed"] and printed == [(ValueError, error, None)]


def test_without_the_runtime_the_hook_still_runs_the_one_it_hides(fresh, monkeypatch, tmp_path):
    """A Python process that cannot import trainer (another interpreter the command starts)."""
    import trainer.library

    monkeypatch.setitem(sys.modules, "trainer.library.ending", None)  # its import raises ImportError
    monkeypatch.delattr(trainer.library, "ending")
    (tmp_path / "sitecustomize.py").write_text(HIDDEN)
    start_interpreter(monkeypatch, tmp_path)
    assert ending.at_exit not in fresh and (tmp_path / "ran").exists()


@pytest.mark.parametrize("tf_config", [None, {"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                                              "task": {"type": "worker", "index": 0}}],
                         ids=["one process", "a cluster but no multi-worker strategy ran"])
def test_in_a_process_that_ran_no_multi_worker_strategy_the_end_does_nothing(fresh, monkeypatch, tmp_path, tf_config):
    def meet(*args):
        raise AssertionError("met at the barrier in a process with no coordination service")

    monkeypatch.setattr(ending, "_meet", meet)
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    start_interpreter(monkeypatch, tmp_path)
    # What the interpreter calls as it exits; this test process never started a coordination
    # service, whether TensorFlow is imported in it or not.
    for function in fresh:
        function()
    assert os.environ.get("TF_CONFIG") == (tf_config and json.dumps(tf_config))
