"""How many pods each replicatedJob of the runtime gets, and the trainer's resources, as Kubeflow
Trainer v2.3.0 reads them from the runtime and the TrainJob before any policy applies
(newRuntimeInfo, pkg/runtime/core/trainingruntime.go:186-246; runtime.WithPodSet,
pkg/runtime/runtime.go:140-155):

- a replicatedJob's pods are its Job's parallelism (1 when unset); one labelled
  `trainer.kubeflow.org/trainjob-ancestor-step: trainer` gets the runtime's mlPolicy.numNodes (1
  when unset) instead, whenever the runtime has an mlPolicy; never fewer than 1;
- the TrainJob's resourcesPerNode is merged into the `node` container of every replicatedJob
  labelled trainer, when the runtime has an mlPolicy (without one it is dropped): limits and
  requests key by key, the TrainJob's value winning, and claims by name
  (MergeResourceRequirements, pkg/util/trainingruntime/trainingruntime.go:45-65)."""

from __future__ import annotations

import dataclasses

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER = "trainer"  # constants.AncestorTrainer
NODE = "node"  # constants.Node: the trainer's container, and the replicatedJob name the runtimes use
DATASET_INITIALIZER, MODEL_INITIALIZER = "dataset-initializer", "model-initializer"


@dataclasses.dataclass
class PodSet:
    """One replicatedJob as Trainer's plugins see it (runtime.PodSet)."""

    name: str
    ancestor: str | None
    count: int


def pod_spec_of(rjob: dict) -> dict:
    """A replicatedJob's pod spec; {} for one a runtime patch added without a template (Go's zero value)."""
    return ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}


def ancestor_of(rjob: dict) -> str | None:
    return ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL)


def pod_sets(spec: dict, ml_policy: dict | None) -> list[PodSet]:
    """The replicatedJobs of a (patched) JobSet template spec, in order, with their pod counts."""
    sets = []
    for rjob in spec.get("replicatedJobs") or []:
        count = int(((rjob.get("template") or {}).get("spec") or {}).get("parallelism", 1))
        ancestor = ancestor_of(rjob)
        if ancestor == TRAINER and ml_policy is not None:
            count = int(ml_policy.get("numNodes", 1))
        sets.append(PodSet(rjob["name"], ancestor, max(count, 1)))
    return sets


def merge_resources(spec: dict, ml_policy: dict | None, trainjob: dict) -> None:
    """resourcesPerNode into the trainer's `node` containers, in place."""
    per_node = ((trainjob.get("spec") or {}).get("trainer") or {}).get("resourcesPerNode")
    if per_node is None or ml_policy is None:
        return
    launcher_as_node = bool((ml_policy.get("mpi") or {}).get("runLauncherAsNode"))
    for rjob in spec.get("replicatedJobs") or []:
        if not (ancestor_of(rjob) == TRAINER or (launcher_as_node and rjob["name"] == NODE)):
            continue
        for container in pod_spec_of(rjob).get("containers") or []:
            if container.get("name") == NODE:
                base = container.get("resources") or {}
                merged = {kind: {**(base.get(kind) or {}), **(per_node.get(kind) or {})}
                          for kind in ("limits", "requests") if base.get(kind) or per_node.get(kind)}
                claims = {claim["name"]: claim for claim in base.get("claims") or []}
                claims.update({claim["name"]: {**claims.get(claim["name"], {}), **claim}
                               for claim in per_node.get("claims") or []})
                if claims:
                    merged["claims"] = list(claims.values())
                container["resources"] = merged
                break
