"""trainer.process.peer_loss: which uncaught errors of a level-1 command's process say a peer is
gone (exit 143), read without starting a process; the exit itself: tests/integration/test_run_command.py."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from trainer.process import peer_loss

TWO_TASKS = {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}})}
ONE_TASK = {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}})}
# As TensorFlow words the chief's error the moment a preempted worker's process is gone.
ABORTED = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from "
           "remote target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:")


@pytest.mark.parametrize("kind", [tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                                  tf.errors.DeadlineExceededError])
def test_a_collectives_error_in_a_cluster_names_the_lost_peer_and_exit_143(kind):
    line = peer_loss.lost_peer_line(kind(None, None, ABORTED), TWO_TASKS)
    assert line is not None and line.startswith(f"trainer.run: lost worker-0 of this multi-worker job ({kind.__name__}: ")
    assert "Connection reset by peer" in line and line.endswith("; exit 143, retryable")


def test_the_peer_named_is_never_this_task_though_the_error_names_its_device_first():
    """As the chief's error read when its worker died between two collectives."""
    message = ("{{function_node __wrapped__CollectiveReduceV2_device_/job:chief/replica:0/task:0/device:CPU:0}} "
               "Collective ops is aborted by: Error reported from /job:worker/task:0: The following tasks are "
               "unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:0")
    line = peer_loss.lost_peer_line(tf.errors.UnavailableError(None, None, message), TWO_TASKS)
    assert line.startswith("trainer.run: lost worker-0 "), line
    unnamed = tf.errors.UnavailableError(None, None, "/job:chief/replica:0/task:0 is aborting")
    assert peer_loss.lost_peer_line(unnamed, TWO_TASKS).startswith("trainer.run: lost a peer task ")


@pytest.mark.parametrize("error, environ", [
    (tf.errors.UnavailableError(None, None, ABORTED), ONE_TASK),  # no peer to lose
    (tf.errors.UnavailableError(None, None, ABORTED), {}),
    (tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"), TWO_TASKS),  # a bug
    (ValueError("a bug"), TWO_TASKS),
    (KeyboardInterrupt(), TWO_TASKS),
])
def test_anything_else_keeps_pythons_exit(error, environ):
    assert peer_loss.lost_peer_line(error, environ) is None


def test_the_hook_prints_the_traceback_first_then_leaves_with_143(monkeypatch, capsys):
    printed, left = [], []
    monkeypatch.setattr(peer_loss.ending, "leave", left.append)
    hook = peer_loss.retryable_when_a_peer_is_lost(lambda *exc: printed.append(exc[0]), TWO_TASKS)
    hook(tf.errors.UnavailableError, tf.errors.UnavailableError(None, None, ABORTED), None)
    assert printed == [tf.errors.UnavailableError] and left == [143]
    assert capsys.readouterr().err.startswith("trainer.run: lost worker-0 ")
    hook(ValueError, ValueError("a bug"), None)
    assert printed[-1] is ValueError and left == [143]  # Python's own end: exit 1


def test_a_cluster_it_cannot_read_leaves_pythons_exit(monkeypatch):
    left = []
    monkeypatch.setattr(peer_loss.ending, "leave", left.append)
    environ = {"TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": "x"}}'}
    hook = peer_loss.retryable_when_a_peer_is_lost(lambda *exc: None, environ)
    hook(tf.errors.UnavailableError, tf.errors.UnavailableError(None, None, ABORTED), None)
    assert left == []
