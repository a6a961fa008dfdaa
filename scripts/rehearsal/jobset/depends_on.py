"""When a replicatedJob's Jobs are created: `dependsOn` (pkg/controllers/depends_on.go,
dependencyReachedStatus) and the deprecated `startupPolicy: InOrder` (startup_policy.go,
allReplicasStarted), both judged on the status of the Jobs already there (kubernetes-sigs/jobset
v0.12.0)."""

from __future__ import annotations


def requirements(spec: dict) -> dict[str, list[tuple[str, str]]]:
    """replicatedJob -> the (replicatedJob, status) pairs it waits for: its dependsOn entries, and
    under InOrder the one listed before it, Ready."""
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
    names = [rjob["name"] for rjob in spec["replicatedJobs"]]
    needs = {}
    for position, rjob in enumerate(spec["replicatedJobs"]):
        needs[rjob["name"]] = [(dependency["name"], dependency["status"]) for dependency in rjob.get("dependsOn") or []]
        if in_order and position:
            needs[rjob["name"]].append((names[position - 1], "Ready"))
    return needs


def reached(status: str, replicas: int, ready: int, succeeded: int, failed: int) -> bool:
    """Whether a replicatedJob of `replicas` Jobs has reached `status`, from how many of its Jobs
    are ready (still active, and their succeeded plus Ready pods reach their parallelism), have
    succeeded, or have failed: Complete needs every Job succeeded; Ready counts every Job that is
    ready, succeeded or failed (a failed Job is left to the failurePolicy)."""
    if status == "Complete":
        return succeeded == replicas
    return ready + succeeded + failed == replicas
