"""The JobSet rehearsal's rules, read from manifests without running anything."""

from __future__ import annotations

import pytest
import yaml

from scripts import jobspec, local_jobset
from scripts.submit_job import build_parser, build_spec


def generated(*args: str) -> dict:
    split = args.index("--") if "--" in args else len(args)
    parsed = build_parser().parse_args(["jobset", "--image-uri", "img:1", *args[:split]])
    parsed.trainer_args = list(args[split + 1:])
    return build_spec(parsed)[1]


def job_spec(manifest: dict, role: str) -> dict:
    return next(r["template"]["spec"] for r in manifest["spec"]["replicatedJobs"] if r["name"] == role)


def test_exit_codes_the_generated_policy_fails_at_once_and_those_it_counts():
    manifest = generated("--workers", "2")
    worker = job_spec(manifest, "worker")
    assert local_jobset.pod_failure_action(worker, 1, disrupted=False) == "FailJob"
    assert local_jobset.pod_failure_action(worker, 2, disrupted=False) == "FailJob"
    for signalled in (130, 137, 138, 143):
        assert local_jobset.pod_failure_action(worker, signalled, disrupted=False) == "Count"
    # An eviction is counted for MWMS (every worker is needed), whatever the code.
    assert local_jobset.pod_failure_action(worker, 1, disrupted=True) == "Count"


def test_a_pss_worker_evicted_is_recreated_uncounted():
    manifest = generated("--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator")
    assert local_jobset.pod_failure_action(job_spec(manifest, "worker"), 143, disrupted=True) == "Ignore"
    assert local_jobset.pod_failure_action(job_spec(manifest, "chief"), 143, disrupted=True) == "Count"


def test_a_job_failed_by_policy_fails_the_jobset_and_others_restart_it():
    policy = generated("--workers", "1", "--max-restarts", "2")["spec"]["failurePolicy"]
    assert local_jobset.jobset_failure_action(policy, "worker", "PodFailurePolicy") == "FailJobSet"
    assert local_jobset.jobset_failure_action(policy, "worker", "BackoffLimitExceeded") == "RestartJobSet"
    targeted = {"rules": [{"action": "RestartJobSetAndIgnoreMaxRestarts", "targetReplicatedJobs": ["ps"]}]}
    assert local_jobset.jobset_failure_action(targeted, "ps", "BackoffLimitExceeded") == "RestartJobSetAndIgnoreMaxRestarts"
    assert local_jobset.jobset_failure_action(targeted, "worker", "BackoffLimitExceeded") == "RestartJobSet"


def test_pods_get_their_hostname_subdomain_and_job():
    pods = local_jobset.pods_of(generated("--name", "demo", "--workers", "2", "--", "--epochs", "1"))
    assert [(p.hostname, p.job, p.subdomain) for p in pods] == [
        ("demo-chief-0-0", "demo-chief-0", "demo"), ("demo-worker-0-0", "demo-worker-0", "demo"),
        ("demo-worker-0-1", "demo-worker-0", "demo")]
    assert pods[2].env["JOBSET_REPLICATED_JOB"] == "worker" and pods[2].env["JOB_COMPLETION_INDEX"] == "1"
    assert pods[0].args[-2:] == ["--epochs", "1"]


def test_claims_are_shared_and_other_volume_kinds_are_refused():
    manifest = generated("--workers", "1")
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        pod_spec["volumes"] = [{"name": "m", "persistentVolumeClaim": {"claimName": "models"}}, {"name": "s", "emptyDir": {}}]
        pod_spec["containers"][0]["volumeMounts"] = [{"name": "m", "mountPath": "/models"}, {"name": "s", "mountPath": "/scratch"}]
    pods = local_jobset.pods_of(manifest)
    assert {tuple(p.mounts) for p in pods} == {(("models", "/models", False), (None, "/scratch", False))}
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"][0] = {
        "name": "m", "hostPath": {"path": "/data"}}
    with pytest.raises(jobspec.SpecError, match="hostPath"):
        local_jobset.pods_of(manifest)


@pytest.mark.parametrize("text", ["demo-worker-0-0", "demo-worker-0-0@", "Demo@3", "demo@/(/", "demo@soon"])
def test_a_bad_preempt_is_one_line(text):
    with pytest.raises(jobspec.SpecError, match="--preempt takes POD@SECONDS or POD@/REGEX/"):
        local_jobset.parse_eviction(text)


def test_preempt_parses_seconds_and_patterns():
    assert local_jobset.parse_eviction("demo-worker-0-1@40").seconds == 40
    assert local_jobset.parse_eviction("demo-worker-0-1@/epoch 2/").pattern.pattern == "epoch 2"


def test_load_reads_the_first_jobset_and_refuses_the_rest(tmp_path):
    manifest = generated("--workers", "1")
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump({"kind": "ConfigMap", "apiVersion": "v1"}) + "---\n" + yaml.safe_dump(manifest))
    assert local_jobset.load(str(path))["metadata"] == manifest["metadata"]
    path.write_text(yaml.safe_dump({"kind": "ConfigMap"}))
    with pytest.raises(jobspec.SpecError, match="no JobSet"):
        local_jobset.load(str(path))
    path.write_text(yaml.safe_dump({**manifest, "apiVersion": "jobset.x-k8s.io/v1alpha1"}))
    with pytest.raises(jobspec.SpecError, match="v1alpha2"):
        local_jobset.load(str(path))
    path.write_text("kind: [")
    with pytest.raises(jobspec.SpecError):
        local_jobset.load(str(path))
