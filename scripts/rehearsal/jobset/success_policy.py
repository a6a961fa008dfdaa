"""When a JobSet has succeeded (executeSuccessPolicy, pkg/controllers/jobset_controller.go,
kubernetes-sigs/jobset v0.12.0)."""

from __future__ import annotations


def met(success_policy: dict, replicas: dict[str, int], complete: list[str]) -> bool:
    """Whether enough of the target replicatedJobs' Jobs are complete. `replicas`: replicatedJob ->
    its number of Jobs; `complete`: the replicatedJob of every complete Job. Operator All needs
    every Job of the targets (every replicatedJob when none is named), Any one of them."""
    targets = success_policy.get("targetReplicatedJobs") or list(replicas)
    done = sum(1 for replicated_job in complete if replicated_job in targets)
    expected = 1 if success_policy.get("operator", "All") == "Any" else sum(replicas[name] for name in targets)
    return done >= expected
