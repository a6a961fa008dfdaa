"""A Vertex job with a Reduction Server pool, as its replicas are told: the chief and the worker
get the CLUSTER_SPEC and TF_CONFIG scripts/jobspec.py derives for it, with the reducers (pool 2,
`ps` in TF_CONFIG) at addresses where nothing listens, as the reducers start no TensorFlow server.
They must train together with MultiWorkerMirrored, never waiting for the reducers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, clean_env
from scripts import jobspec, submit_job
from trainer.process.ports import free_ports

TASK_ARGS = ["--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2", "--architecture", "small",
             "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4", "--mixed-precision", "off"]


def localhost(variable_value: str, addresses: dict[str, str]) -> str:
    """The variable with Vertex's host names replaced by this machine's ports."""
    value = json.loads(variable_value)
    value["cluster"] = {role: [addresses[host] for host in hosts] for role, hosts in value["cluster"].items()}
    return json.dumps(value)


@pytest.mark.parametrize("variable", ["TF_CONFIG", "CLUSTER_SPEC"])
def test_an_mwms_job_with_reducers_trains_without_waiting_for_them(variable, tmp_path, data_root):
    args = submit_job.build_parser().parse_args(
        ["vertex", "--dry-run", "--image-uri", "cpu:1", "--gpu-image-uri", "gpu:1", "--machine-type", "g2-standard-8",
         "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "1", "--workers", "1", "--reduction-server", "2"])
    args.trainer_args = TASK_ARGS
    environments = jobspec.cluster_environments("vertex", submit_job.build_spec(args)[1])
    hosts = ["workerpool0-0:2222", "workerpool1-0:2222", "workerpool2-0:2222", "workerpool2-1:2222"]
    # The reducers' ports are closed: connecting there fails at once, and nothing must try.
    addresses = {host: f"127.0.0.1:{port}" for host, port in zip(hosts, free_ports(len(hosts)))}
    processes = {}
    for name, environment in zip(("chief", "worker"), environments):
        env = clean_env(**{variable: localhost(environment[variable], addresses), "TMPDIR": str(tmp_path),
                           "PYTHONUNBUFFERED": "1"})
        processes[name] = subprocess.Popen(
            [sys.executable, "-m", "cassava.task", *TASK_ARGS, "--data-dir", str(data_root),
             "--model-dir", str(tmp_path / "out" / "model")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = {}
    for name, process in processes.items():  # about 30 s on 2 cores; waiting for a reducer never ends
        try:
            outputs[name] = process.communicate(timeout=300)[0]
        except subprocess.TimeoutExpired:
            for each in processes.values():
                each.kill()
            # Every task's output: a task that stopped early (the chief, say) leaves the other waiting for it.
            said = {other: outputs[other] if other in outputs else each.communicate()[0] or ""
                    for other, each in processes.items()}
            pytest.fail(f"{name} did not finish in 300 s (waiting for the reducers?); exit codes "
                        f"{ {other: each.returncode for other, each in processes.items()} }:\n"
                        + "\n".join(f"--- {other}:\n{text[-3000:]}" for other, text in said.items()))
    for name, process in processes.items():
        assert process.returncode == 0, f"{name}:\n{outputs[name][-4000:]}"
    chief = outputs["chief"]
    assert '"num_ps": 0' in chief and '"num_reducers": 2' in chief
    assert "role: chief-0, strategy: multi_worker_mirrored" in chief
    assert "strategy=multi_worker_mirrored replicas=2" in chief
    assert "2 Reduction Server reducer(s) in worker pool 2, and no GPU here" in chief
    assert os.path.exists(tmp_path / "out" / "model" / "saved_model.pb")
