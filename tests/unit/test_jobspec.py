"""Job specs from scripts/submit_job.py across platforms: the cluster each replica would be told
about, resolved by trainer.cluster; requests no platform can run, refused in one line; what is
written whatever the target. Each platform's own schema: test_jobspec_vertex.py,
test_jobspec_ai_platform.py, test_jobspec_tfjob.py, test_jobset.py."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import run_main
from scripts import jobspec, submit_job
from unit.jobspec_cases import CPU, EXPECTED, GPU, REQUESTS, custom_job_spec, spec
from trainer.cluster import resolve


# --- Round trip: what each replica is told, resolved by trainer.cluster ---------------------------

@pytest.mark.parametrize("platform, target", [("vertex", "vertex"), ("vertex", "hptune"), ("ai-platform", "ai-platform"), ("tfjob", "tfjob")])
@pytest.mark.parametrize("name", REQUESTS)
def test_every_replica_resolves_to_the_requested_cluster(platform, target, name):
    environments = jobspec.cluster_environments(platform, spec(target, name))
    num_workers, num_ps, evaluator = EXPECTED[name]
    resolved = []
    for environment in environments:
        for variable in environment:  # each variable alone must give the same answer
            resolved.append((variable, resolve({variable: environment[variable]})))
    clusters = [cluster for _, cluster in resolved]
    by_variable = {}
    for variable, cluster in resolved:
        by_variable.setdefault(variable, []).append(cluster)
    for variable, replicas in by_variable.items():
        assert sum(c.is_chief for c in replicas) == 1, f"{variable}: not exactly one chief"
        assert sum(c.task_type == "ps" for c in replicas) == num_ps
        assert sum(c.task_type == "evaluator" for c in replicas) == int(evaluator)
        assert len(replicas) == num_workers + num_ps + int(evaluator)
    assert {c.num_workers for c in clusters} == {num_workers}
    assert {c.num_ps for c in clusters} == {num_ps}
    assert all("master" not in c.tf_config["cluster"] for c in clusters)


# --- Inconsistent requests: one line, exit 2 -----------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["vertex", "--strategy", "pss", "--workers", "2", "--image-uri", CPU], "--strategy pss needs at least one parameter server"),
    (["vertex", "--machine-type", "e2-standard-8", "--accelerator-type", "NVIDIA_TESLA_T4", "--accelerator-count", "1",
      "--image-uri", CPU], "machine type e2-standard-8 cannot take NVIDIA_TESLA_T4"),
    (["vertex", "--machine-type", "a2-highgpu-1g", "--accelerator-type", "NVIDIA_TESLA_V100", "--accelerator-count", "1",
      "--image-uri", CPU], "machine type a2-highgpu-1g cannot take NVIDIA_TESLA_V100"),
    (["tfjob", "--workers", "0", "--image-uri", CPU], "--workers must be at least 1"),
    (["ai-platform", "--strategy", "pss", "--ps", "1", "--evaluator", "--image-uri", CPU], "an AI Platform evaluator needs --evaluator-image-uri"),
    (["jobset", "--strategy", "pss", "--workers", "2", "--image-uri", CPU], "--strategy pss needs at least one parameter server"),
    (["tfjob", "--queue", "team-a", "--image-uri", CPU], "--queue is for the jobset and trainjob targets"),
])
def test_inconsistent_requests_exit_2_with_one_line(argv, message):
    result = run_main(submit_job.main, *argv, "--dry-run")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


def test_dry_run_prints_json_for_vertex_and_yaml_for_tfjob():
    vertex = run_main(submit_job.main, "vertex", "--dry-run", *REQUESTS["mwms-cpu-gcr"], "--", "--epochs", "3")
    assert vertex.returncode == 0, vertex.stderr
    assert json.loads(vertex.stdout)["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"] == ["--epochs", "3"]
    tfjob = run_main(submit_job.main, "tfjob", *REQUESTS["mwms-cpu-gcr"])
    assert yaml.safe_load(tfjob.stdout)["kind"] == "TFJob"


H100 = ["--workers", "1", "--machine-type", "a3-highgpu-8g", "--accelerator-type", "NVIDIA_H100_80GB",
        "--accelerator-count", "8", "--image-uri", CPU, "--gpu-image-uri", GPU]


@pytest.mark.parametrize("target", ["vertex", "tfjob"])
def test_an_h100_request_prints_one_warning_line(target):
    result = run_main(submit_job.main, target, "--dry-run", *H100)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("warning: NVIDIA_H100_80GB (compute capability 9.0): TensorFlow 2.21.0's wheel "
                                    "ships no kernels for this GPU, only compute_90 PTX")


def test_a_v100_request_prints_no_warning():
    result = run_main(submit_job.main, "vertex", "--dry-run", *REQUESTS["mwms-v100"])
    assert result.returncode == 0 and result.stderr == ""


def test_the_retryable_code_is_one_kubeflow_retries_and_configuration_errors_are_not():
    """training-operator's IsRetryableExitCode: 130, 137, 138 and 143 are retried under ExitCode."""
    from trainer import exits

    assert exits.RETRYABLE in (130, 137, 138, 143)
    assert exits.CONFIG not in (130, 137, 138, 143)


@pytest.mark.parametrize("target, strategy", [("vertex", ["--workers", "1"]), ("hptune", ["--workers", "1"]),
                                              ("vertex", ["--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator"])])
def test_a_users_image_without_trainer_args_runs_its_own_command(target, strategy):
    """`--image-uri` of an image built FROM ours with its own ENTRYPOINT (gcloud's autopackaging
    layout): no cassava flag given, so no pool gets args or a command that would replace its own."""
    spec = custom_job_spec(target, [*strategy, "--base-output-dir", "gs://b/job"])
    pools = (spec.get("jobSpec") or spec["trialJobSpec"])["workerPoolSpecs"]
    assert [pool for pool in pools if pool and ("args" in pool["containerSpec"] or "command" in pool["containerSpec"])] == []
    assert {pool["containerSpec"]["imageUri"] for pool in pools if pool} == {CPU}
