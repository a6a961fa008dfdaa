"""The runtime's mlPolicy, as Kubeflow Trainer v2.3.0 enforces it. The TensorFlow runtimes name no
framework plugin, so the plainML plugin applies (pkg/runtime/framework/plugins/plainml/plainml.go:46-71):

- the TrainJob's numNodes becomes the pod count of the first replicatedJob labelled trainer
  (FindPodSetByAncestor, pkg/runtime/runtime.go:216-221: the first in the runtime's order), and
  of no other;
- the TrainJob's env is upserted into that replicatedJob's `node` container: an entry of the same
  name is replaced where it stands, a new one appended (UpsertEnvVars, pkg/apply/apply.go:37-87).

plainML tells the pods nothing else: no numNodes, no rank, no address. The torch, mpi, jax,
xgboost and flux policies each add their own environment, files or jobs (torch.go, mpi.go,
jax.go, xgboost.go, flux.go); the rehearsal does not emulate them and says so."""

from __future__ import annotations

from scripts.rehearsal.runner import RehearsalError
from scripts.rehearsal.trainjob.pod_sets import NODE, TRAINER, PodSet, pod_spec_of

OTHER_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")


def check(ml_policy: dict | None, runtime_name: str) -> None:
    """Refuses, in one line, a runtime whose mlPolicy names a framework plugin."""
    named = [policy for policy in OTHER_POLICIES if (ml_policy or {}).get(policy) is not None]
    if named:
        raise RehearsalError(f"runtime {runtime_name}: mlPolicy.{named[0]} is Trainer's {named[0]} plugin, which "
                             "the rehearsal does not emulate (it runs plainML runtimes, such as the TensorFlow ones)")


def upsert_env(env: list[dict], entries: list[dict]) -> list[dict]:
    """`env` with each entry upserted by name: replaced in place, or appended."""
    merged = [dict(entry) for entry in env]
    for entry in entries:
        at = next((i for i, old in enumerate(merged) if old.get("name") == entry.get("name")), None)
        if at is None:
            merged.append(dict(entry))
        else:
            merged[at] = dict(entry)
    return merged


def enforce(sets: list[PodSet], spec: dict, trainjob: dict) -> None:
    """plainML, in place: numNodes into the first trainer pod set, the TrainJob's env into its `node`
    container (`spec` is the JobSet template spec the pod sets came from)."""
    trainer = (trainjob.get("spec") or {}).get("trainer")
    if trainer is None:
        return
    first = next((index for index, pod_set in enumerate(sets) if pod_set.ancestor == TRAINER), None)
    if first is None:
        return
    if trainer.get("numNodes") is not None:
        sets[first].count = int(trainer["numNodes"])
    for container in pod_spec_of(spec["replicatedJobs"][first]).get("containers") or []:
        if container.get("name") == NODE and trainer.get("env"):
            container["env"] = upsert_env(container.get("env") or [], trainer["env"])
