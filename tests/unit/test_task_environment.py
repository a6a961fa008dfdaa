"""What cassava.task reads from its environment before anything else, and what trainer.launch gives
each task: a JobSet pod's hostname from the kernel, and a machine of its own per launched task."""

from __future__ import annotations

import json
import socket

import pytest

from cassava.task import CassavaTask
from trainer import cluster
from trainer.runtime import entry
from trainer.process import launch

# A JobSet pod's variables, as the generated spec gives them, without HOSTNAME.
JOBSET_POD = {"JOBSET_NAME": "tf", "JOBSET_REPLICATED_JOB": "worker", "JOBSET_JOB_INDEX": "0",
              "JOBSET_PODS": "chief=1,worker=2", "JOB_COMPLETION_INDEX": "1"}


@pytest.fixture
def environ(monkeypatch):
    for name in ("TF_CONFIG", "CLUSTER_SPEC", "HOSTNAME", *cluster.JOBSET_VARIABLES, cluster.JOB_COMPLETION_INDEX):
        monkeypatch.delenv(name, raising=False)
    for name, value in JOBSET_POD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(entry.logs, "configure", lambda: None)  # the test process keeps its logging


def test_a_jobset_pod_without_hostname_in_its_environment_resolves_by_the_kernels_hostname(environ, monkeypatch, capsys):
    monkeypatch.setattr(socket, "gethostname", lambda: "tf-worker-0-1")
    # Resolved: the job gets as far as its flags (a bad one here, so nothing trains).
    with pytest.raises(SystemExit) as stop:
        entry.main(CassavaTask(), ["--epochs", "many"], prog="python -m cassava.task")
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("python -m cassava.task: error: argument --epochs")


def test_a_jobset_pod_whose_kernel_hostname_is_another_pods_stops_with_one_line(environ, monkeypatch, capsys):
    monkeypatch.setattr(socket, "gethostname", lambda: "tf-worker-0-0")
    assert entry.main(CassavaTask(), ["--epochs", "1"], prog="python -m cassava.task") == 2
    assert capsys.readouterr().err.splitlines() == [
        'cassava.task: error: HOSTNAME is "tf-worker-0-0", but Kubernetes names pod 1 of Job tf-worker-0 '
        '"tf-worker-0-1": JOBSET_NAME, JOBSET_REPLICATED_JOB and JOBSET_JOB_INDEX must come from this pod\'s own labels']


def test_each_launched_task_gets_a_machine_of_its_own(monkeypatch, tmp_path):
    """trainer.launch gives every task its own TF_CONFIG, scratch directory and hypertune file, as
    if it ran on a machine of its own, and no CLUSTER_SPEC that would contradict its TF_CONFIG."""
    started = []

    class Process:
        pid, stdout = 0, iter(())

        def __init__(self, command, env, **_):
            started.append(env)

        def poll(self):
            return 0

    monkeypatch.setenv("CLUSTER_SPEC", '{"cluster": {}}')
    monkeypatch.setattr(launch.subprocess, "Popen", Process)
    cluster_spec, tasks = launch.plan_cluster(2, 0, False, [1, 2])
    job = launch.Job(cluster_spec, tasks, [], str(tmp_path), parameter_server=False)
    for task in tasks:
        job.start(task)
    assert [json.loads(env["TF_CONFIG"])["task"] for env in started] == [{"type": "chief", "index": 0},
                                                                         {"type": "worker", "index": 0}]
    assert [env["TMPDIR"] for env in started] == [str(tmp_path / "chief-0" / "tmp"), str(tmp_path / "worker-0" / "tmp")]
    assert len({env["CLOUD_ML_HP_METRIC_FILE"] for env in started}) == 2
    assert not [env for env in started if "CLUSTER_SPEC" in env]
