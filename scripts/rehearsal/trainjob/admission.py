"""What the API server makes of a TrainJob and its runtime before the TrainJob controller sees
them, in Kubeflow Trainer v2.3.0: the CRDs' defaults and validation rules
(pkg/apis/trainer/v1alpha1/trainjob_types.go, trainingruntime_types.go, as generated into
manifests/base/crds/), and the validating webhooks (pkg/webhooks/). Each refusal is one line, in
the words the API server would use.

- A ClusterTrainingRuntime (or TrainingRuntime) gets its CRD defaults (a replicatedJob's
  `replicas: 1` and `groupName: default`, failurePolicy's `restartStrategy: Recreate`), and its
  webhook refuses a replicatedJob labelled trainer (or as an initializer) that has more than one
  replica or lacks the container that label requires, `node` for the trainer
  (validateReplicatedJobs, trainingruntime_webhook.go:66-105).
- A TrainJob gets `runtimeRef.apiGroup: trainer.kubeflow.org`, `runtimeRef.kind:
  ClusterTrainingRuntime`, `suspend: false` and `managedBy:
  trainer.kubeflow.org/trainjob-controller` (trainjob_types.go:127,147,167,174); its CRD refuses
  a name that is not an RFC 1035 label of at most 63 characters (lines 36-37), an
  activeDeadlineSeconds below 1 (137), another managedBy (148), and two runtimePatches of one
  manager (listType=map, 120-124).
- The TrainJob webhook refuses a runtimeRef of any other group and kind ("unsupported runtime",
  trainjob_webhook.go:110-121) and a runtime that does not exist, with the runtime's own lookup
  error (ClusterTrainingRuntime.ValidateObjects, pkg/runtime/core/clustertrainingruntime.go:99-108;
  TrainingRuntime's, trainingruntime.go:304-314, in the TrainJob's namespace); it warns on a runtime
  labelled `trainer.kubeflow.org/support: deprecated`. The plugins' own checks follow (build.validate).
"""

from __future__ import annotations

import copy
import json
import re

from scripts.rehearsal.runner import RehearsalError
from scripts.rehearsal.trainjob.manifest import CLUSTER_RUNTIME, RUNTIME
from scripts.rehearsal.trainjob.pod_sets import DATASET_INITIALIZER, MODEL_INITIALIZER, NODE, TRAINER, ancestor_of

GROUP = "trainer.kubeflow.org"
TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
CLUSTER_RUNTIME_WEBHOOK = "validator.clustertrainingruntime.trainer.kubeflow.org"
RUNTIME_WEBHOOK = "validator.trainingruntime.trainer.kubeflow.org"
CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
DEPRECATED_LABEL, DEPRECATED = "trainer.kubeflow.org/support", "deprecated"
DEPRECATION_POLICY = "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
# The container each ancestor label requires (trainingruntime_webhook.go:39-45).
REQUIRED_CONTAINER = {TRAINER: NODE, MODEL_INITIALIZER: MODEL_INITIALIZER, DATASET_INITIALIZER: DATASET_INITIALIZER}
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def admitted_runtime(runtime: dict) -> dict:
    """The runtime as the API server stores it; RehearsalError for what its webhook refuses."""
    runtime = copy.deepcopy(runtime)
    kind, name = runtime["kind"], (runtime.get("metadata") or {}).get("name")
    template_spec = ((runtime.get("spec") or {}).get("template") or {}).setdefault("spec", {})
    for rjob in template_spec.get("replicatedJobs") or []:
        rjob.setdefault("replicas", 1)
        rjob.setdefault("groupName", "default")
    if template_spec.get("failurePolicy") is not None:
        template_spec["failurePolicy"].setdefault("restartStrategy", "Recreate")
    errors = []
    path = "spec.template.spec.replicatedJobs"
    for index, rjob in enumerate(template_spec.get("replicatedJobs") or []):
        ancestor = ancestor_of(rjob)
        if ancestor not in REQUIRED_CONTAINER:
            continue
        if rjob["replicas"] != 1:
            errors.append(f"{path}[{index}].replicas: Invalid value: {rjob['replicas']}: always must be 1")
        containers = rjob["template"]["spec"]["template"]["spec"].get("containers") or []
        if not any(c.get("name") == REQUIRED_CONTAINER[ancestor] for c in containers):
            errors.append(f"{path}[{index}].template.spec.template.spec.containers: Invalid value: "
                          f"{json.dumps(containers, separators=(',', ':'))}: must contain the required container "
                          f"for the ancestor: {ancestor}")
    if errors:
        webhook = CLUSTER_RUNTIME_WEBHOOK if kind == CLUSTER_RUNTIME else RUNTIME_WEBHOOK
        joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise RehearsalError(f'{kind} {name}: admission webhook "{webhook}" denied the request: {joined}')
    return runtime


def admitted_trainjob(trainjob: dict) -> dict:
    """The TrainJob with its CRD defaults; RehearsalError for what the CRD refuses."""
    trainjob = copy.deepcopy(trainjob)
    metadata = trainjob.setdefault("metadata", {})
    name = metadata.get("name") or ""
    spec = trainjob.setdefault("spec", {})
    ref = spec.setdefault("runtimeRef", {})
    ref.setdefault("apiGroup", GROUP)
    ref.setdefault("kind", CLUSTER_RUNTIME)
    spec.setdefault("suspend", False)
    spec.setdefault("managedBy", CONTROLLER)
    invalid = f'TrainJob.{GROUP} "{name}" is invalid'
    if not _RFC1035.fullmatch(name):
        raise RehearsalError(f'{invalid}: <nil>: Invalid value: "object": metadata.name must match RFC 1035 DNS label format')
    if len(name) > 63:
        raise RehearsalError(f'{invalid}: <nil>: Invalid value: "object": metadata.name must be no more than 63 characters')
    if not ref.get("name"):
        raise RehearsalError(f"{invalid}: spec.runtimeRef.name: Required value")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline < 1):
        raise RehearsalError(f"{invalid}: spec.activeDeadlineSeconds: Invalid value: {deadline}: "
                             "spec.activeDeadlineSeconds in body should be greater than or equal to 1")
    if spec["managedBy"] not in (CONTROLLER, MULTIKUEUE):
        raise RehearsalError(f'{invalid}: spec.managedBy: Invalid value: "string": ManagedBy must be {CONTROLLER} '
                             f"or {MULTIKUEUE} if set")
    managers = [patch.get("manager") for patch in spec.get("runtimePatches") or []]
    for index, manager in enumerate(managers):
        if not manager:
            raise RehearsalError(f"{invalid}: spec.runtimePatches[{index}].manager: Required value")
        if manager in managers[:index]:
            raise RehearsalError(f'{invalid}: spec.runtimePatches[{index}]: Duplicate value: map[string]interface {{}}'
                                 f'{{"manager":"{manager}"}}')
    if len(managers) > 16:
        raise RehearsalError(f"{invalid}: spec.runtimePatches: Too many: {len(managers)}: must have at most 16 items")
    return trainjob


def runtime_of(trainjob: dict, runtimes: list[dict]) -> tuple[dict, list[str]]:
    """(the runtime the admitted TrainJob names, the webhook's warnings); RehearsalError with the
    webhook's own refusal when there is no such runtime."""
    spec, namespace = trainjob["spec"], trainjob["metadata"].get("namespace", "default")
    ref = spec["runtimeRef"]
    key = f"{ref.get('kind', '')}.{ref.get('apiGroup', '')}"  # schema.GroupKind.String(), runtime.go:246-251
    denied = f'TrainJob {trainjob["metadata"]["name"]}: admission webhook "{TRAINJOB_WEBHOOK}" denied the request: '
    if key not in (f"{CLUSTER_RUNTIME}.{GROUP}", f"{RUNTIME}.{GROUP}"):
        raise RehearsalError(f"{denied}unsupported runtime: {key}")
    ref_json = json.dumps({"name": ref["name"], "apiGroup": ref["apiGroup"], "kind": ref["kind"]}, separators=(",", ":"))
    matching = [runtime for runtime in runtimes if runtime["kind"] == ref["kind"]
                and runtime["metadata"].get("name") == ref["name"]
                and (ref["kind"] == CLUSTER_RUNTIME or runtime["metadata"].get("namespace", "default") == namespace)]
    if not matching:
        # The manager's client reads from its cache, whose NotFound names the Kind as the resource
        # (controller-runtime v0.24.1 pkg/cache/internal/cache_reader.go:75-79).
        not_found = f'{ref["kind"]}.{GROUP} "{ref["name"]}" not found'
        if ref["kind"] == CLUSTER_RUNTIME:
            detail = f"spec.RuntimeRef: Invalid value: {ref_json}: {not_found}: specified clusterTrainingRuntime must be created before the TrainJob is created"
        else:
            detail = f"spec.runtimeRef: Invalid value: {ref_json}: {not_found}: specified trainingRuntime must be created before the TrainJob is created"
        raise RehearsalError(denied + detail)
    runtime = matching[-1]  # applied last wins, as a later `kubectl apply` of the same name would
    warnings = []
    if ref["kind"] == CLUSTER_RUNTIME and (runtime["metadata"].get("labels") or {}).get(DEPRECATED_LABEL) == DEPRECATED:
        warnings.append(f'Warning: Referenced ClusterTrainingRuntime "{ref["name"]}" is deprecated and will be removed in a '
                        f"future release of Kubeflow Trainer. See runtime deprecation policy: {DEPRECATION_POLICY}")
    return runtime, warnings
