"""What a failed pod and a failed Job lead to, as plain functions of what happened: Kubernetes'
podFailurePolicy (matchPodFailurePolicy, pkg/controller/job/pod_failure_policy.go), the kubelet's
crash-loop back-off, and the JobSet's failurePolicy (findFirstFailedPolicyRuleAndJob,
ruleIsApplicable in pkg/controllers/failure_policy.go)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.rehearsal.jobset.pods import Pod

DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes' default for a Job

# The kubelet's crash-loop back-off before it restarts a container in place: 10 s, doubling, at most 5 min.
CRASH_LOOP_FIRST_SECONDS, CRASH_LOOP_MAX_SECONDS = 10, 300

# The Job conditions' messages, as Kubernetes' Job controller writes them (job_controller.go,
# pod_failure_policy.go): what onJobFailureMessagePatterns is matched against.
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
DEADLINE_MESSAGE = "Job was active longer than specified deadline"


def pod_failure_rule(job_spec: dict, exit_code: int, disrupted: bool, container: str = "") -> tuple[int, dict] | None:
    """(index, rule): the first of the Job's podFailurePolicy rules that matches a failed pod
    (Kubernetes' matchPodFailurePolicy); None when none does."""
    for index, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules", [])):
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if on_codes:
            if on_codes.get("containerName") not in (None, container):
                continue
            values = set(on_codes.get("values", []))
            # NotIn never matches exit code 0 (a container that succeeded did not fail the pod).
            if exit_code != 0 and (exit_code in values) == (on_codes.get("operator") == "In"):
                return index, rule
        elif on_conditions and disrupted and any(
                c.get("type") == "DisruptionTarget" and c.get("status", "True") == "True" for c in on_conditions):
            return index, rule
    return None


def pod_failure_action(job_spec: dict, exit_code: int, disrupted: bool, container: str = "") -> str:
    """FailJob, Ignore or Count (also when no rule matches) for a failed pod."""
    matched = pod_failure_rule(job_spec, exit_code, disrupted, container)
    return matched[1]["action"] if matched else "Count"


def pod_failure_message(job_spec: dict, exit_code: int, disrupted: bool, pod: Pod, namespace: str) -> str:
    """The failed Job's condition message when a FailJob rule matched, as the Job controller writes it."""
    index, rule = pod_failure_rule(job_spec, exit_code, disrupted, pod.container)
    if rule.get("onExitCodes"):
        return (f"Container {pod.container} for pod {namespace}/{pod.name} failed with exit code {exit_code} "
                f"matching {rule['action']} rule at index {index}")
    return f"Pod {namespace}/{pod.name} has condition DisruptionTarget matching {rule['action']} rule at index {index}"


def jobset_failure_rule(failure_policy: dict, replicated_job: str, reason: str, message: str) -> dict | None:
    """The first failurePolicy rule a failed Job matches; None when none does."""
    rule, _ = first_failed_rule_and_job(failure_policy, [(replicated_job, reason, message)])
    return rule


def first_failed_rule_and_job(failure_policy: dict, failed: list[tuple[str, str, str]]) -> tuple[dict | None, int]:
    """(rule, i): what JobSet decides over every Job failed when it looks (findFirstFailedPolicyRuleAndJob).
    `failed`: (replicatedJob, reason, message) of each failed Job, earliest failure first. The rules
    are tried in their order, each over every failed Job, and the first that matches one decides,
    with the earliest such Job: so a rule written first wins whichever Job failed first. None and
    the earliest failed Job (0) when no rule matches any."""
    for rule in failure_policy.get("rules") or []:
        for index, (replicated_job, reason, message) in enumerate(failed):
            if rule_applies(rule, replicated_job, reason, message):
                return rule, index
    return None, 0


def rule_applies(rule: dict, replicated_job: str, reason: str, message: str) -> bool:
    """ruleIsApplicable: the rule's reasons, message patterns and target replicatedJobs all match."""
    reasons, targets = rule.get("onJobFailureReasons") or [], rule.get("targetReplicatedJobs") or []
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if reasons and reason not in reasons:
        return False
    if patterns and not any(_search(pattern, message) for pattern in patterns):
        return False
    return not targets or replicated_job in targets


def _search(pattern: str, text: str) -> bool:
    # An invalid pattern never matches (anyMatchFound logs it and goes on).
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def jobset_failure_action(failure_policy: dict, replicated_job: str, reason: str, message: str = "") -> str:
    """FailJobSet, RestartJobSet or RestartJobSetAndIgnoreMaxRestarts for a failed Job; the
    default is RestartJobSet (defaultFailurePolicyRuleAction)."""
    rule = jobset_failure_rule(failure_policy, replicated_job, reason, message)
    return rule["action"] if rule else "RestartJobSet"


def crash_loop_delay(restarts: int) -> float:
    """The kubelet's back-off before the `restarts`-th restart in place of a container."""
    return min(CRASH_LOOP_FIRST_SECONDS * 2 ** max(restarts - 1, 0), CRASH_LOOP_MAX_SECONDS)
