"""scripts/jobspec/tfjob.py's TFJob, loaded into the kubeflow-training SDK's models."""

from __future__ import annotations

import pytest
import yaml

from helpers import run_main
from scripts import submit_job
from unit.jobspec_cases import GPU, REQUESTS, spec, strict_model


# --- Kubeflow: the kubeflow-training SDK's TFJob model --------------------------------------------

@pytest.mark.parametrize("name", REQUESTS)
def test_tfjob_manifest_loads_into_kubeflow_training_models(name):
    manifest = yaml.safe_load(yaml.safe_dump(spec("tfjob", name)))
    job = strict_model(manifest, "KubeflowOrgV1TFJob")
    replicas = job.spec.tf_replica_specs
    assert replicas["Chief"].replicas == 1
    # Only the retryable codes restart a pod; a configuration error (2) fails the job at once.
    assert {r.restart_policy for r in replicas.values()} == {"ExitCode"}
    assert job.spec.run_policy.backoff_limit == 5
    args = replicas["Worker"].template.spec.containers[0].args
    assert args[args.index("--epochs") + 1] == "10"
    assert ("--model-dir" in args) == (name == "pss-evaluator")  # from --base-output-dir


def test_tfjob_gpu_pools_request_gpus():
    manifest = spec("tfjob", "mwms-v100")
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["image"] == GPU and worker["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    pss = spec("tfjob", "pss-evaluator")["spec"]["tfReplicaSpecs"]
    assert set(pss) == {"Chief", "Worker", "PS", "Evaluator"} and "resources" not in pss["PS"]["template"]["spec"]["containers"][0]


def test_tfjob_unknown_field_fails():
    manifest = spec("tfjob", "mwms-cpu-gcr")
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicyy"] = "Never"
    with pytest.raises(AssertionError, match="restartPolicyy"):
        strict_model(manifest, "KubeflowOrgV1TFJob")


def test_printed_tfjob_says_it_is_for_training_operator_1_9_and_points_to_jobset():
    tfjob = run_main(submit_job.main, "tfjob", *REQUESTS["mwms-cpu-gcr"])
    header = tfjob.stdout.split("apiVersion:")[0]
    assert header.startswith("# Kubeflow training-operator v1 (TFJob), maintained only on its release-1.9 branch")
    assert "use `submit_job.py jobset`" in header and all(line.startswith("#") for line in header.splitlines())
    help_text = run_main(submit_job.main, "--help").stdout
    assert "release-1.9" in help_text and "jobset" in help_text


def test_tfjob_backoff_limit_and_deadline_load_into_the_schema():
    manifest = yaml.safe_load(yaml.safe_dump(spec("tfjob", "pss-evaluator", "--max-restarts", "2", "--timeout", "600")))
    job = strict_model(manifest, "KubeflowOrgV1TFJob")
    assert (job.spec.run_policy.backoff_limit, job.spec.run_policy.active_deadline_seconds) == (2, 600)
