"""The orderly end of a multi-worker process: no task leaves while another still works, and the
task that hosts TensorFlow's coordination service leaves last.

MultiWorkerMirroredStrategy starts TensorFlow's coordination service in its leader task (the
chief, else worker 0; tensorflow/python/distribute/multi_worker_util.py, coordination_leader) and
an agent in every task that sends it a heartbeat every 5 s (half the 10 s heartbeat timeout;
xla/tsl/distributed_runtime/coordination/coordination_service_agent.cc). Nothing in TensorFlow's
Python shuts that agent down: the eager context never destroys its server ("Servers don't support
clean shutdown"), so a task's process just exits, its agent still connected. Two ends of a healthy
job then log an error (tests/integration/test_orderly_end.py provokes both):

- a worker leaves, and the leader is still working 5-10 s later (the chief exporting a large
  model): the service finds the worker "unhealthy (stopped sending heartbeats)" and aborts the
  leader's collectives, `E0000 ... StartAbort UNAVAILABLE: ... The tasks have crashed` on the chief;
- the leader leaves, and a worker is still alive some seconds later (its interpreter slow to tear
  down): its heartbeat fails, `E0000 ... StartAbort UNAVAILABLE: Failed to send RPC to coordination
  service` on the worker.

So every task, its work done (the chief's export included), waits at one barrier of the
coordination service; then the others leave, and the leader waits until each of them is gone (its
TensorFlow server's port no longer answers: the server lives as long as its process) and leaves
at once, well within the 5 s the service grants a task after its last heartbeat. A task whose
peers failed finds the barrier failed and ends as it would have; a process without the service
(one process, a ParameterServer job, which runs none by default) is left as it is.

Two ways in: `end(code)`, at the end of a runtime task (trainer.fit.run), which knows its exit code
and leaves with os._exit (`leave`, which every runtime task's process ends with, ordered or not);
and `at_exit`, which trainer.run registers in the Python processes of a level-1 command
(trainer/process/exit_hook/sitecustomize.py), where the exit code is the script's own and the
interpreter ends as usual. It lives in the library because both use it, and because a
script of your own can too: it imports nothing but the exit codes until the process has
TensorFlow's coordination service, so loading it costs a Python process nothing.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Callable, Iterable, Mapping, Sequence

from trainer import exits

log = logging.getLogger("trainer")

BARRIER = "trainer/end"
# How long a task waits at the barrier for the others. A runtime task that trained waits for the
# chief's export and run record, which may take minutes for a large model and a bucket far away; a
# stop every task takes at the same step (SIGTERM's vote) meets there at once. A task that dies on
# the way fails the barrier as soon as the service notices (within its heartbeat timeout), so the
# wait is this long only for a peer that hangs. A level-1 script's tasks end together (every
# worker saves, a collective), and one that exits on an error of its own must not hold the others
# for long.
BARRIER_SECONDS = {exits.OK: 3600.0, exits.RETRYABLE: 30.0}
AT_EXIT_BARRIER_SECONDS = 120.0
# The leader waits this long at most for the others' processes to end after the barrier (a
# level-1 interpreter tearing down TensorFlow can take seconds); it leaves as soon as they have.
LEADER_WAIT_SECONDS = 60.0
PROBE_SECONDS = 0.5
PROBE_INTERVAL_SECONDS = 0.1
_COORDINATED = ("chief", "worker")  # the jobs MultiWorkerMirroredStrategy's service coordinates
_state = {"ended": False, "failed": False}


def leader(cluster: Mapping[str, Sequence[str]]) -> tuple[str, int] | None:
    """The task that hosts the coordination service for a MultiWorkerMirrored cluster (TF_CONFIG's
    `cluster`), as TensorFlow picks it: the chief, else worker 0; None for no cluster."""
    for job in _COORDINATED:
        if cluster.get(job):
            return job, 0
    return None


def others(tf_config: Mapping) -> list[tuple[str, int]]:
    """The (host, port) of every coordinated task but this one."""
    cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
    me = (task.get("type"), int(task.get("index", 0)))
    addresses = []
    for job in _COORDINATED:
        for index, address in enumerate(cluster.get(job) or []):
            if (job, index) != me:
                host, _, port = address.rpartition(":")
                addresses.append((host.strip("[]"), int(port)))
    return addresses


def is_leader(tf_config: Mapping) -> bool:
    task = tf_config.get("task") or {}
    return leader(tf_config.get("cluster") or {}) == (task.get("type"), int(task.get("index", 0)))


def gone(address: tuple[str, int], timeout: float = PROBE_SECONDS) -> bool:
    """Whether no process listens at `address` any more: a refused connection, an address that no
    longer resolves or answers (a pod that finished), or no answer in `timeout` seconds. A live
    task's server accepts at once, in its kernel, however busy the task is."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return False
    except OSError:
        return True


def wait_until_gone(addresses: Iterable[tuple[str, int]], limit: float, probe: Callable[[tuple[str, int]], bool] = gone,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list:
    """Waits until every address is gone, at most `limit` seconds; returns those still there."""
    waiting = list(addresses)
    deadline = clock() + limit
    while waiting:
        waiting = [address for address in waiting if not probe(address)]
        if not waiting or clock() >= deadline:
            break
        sleep(PROBE_INTERVAL_SECONDS)
    return waiting


def tf_config_of(environ: Mapping[str, str]) -> dict:
    try:
        value = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _coordination_service_running() -> bool:
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    current = context.context_safe()
    return current is not None and current.coordination_service is not None and bool(
        getattr(current, "_context_handle", None))


def _meet(tf_config: Mapping, barrier_seconds: float) -> bool:
    """The barrier, then, in the leader, the wait for the others to be gone. False when the
    barrier failed: a peer is gone or never came."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    try:
        context.context().wait_at_barrier(BARRIER, int(barrier_seconds * 1000))
    except (tf.errors.OpError, ValueError) as error:
        log.debug("end: the job's tasks did not all reach the end (%s)", error)
        return False
    if is_leader(tf_config):
        left = wait_until_gone(others(tf_config), LEADER_WAIT_SECONDS)
        if left:
            log.debug("end: still answering after %.0fs: %s", LEADER_WAIT_SECONDS, left)
    return True


def leave(code: int) -> None:
    """Ends this process now with `code`, as the interpreter would end it but for its teardown: the
    Python threads that are not daemons joined, the atexit handlers run, the logs and the standard
    streams flushed, then os._exit. The teardown is what a runtime task skips: it collects every
    TensorFlow function the process holds, and each one's deletion is a call into the runtime
    (AtomicFunction.__del__, Context.remove_function), seconds for a ResNet50 and its export's
    traces (measured in benchmarks/time_to_accuracy.py's `exit` phase). Everything the runtime
    writes (checkpoints, the export, TensorBoard's writers, flushed each epoch) is closed by then."""
    _join_threads()
    _run_exit_handlers()
    _leave(code)


def _join_threads() -> None:
    """What the interpreter does first as it exits (threading._shutdown): the callbacks registered
    for it run (an idle concurrent.futures pool's workers are told to stop there, and would be
    waited for forever without them), then every thread that is not a daemon is joined. Called
    from another thread, only the non-daemon threads other than the main one and this are joined:
    the main thread may be the one waiting for this thread, and joining it would wait for ever."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
        return
    skipped = (threading.current_thread(), threading.main_thread())
    for thread in threading.enumerate():
        if thread not in skipped and not thread.daemon and thread.is_alive():
            thread.join()


def _leave(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def end(code: int, environ: Mapping[str, str] = os.environ) -> int:
    """Ends this task's process in order with the job's other tasks (TF_CONFIG's), for `code` OK
    or RETRYABLE (a stop every task takes at the same step); returns `code` where there is nothing
    to order: no coordination service in this process, another code, or the barrier failed (a
    peer is gone)."""
    _state["ended"] = True
    tf_config = tf_config_of(environ)
    if code not in BARRIER_SECONDS or not tf_config.get("cluster") or not _coordination_service_running():
        return code
    # What the interpreter would run as it exits, run now: os._exit skips it, and it includes
    # clean-ups such as the removal of the source files TensorFlow's autograph writes into TMPDIR
    # (tensorflow/python/autograph/pyct/loader.py, atexit). Before the barrier, where a slow one
    # only keeps the others waiting, not after it, where the leader has 5 s once the others are gone.
    _run_exit_handlers()
    if not _meet(tf_config, BARRIER_SECONDS[code]):
        return code
    _leave(code)
    return code  # not reached


def _run_exit_handlers() -> None:
    """Every atexit handler, in the interpreter's order (last registered first), each once: CPython
    clears them as it runs them, so the interpreter's own exit runs none of them again."""
    atexit._run_exitfuncs()


def at_exit(environ: Mapping[str, str] = os.environ) -> None:
    """The orderly end for a level-1 script's process, run by the interpreter as it exits (atexit):
    nothing after a traceback (the script failed: its peers are failing or waiting for it), nor
    where `end` already ran, nor without the coordination service."""
    tf_config = tf_config_of(environ)
    if _state["ended"] or _state["failed"] or not tf_config.get("cluster") or not _coordination_service_running():
        return
    _meet(tf_config, AT_EXIT_BARRIER_SECONDS)


def note_failure(hook: Callable) -> Callable:
    """`hook` (sys.excepthook) wrapped to note first that the script ends on an uncaught exception."""
    def noted(kind, value, traceback):
        _state["failed"] = True
        return hook(kind, value, traceback)

    return noted
