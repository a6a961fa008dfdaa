"""The orderly end of a multi-worker process (trainer.library.ending): who leads, whom the leader outlives,
and how it tells a task is gone."""

import itertools
import json
import socket

import pytest

from trainer import exits
from trainer.library import ending

pytestmark = pytest.mark.unit

MWMS = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2223"]}


def config(cluster, task_type, index=0):
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def test_the_chief_leads_else_worker_zero_as_tensorflow_picks():
    assert ending.leader(MWMS) == ("chief", 0)
    assert ending.leader({"worker": ["a:1", "b:1"]}) == ("worker", 0)
    assert ending.leader({}) is None


def test_the_leader_outlives_every_other_task_and_no_more():
    assert ending.is_leader(config(MWMS, "chief"))
    assert not ending.is_leader(config(MWMS, "worker", 0))
    assert ending.others(config(MWMS, "chief")) == [("w0", 2222), ("w1", 2223)]
    assert ending.others(config(MWMS, "worker", 1)) == [("c", 2222), ("w0", 2222)]
    assert ending.others(config({"worker": ["[::1]:5000", "[::1]:5001"]}, "worker")) == [("::1", 5001)]


def test_a_listening_task_is_there_and_a_closed_port_is_gone():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = server.getsockname()
    assert not ending.gone(address)
    server.close()
    assert ending.gone(address)


def test_an_address_that_no_longer_resolves_is_gone():
    assert ending.gone(("no-such-pod.invalid", 2222))


def test_the_leader_waits_for_the_last_task_to_go_and_no_longer_than_its_limit():
    now = itertools.count()
    alive = {("a", 1): 3, ("b", 1): 1}  # probes each still answers

    def probe(address):
        alive[address] -= 1
        return alive[address] < 0

    assert ending.wait_until_gone(alive, limit=100, probe=probe, clock=lambda: next(now), sleep=lambda s: None) == []
    stubborn = ending.wait_until_gone([("c", 1)], limit=3, probe=lambda a: False, clock=lambda: next(now),
                                      sleep=lambda s: None)
    assert stubborn == [("c", 1)]


def test_the_leader_probes_faster_than_the_service_finds_a_task_gone():
    """The service finds a task gone 5 to 10 s after it exits (heartbeats every 5 s, a 10 s
    timeout): the leader, seeing it gone within a probe and an interval, leaves well before."""
    assert ending.PROBE_SECONDS + ending.PROBE_INTERVAL_SECONDS < 5


def test_without_a_coordination_service_the_code_is_returned(monkeypatch):
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: False)
    environ = {"TF_CONFIG": json.dumps(config(MWMS, "worker"))}
    assert ending.end(exits.OK, environ) == exits.OK
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: True)
    assert ending.end(exits.CONFIG, environ) == exits.CONFIG  # an error ends as it would have
    assert ending.end(exits.OK, {}) == exits.OK  # one process
    assert ending.end(exits.OK, {"TF_CONFIG": "not json"}) == exits.OK


def test_the_exit_hook_does_nothing_after_a_traceback_or_once_the_runtime_ended(monkeypatch):
    met = []
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: True)
    monkeypatch.setattr(ending, "_meet", lambda tf_config, seconds: met.append(seconds) or True)
    monkeypatch.setattr(ending, "_state", {"ended": False, "failed": False})
    environ = {"TF_CONFIG": json.dumps(config(MWMS, "worker"))}
    ending.at_exit(environ)
    assert met == [ending.AT_EXIT_BARRIER_SECONDS]
    seen = []
    ending.note_failure(lambda *args: seen.append(args))(ValueError, ValueError("x"), None)
    assert seen and ending._state["failed"]
    ending.at_exit(environ)
    assert len(met) == 1
    monkeypatch.setattr(ending, "_state", {"ended": True, "failed": False})
    ending.at_exit(environ)
    assert len(met) == 1


def test_a_task_that_met_the_others_leaves_at_once_with_its_code(monkeypatch):
    """Past the barrier the process leaves (os._exit in _leave) with the code it was given, for a
    done task and for one stopped by the job's vote alike, with the barrier each is given."""
    met, left = [], []
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: True)
    monkeypatch.setattr(ending, "_run_exit_handlers", lambda: None)
    monkeypatch.setattr(ending, "_meet", lambda tf_config, seconds: met.append(seconds) or True)
    monkeypatch.setattr(ending, "_leave", left.append)
    environ = {"TF_CONFIG": json.dumps(config(MWMS, "chief"))}
    assert ending.end(exits.OK, environ) == exits.OK
    assert ending.end(exits.RETRYABLE, environ) == exits.RETRYABLE
    assert left == [exits.OK, exits.RETRYABLE]
    assert met == [ending.BARRIER_SECONDS[exits.OK], ending.BARRIER_SECONDS[exits.RETRYABLE]]


def test_a_task_whose_peers_are_gone_ends_as_it_would_have(monkeypatch):
    left = []
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: True)
    monkeypatch.setattr(ending, "_run_exit_handlers", lambda: None)
    monkeypatch.setattr(ending, "_meet", lambda tf_config, seconds: False)
    monkeypatch.setattr(ending, "_leave", left.append)
    assert ending.end(exits.OK, {"TF_CONFIG": json.dumps(config(MWMS, "worker"))}) == exits.OK
    assert left == []


def test_the_exit_handlers_run_before_the_barrier_which_os_exit_would_skip(monkeypatch):
    """TensorFlow's autograph removes its generated files from TMPDIR in an atexit handler: a task
    that leaves with os._exit runs the handlers itself, before it meets the others."""
    steps = []
    monkeypatch.setattr(ending, "_coordination_service_running", lambda: True)
    monkeypatch.setattr(ending, "_run_exit_handlers", lambda: steps.append("handlers"))
    monkeypatch.setattr(ending, "_meet", lambda tf_config, seconds: steps.append("barrier") or True)
    monkeypatch.setattr(ending, "_leave", lambda code: steps.append("leave"))
    ending.end(exits.OK, {"TF_CONFIG": json.dumps(config(MWMS, "worker"))})
    assert steps == ["handlers", "barrier", "leave"]
    steps.clear()
    ending.end(exits.OK, {})  # one process: the interpreter's own exit runs them
    assert steps == []



def test_leaving_from_another_thread_joins_the_other_threads_but_never_the_main_one():
    """The interpreter's own shutdown belongs to the main thread; from any other, the threads that
    are not daemons are joined, except the main thread, which may be waiting for this one."""
    import threading
    import time

    finished = []
    other = threading.Thread(target=lambda: (time.sleep(0.2), finished.append("other")))
    other.start()
    leaving = threading.Thread(target=lambda: (ending._join_threads(), finished.append("joined")))
    leaving.start()
    leaving.join(timeout=30)  # the main thread waits for it, as a program's main thread would
    assert not leaving.is_alive(), "joining from another thread waited for the main thread"
    assert finished == ["other", "joined"]
