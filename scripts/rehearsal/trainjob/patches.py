"""A TrainJob's runtimePatches over its runtime's JobSet template, as Kubeflow Trainer v2.3.0 merges
them (pkg/runtime/core/trainingruntime.go):

- each patch's `trainingRuntimeSpec.template.spec` goes through Kubernetes' strategic merge patch
  onto the runtime's JobSetSpec, one patch after the other, and the replicatedJobs keep the
  runtime's order (mergeRuntimePatches, lines 251-290);
- the JobSet's labels and annotations are the runtime template's, then each patch's
  `template.metadata` ones over them (newRuntimeInfo, lines 144-161).

The strategic merge patch (k8s.io/apimachinery strategicpatch) merges maps key by key, merges the lists Kubernetes' types mark `patchStrategy:"merge"` item by
item on their merge key (an item the original lacks is appended), keeps of a `retainKeys` list
item (a volume) only the keys the patch gives, and replaces every other list whole. The lists a
runtime patch can reach, and their keys: replicatedJobs (name; JobSet v0.12.0 jobset_types.go:127),
containers and initContainers (name), env (name), volumes (name, retainKeys), volumeMounts
(mountPath), imagePullSecrets (name) and schedulingGates (name), from k8s.io/api core/v1
types.go; tolerations have no strategy and are replaced. A patch is Go's json.Marshal of the typed
TrainJob's fields, so it holds no null and no `$patch` directive (the CRD prunes them)."""

from __future__ import annotations

import copy

# list field -> (merge key, retainKeys)
MERGE_KEYS = {
    "replicatedJobs": ("name", False),
    "containers": ("name", False),
    "initContainers": ("name", False),
    "env": ("name", False),
    "volumes": ("name", True),
    "volumeMounts": ("mountPath", False),
    "imagePullSecrets": ("name", False),
    "schedulingGates": ("name", False),
}


def strategic_merge(original, patch, field: str = ""):
    """`patch` merged onto `original` (neither changed), as the strategic merge patch does for the
    fields above."""
    if isinstance(patch, dict) and isinstance(original, dict):
        merged = copy.deepcopy(original)
        for key, value in patch.items():
            if key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(patch, list) and isinstance(original, list) and field in MERGE_KEYS:
        key, retain = MERGE_KEYS[field]
        merged = copy.deepcopy(original)
        for item in patch:
            at = next((i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item.get(key)), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                kept = {k: v for k, v in merged[at].items() if k in item} if retain else merged[at]
                merged[at] = strategic_merge(kept, item)
        return merged
    return copy.deepcopy(patch)


def patched_template(template: dict, patches: list[dict]) -> dict:
    """The runtime's JobSet template (`spec.template`) with every runtime patch applied: its spec
    merged, its labels and annotations the ones the JobSet gets. A new dict."""
    spec = copy.deepcopy(template.get("spec") or {})
    order = {rjob["name"]: position for position, rjob in enumerate(spec.get("replicatedJobs") or [])}
    metadata = copy.deepcopy(template.get("metadata") or {})
    for patch in patches:
        patch_template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        for kind in ("labels", "annotations"):
            given = (patch_template.get("metadata") or {}).get(kind) or {}
            if given:
                metadata[kind] = {**(metadata.get(kind) or {}), **given}
        if patch_template.get("spec") is not None:
            spec = strategic_merge(spec, patch_template["spec"])
    # sort.SliceStable on the runtime's positions; a replicatedJob a patch adds (the webhook lets it
    # through, see build.validate) has none, so Go's map reads 0 and it lands after the first.
    spec["replicatedJobs"] = sorted(spec.get("replicatedJobs") or [], key=lambda r: order.get(r["name"], 0))
    return {"metadata": metadata, "spec": spec}
