"""A multi-worker job's peers: what a task sees when one is lost, and decisions every task makes alike."""

from __future__ import annotations

import re

import tensorflow as tf

# What a task sees when a peer of its collective is gone: the RPC fails at once, or the
# collective is aborted or times out.
LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                    tf.errors.DeadlineExceededError)


def error_summary(error: tf.errors.OpError) -> str:
    """The informative line of a collective's error (TF puts "Graph execution error:" first)."""
    lines = [line.strip() for line in (error.message or "").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File "))]
    # An eager op's error starts with the function it ran in: `{{function_node __wrapped__...}} `.
    lines = [re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line) for line in lines]
    telling = next((line for line in lines if re.search(r"abort|unhealthy|connect|socket|unavailable|deadline", line, re.I)), None)
    return (telling or (lines[0] if lines else type(error).__name__))[:200]


def lost_peer(error: tf.errors.OpError, own: tuple[str, int] | None = None) -> str:
    """The peer a collective error names (`worker-1`), or "a peer task". `own`: this task's (type,
    index), never the answer: an error may name this task's own device before the peer."""
    for match in re.finditer(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", error.message or ""):
        if (match.group(1), int(match.group(2))) != own:
            return f"{match.group(1)}-{match.group(2)}"
    return "a peer task"


def mean_over_tasks(strategy: tf.distribute.Strategy):
    """A function from this task's list of numbers to their mean over every replica of the job
    (one all-reduce), for decisions every task must make alike."""

    @tf.function(autograph=False)  # TensorFlow ops already: nothing for AutoGraph to convert
    def mean(values):
        per_replica = strategy.run(lambda: tf.identity(values))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return lambda values: [float(v) for v in mean(tf.constant(values, tf.float32)).numpy()]
