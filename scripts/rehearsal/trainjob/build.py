"""The JobSet plugin of Kubeflow Trainer v2.3.0: what its webhook check refuses in a TrainJob, and
the JobSet it builds (pkg/runtime/framework/plugins/jobset/jobset.go and builder.go).

Refused at admission (JobSet.Validate, jobset.go:91-212), on the runtime with the TrainJob's
runtimePatches already merged (core/trainingruntime.go:304-316 builds the runtime info first):
- an initializer (dataset or model) for a runtime without that initializer's Job, container and
  volume mount; the TensorFlow runtimes have none;
- a runtimePatches manager that is not a domain-prefixed path (validation.IsDomainPrefixedPath);
- env for the `node`, `dataset-initializer` or `model-initializer` containers through a patch (a
  TrainJob gives the trainer's env in spec.trainer.env).
The same function also refuses a patch naming a replicatedJob or container the runtime lacks;
but it lists the names from the patched template, where the patch has already added them, so
through the webhook that check never fires: the JobSet is then built with the patch's item (a
container without an image), and the API server refuses that JobSet, which the TrainJob
controller reports as an event (TrainJobResourcesCreationFailed). Read from the code, not run.

The build (JobSet.Build, jobset.go:325-436; SyncParallelCount, 302-323; Builder.Trainer,
builder.go:113-158):
- each replicatedJob's Job gets parallelism and completions equal to its pod count (pod_sets,
  ml_policy);
- each replicatedJob labelled trainer gets replicas 1, and its `node` container the TrainJob's
  image, command and args, when given, and the TrainJob's env upserted;
- the JobSet is named and placed as the TrainJob, labelled and annotated as the runtime's
  template (patches.py), and suspended as the TrainJob is."""

from __future__ import annotations

import copy
import json
import re

from scripts.rehearsal.runner import RehearsalError
from scripts.rehearsal.trainjob import ml_policy
from scripts.rehearsal.trainjob.pod_sets import (DATASET_INITIALIZER, MODEL_INITIALIZER, NODE, TRAINER, PodSet, ancestor_of,
                                                 pod_spec_of)

INITIALIZER_VOLUME = "initializer"  # jobsetplgconsts.VolumeNameInitializer
RUNTIME_REF_PATH, PATCHES_PATH = "spec.runtimeRef", "spec.runtimePatches"
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_HTTP_PATH = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"


def go_json(value) -> str:
    """A value as Go's json.Marshal writes it in a field error (compact)."""
    return json.dumps(value, separators=(",", ":"))


def invalid(path: str, value, detail: str) -> str:
    """field.Invalid(...).Error(): a string value quoted, another as JSON (apimachinery field/errors.go)."""
    shown = json.dumps(value) if isinstance(value, str) else go_json(value)
    return f"{path}: Invalid value: {shown}: {detail}"


def domain_prefixed_path_errors(path: str, value: str) -> list[str]:
    """validation.IsDomainPrefixedPath (k8s.io/apimachinery v0.36 pkg/util/validation/validation.go:96-118)."""
    if not value:
        return [f"{path}: Required value"]
    host, slash, rest = value.partition("/")
    if not slash or not host or not rest:
        return [invalid(path, value, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    errors = []
    if len(host) > 253:
        errors.append(invalid(path, host, "must be no more than 253 characters"))
    if not re.fullmatch(_DNS1123_SUBDOMAIN, host):
        errors.append(invalid(path, host, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                                          "characters, '-' or '.', and must start and end with an alphanumeric character "
                                          f"(e.g. 'example.com', regex used for validation is '{_DNS1123_SUBDOMAIN}')"))
    if not re.fullmatch(_HTTP_PATH, rest):
        return errors + [invalid(path, rest, f"Invalid path (regex used for validation is '{_HTTP_PATH}')")]
    return errors


def validate(spec: dict, trainjob: dict, runtime_ref: dict) -> list[str]:
    """JobSet.Validate's errors for a TrainJob on this patched template spec, each as field.Error prints it."""
    job_spec = trainjob.get("spec") or {}
    errors = []
    names = {}
    for rjob in spec.get("replicatedJobs") or []:
        pod_spec = pod_spec_of(rjob)
        names[rjob["name"]] = {c["name"] for c in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]}
    for kind, initializer, config in (("dataset", DATASET_INITIALIZER, "datasetConfig"), ("model", MODEL_INITIALIZER, "modelConfig")):
        if (job_spec.get("initializer") or {}).get(kind) is None:
            continue
        if initializer not in names:
            errors.append(invalid(RUNTIME_REF_PATH, runtime_ref, f"must have {initializer} job when trainJob is configured "
                                                                 f"with input {config}"))
        elif initializer not in names[initializer]:
            errors.append(invalid(RUNTIME_REF_PATH, runtime_ref, f"must have container with name - {initializer} in the "
                                                                 f"{initializer} job"))
        elif not _mounts_initializer_volume(spec, initializer):
            errors.append(invalid(RUNTIME_REF_PATH, runtime_ref, f"must have volumeMount with name - {INITIALIZER_VOLUME} "
                                                                 f"in container {initializer} of the {initializer} job"))
    patches = job_spec.get("runtimePatches") or []
    for patch in patches:
        errors += domain_prefixed_path_errors(f"{PATCHES_PATH}.manager", patch.get("manager", ""))
        template_spec = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")) or {}
        for rjob_patch in template_spec.get("replicatedJobs") or []:
            if rjob_patch.get("name") not in names:
                errors.append(invalid(PATCHES_PATH, patches, "must not have replicated job that doesn't exist in the "
                                                             "runtime job template"))
                continue
            pod_patch = ((((rjob_patch.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
            for container in pod_patch.get("initContainers") or []:
                if container.get("name") not in names[rjob_patch["name"]]:
                    errors.append(invalid(PATCHES_PATH, patches, "must not have initContainer that doesn't exist in "
                                                                 f"the runtime job {rjob_patch['name']}"))
            for container in pod_patch.get("containers") or []:
                if container.get("name") not in names[rjob_patch["name"]]:
                    errors.append(invalid(PATCHES_PATH, patches, "must not have container that doesn't exist in the "
                                                                 f"runtime job {rjob_patch['name']}"))
                elif container.get("env") and container["name"] in (DATASET_INITIALIZER, MODEL_INITIALIZER, NODE):
                    errors.append(invalid(PATCHES_PATH, patches, f"must not have envs for the {DATASET_INITIALIZER}, "
                                                                 f"{MODEL_INITIALIZER}, {NODE} containers"))
    return errors


def _mounts_initializer_volume(spec: dict, initializer: str) -> bool:
    for rjob in spec.get("replicatedJobs") or []:
        if rjob["name"] != initializer:
            continue
        for container in pod_spec_of(rjob).get("containers") or []:
            if container.get("name") == initializer and any(
                    mount.get("name") == INITIALIZER_VOLUME for mount in container.get("volumeMounts") or []):
                return True
    return False


def build(template: dict, sets: list[PodSet], trainjob: dict) -> dict:
    """The JobSet Trainer applies for `trainjob`: `template` is the patched runtime template
    (patches.patched_template) whose spec the policies have already changed, `sets` its pod sets."""
    spec = copy.deepcopy(template["spec"])
    for pod_set in sets:
        rjob = next(r for r in spec["replicatedJobs"] if r["name"] == pod_set.name)
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec["parallelism"] = job_spec["completions"] = pod_set.count
    trainer = (trainjob.get("spec") or {}).get("trainer")
    for rjob in spec["replicatedJobs"]:
        if ancestor_of(rjob) != TRAINER:
            continue
        rjob["replicas"] = 1
        for container in pod_spec_of(rjob).get("containers") or []:
            if container.get("name") != NODE or trainer is None:
                continue
            for field in ("image", "command", "args"):
                if trainer.get(field) is not None:
                    container[field] = copy.deepcopy(trainer[field])
            if trainer.get("env"):
                container["env"] = ml_policy.upsert_env(container.get("env") or [], trainer["env"])
    metadata = trainjob["metadata"]
    jobset_metadata = {"name": metadata["name"], "namespace": metadata.get("namespace", "default")}
    for kind in ("labels", "annotations"):
        if template["metadata"].get(kind):
            jobset_metadata[kind] = dict(template["metadata"][kind])
    spec["suspend"] = bool((trainjob.get("spec") or {}).get("suspend", False))
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": jobset_metadata, "spec": spec}


def refuse(errors: list[str], webhook: str) -> None:
    """The API server's answer when a webhook refuses: one line, its errors joined as
    utilerrors.NewAggregate prints them (one alone, else `[a, b]`)."""
    if errors:
        joined = errors[0] if len(errors) == 1 else "[" + ", ".join(dict.fromkeys(errors)) + "]"
        raise RehearsalError(f'admission webhook "{webhook}" denied the request: {joined}')
