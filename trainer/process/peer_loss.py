"""A level-1 command's Python process that ends on an uncaught error saying a peer of its cluster is
gone exits 143, as the exit-code contract says of a task that lost its cluster (trainer/exits.py),
instead of the 1 Python gives every uncaught exception.

Why: when a worker is preempted, a plain script's chief fails within milliseconds, its collective
aborted (`UnavailableError: Collective ops is aborted by: ... Connection reset by peer`), often
before the platform has marked the preempted pod failed (or long before, when its node is gone).
An exit 1 looks like a bug to a TFJob's `restartPolicy: ExitCode`, which then fails the whole job
instead of restarting it. The runtime's own tasks say the same in their training loop
(trainer.runtime.training); this is the level-1 side, loaded by trainer.run's exit hook
(trainer/process/exit_hook/sitecustomize.py) in every Python process of the command.

It looks at nothing until the process fails, and only in a process that has imported TensorFlow
and belongs to a cluster of two or more tasks: a lone process has no peer to lose.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping

from trainer import exits
from trainer.library import ending


def lost_peer_line(error: BaseException, environ: Mapping[str, str]) -> str | None:
    """The one line to say when `error` ended this process because a peer is gone; else None."""
    if "tensorflow" not in sys.modules:
        return None
    tf_config = ending.tf_config_of(environ)
    cluster, task = tf_config.get("cluster") or {}, tf_config.get("task") or {}
    if sum(len(tasks) for tasks in cluster.values()) < 2:
        return None
    from trainer.runtime.peers import LOST_PEER_ERRORS, error_summary, lost_peer  # TensorFlow is loaded

    if not isinstance(error, LOST_PEER_ERRORS):
        return None
    own = (task.get("type"), int(task.get("index", 0)))
    return (f"trainer.run: lost {lost_peer(error, own)} of this multi-worker job ({type(error).__name__}: "
            f"{error_summary(error)}); exit {exits.RETRYABLE}, retryable")


def retryable_when_a_peer_is_lost(hook: Callable, environ: Mapping[str, str] = os.environ) -> Callable:
    """`hook` (sys.excepthook) wrapped: the traceback as before, then, for a lost peer, one line and
    exit 143, the interpreter's end otherwise kept (threads joined, atexit handlers run, streams flushed)."""
    def hooked(kind, value, traceback):
        hook(kind, value, traceback)
        try:
            line = lost_peer_line(value, environ)
        except Exception:  # noqa: BLE001 - a hook that fails must leave Python's own end as it was
            line = None
        if line is None:
            return
        print(line, file=sys.stderr, flush=True)
        ending.leave(exits.RETRYABLE)

    return hooked
