"""What the API server makes of a manifest before anything runs: JobSet's webhook defaults
(Default in pkg/webhooks/jobset_webhook.go, kubernetes-sigs/jobset v0.12.0) and what the webhook
and Kubernetes' Job validation refuse, refused here with one line each."""

from __future__ import annotations

import json

from scripts.rehearsal.runner import RehearsalError

# The reasons a failed Job's condition can give (validOnJobFailureReasons, jobset_webhook.go).
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                       "PodFailurePolicy")


def admitted(manifest: dict) -> dict:
    """The manifest as the API server would store it: the JobSet webhook's defaults (Default in
    jobset_webhook.go) and Kubernetes' defaults of each Job (`job_defaults`), then what the
    webhook (ValidateCreate, validateFailurePolicy) and Kubernetes' Job validation refuse, refused
    here with one line each. A new dict."""
    manifest = json.loads(json.dumps(manifest))
    spec = manifest.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    rjobs = spec.get("replicatedJobs") or []
    if not rjobs:
        raise RehearsalError("spec.replicatedJobs is empty: a JobSet needs at least one replicatedJob")
    for rjob in rjobs:
        rjob.setdefault("replicas", 1)
        job_spec = rjob["template"].setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        job_defaults(job_spec)
        # "Default pod restart policy to OnFailure" (Default): a template that names none gets it.
        job_spec["template"]["spec"].setdefault("restartPolicy", "OnFailure")
    policy = spec.get("failurePolicy")
    if policy is not None:
        for index, rule in enumerate(policy.get("rules") or []):
            rule.setdefault("name", f"failurePolicyRule{index}")
    _validate(manifest)
    return manifest


def job_defaults(job_spec: dict) -> None:
    """Kubernetes' defaults of a Job's spec, in place (SetDefaults_Job in kubernetes/kubernetes
    pkg/apis/batch/v1/defaults.go): a Job that sets neither completions nor parallelism gets 1 of
    each (a non-parallel Job, as JobSet's depends-on examples and e2e tests write them); one that
    sets only completions gets parallelism 1. One that sets only parallelism keeps no completions,
    which Indexed Jobs refuse (`_validate`)."""
    if "completions" not in job_spec and "parallelism" not in job_spec:
        job_spec["completions"] = 1
    job_spec.setdefault("parallelism", 1)


def _validate(manifest: dict) -> None:
    spec = manifest["spec"]
    if spec.get("suspend"):
        # A suspended JobSet's Jobs are created suspended, and none of its pods runs until something
        # (Kueue, on admission) sets suspend to false: there is nothing to rehearse until then.
        raise RehearsalError("spec.suspend is true: the JobSet's pods start only once it is resumed (Kueue resumes "
                             "what it admits); the rehearsal runs a JobSet that is not suspended")
    rjobs = spec["replicatedJobs"]
    names = [rjob["name"] for rjob in rjobs]
    if rjobs[0].get("dependsOn"):
        raise RehearsalError(f"replicatedJob {names[0]}: dependsOn can't be set for the first ReplicatedJob "
                             "(JobSet's webhook refuses it)")
    for position, rjob in enumerate(rjobs):
        where = f"replicatedJob {rjob['name']}"
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names[:position]:
                raise RehearsalError(f"{where}: cannot depend on replicatedJob {dependency.get('name')!r}: only on one "
                                     "listed before it (JobSet's webhook refuses it)")
            if dependency.get("status") not in ("Ready", "Complete"):
                raise RehearsalError(f"{where}: dependsOn status {dependency.get('status')!r} is not Ready or Complete")
        job_spec = rjob["template"]["spec"]
        if job_spec["completionMode"] == "Indexed" and "completions" not in job_spec:
            # ValidateJobSpec (pkg/apis/batch/validation/validation.go): "when completion mode is Indexed".
            raise RehearsalError(f"{where}: spec.completions: Required value: when completion mode is Indexed "
                                 "(parallelism is set, so Kubernetes defaults no completions, and refuses the Job)")
        restart_policy = job_spec["template"]["spec"]["restartPolicy"]
        if restart_policy not in ("Never", "OnFailure"):
            raise RehearsalError(f"{where}: restartPolicy {restart_policy}: a Job's pods take Never or OnFailure "
                                 "(Kubernetes refuses the Job)")
        if job_spec.get("podFailurePolicy") and restart_policy != "Never":
            given = "defaulted to OnFailure by JobSet's webhook, as none is set" if restart_policy == "OnFailure" else ""
            raise RehearsalError(f"{where}: podFailurePolicy needs the pod template's restartPolicy Never; it is "
                                 f"{restart_policy}{' (' + given + ')' if given else ''}, and Kubernetes refuses the Job")
        for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
            if rule.get("action") not in ("FailJob", "Ignore", "Count"):
                raise RehearsalError(f"{where}: podFailurePolicy action {rule.get('action')} (backoffLimitPerIndex) "
                                     "is not emulated")
    policy = spec.get("failurePolicy") or {}
    strategy = policy.get("restartStrategy", "Recreate")
    if strategy not in ("Recreate", "BlockingRecreate"):
        raise RehearsalError(f"failurePolicy.restartStrategy {strategy}: JobSet's webhook refuses it while its feature "
                             "gate (InPlaceRestart) is off, as it is by default in v0.12")
    for rule in policy.get("rules") or []:
        if rule.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts"):
            raise RehearsalError(f"failurePolicy rule {rule['name']}: action {rule['action']}: JobSet's webhook refuses "
                                 "it while the RestartJob feature gate is off, as it is by default in v0.12")
        if rule.get("action") not in ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"):
            raise RehearsalError(f"failurePolicy rule {rule['name']}: unknown action {rule.get('action')!r}")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                raise RehearsalError(f"failurePolicy rule {rule['name']}: {reason!r} is not a Job failure reason "
                                     f"({', '.join(JOB_FAILURE_REASONS)})")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                raise RehearsalError(f"failurePolicy rule {rule['name']}: targetReplicatedJobs names {target!r}, "
                                     "which is not a replicatedJob")
    for target in spec["successPolicy"].get("targetReplicatedJobs") or []:
        if target not in names:
            raise RehearsalError(f"successPolicy.targetReplicatedJobs names {target!r}, which is not a replicatedJob")
