"""The end of a healthy multi-worker job logs no error in any task, whichever task leaves first
(trainer.library.ending). A task that stays 15 s after the last collective (a chief exporting a large
model, a worker slow to exit) makes TensorFlow's coordination service log an error in one of them
when each process just exits: the test shows that first, then that the orderly end logs none.
The runtime's own tasks end through `trainer.library.ending.end` (trainer.fit.run), a level-1 command's
Python processes through the exit hook trainer.run gives them; healthy runs of both are checked in
test_mwms.py, test_parameter_server.py, test_own_code_doc.py and test_level1_doc.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, clean_env, run_module
from quiet_end import errors_after_training

SCRIPT = REPO / "tests" / "fixtures" / "ending" / "linger.py"
# Longer than the coordination service takes to find a task gone (its 10 s heartbeat timeout) and
# a worker to find its leader gone (a failed heartbeat and its retry).
LINGER_SECONDS = "15"
ERRORS = {"chief": "The following tasks are unhealthy (stopped sending heartbeats)",
          "worker": "Failed to send RPC to coordination service"}


def run(lingering: str, end: str, *runner: str):
    result = run_module("trainer.launch", "--replicas", "2", "--timeout", "240", "--", *runner, "python", str(SCRIPT),
                        env=clean_env(LINGERING=lingering, LINGER=LINGER_SECONDS, END=end), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


@pytest.mark.parametrize("lingering", ["chief", "worker"])
def test_whichever_task_stays_the_orderly_end_logs_no_error(lingering):
    # Each process just exits: the task left behind logs the coordination service's error.
    plain = errors_after_training(run(lingering, "exit"))
    assert any(line.startswith(f"[{lingering}-0] E") and ERRORS[lingering] in line for line in plain), plain
    # A runtime task's end (trainer.fit.run calls trainer.library.ending.end): none.
    assert errors_after_training(run(lingering, "orderly")) == []
    # The same plain script as a level-1 command under trainer.run, whose exit hook orders its end: none.
    assert errors_after_training(run(lingering, "exit", "python", "-m", "trainer.run", "--")) == []


LEAVING = """
import atexit, logging, sys, threading, time
from trainer.library import ending
out = sys.argv[1]
atexit.register(lambda: open(out + "/atexit", "w").write("ran"))
def late():
    time.sleep(0.3)
    open(out + "/thread", "w").write("done")
threading.Thread(target=late).start()  # not a daemon: the interpreter would wait for it
import concurrent.futures
pool = concurrent.futures.ThreadPoolExecutor(2)  # idle workers, never shut down: the interpreter stops them
pool.submit(print, "pooled", file=sys.stderr).result()
logging.basicConfig(stream=sys.stderr, format="%(message)s")
logging.getLogger("trainer").warning("logged")
sys.stdout.write("buffered, no newline")
ending.leave(3)
open(out + "/after", "w").write("leave returned")
"""


def test_a_runtime_task_leaves_as_the_interpreter_would_but_for_its_teardown(tmp_path):
    """trainer.fit.run ends every runtime task's process with `leave` (os._exit, no teardown of
    TensorFlow's functions): what the interpreter's own exit would finish is finished first."""
    result = subprocess.run([sys.executable, "-c", LEAVING, str(tmp_path)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 3
    assert result.stdout == "buffered, no newline" and result.stderr.split() == ["pooled", "logged"]
    assert (tmp_path / "thread").read_text() == "done"  # joined before the end
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "after").exists()
