"""Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): the TrainJob for either TensorFlow runtime of
manifests/runtimes/, and the strict check of any TrainJob or runtime against the API's own models
(kubeflow-trainer-api 2.3.0).

A request becomes a TrainJob on `tensorflow-distributed` (MultiWorkerMirrored: the chief and the
workers of the request are its numNodes pods, the chief being worker 0) or on
`tensorflow-parameter-server` (a chief, numNodes workers, one parameter server and an evaluator).
What the runtime fixes, a TrainJob cannot change, and a request that asks for it is refused in
one line: the restarts (the runtime's failurePolicy; runtimePatches reach only pod templates), the
number of parameter servers, an evaluator on its own machine or image."""

from __future__ import annotations

import re

from scripts.jobspec.request import DEFAULT_MAX_RESTARTS, JobRequest, SpecError, vertex_only
from trainer import cluster as trainer_cluster

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIMES = {"mwms": "tensorflow-distributed", "pss": "tensorflow-parameter-server"}
# Each runtime's replicatedJobs, in its order (tests/unit/test_trainjob.py holds them to the manifests).
RUNTIME_JOBS = {"tensorflow-distributed": ("node",), "tensorflow-parameter-server": ("node", "chief", "ps", "evaluator")}
# Who writes the TrainJob's runtimePatches: Trainer asks for a domain-prefixed path (jobset.go:176).
PATCH_MANAGER = "cassava-trainer/submit-job"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def trainjob_header(manifest: dict) -> str:
    """The comment printed above a TrainJob: what it is and what the cluster needs to run it."""
    runtime = manifest["spec"]["runtimeRef"]["name"]
    queue = manifest["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL)
    lines = [f"A Kubeflow Trainer v2 TrainJob ({API_VERSION}) on the ClusterTrainingRuntime {runtime}:",
             "each pod resolves its TF_CONFIG itself (trainer/cluster.py). Needs Kubeflow Trainer v2.3 and the",
             f"runtime: kubectl apply -f manifests/runtimes/{runtime}.yaml"]
    if queue:
        lines.append(f"and Kueue, with a LocalQueue {queue} in namespace {manifest['metadata'].get('namespace', 'default')}")
    lines.append("Apply with: kubectl apply -f FILE")
    return "".join(f"# {line}\n" for line in lines)


def trainjob_manifest(request: JobRequest, namespace: str, queue: str | None = None) -> dict:
    """A TrainJob for `request` on the TensorFlow runtime of its strategy."""
    vertex_only(request, "a TrainJob")
    name = request.name.lower().replace("_", "-")
    runtime = RUNTIMES[request.strategy]
    chief, workers = request.pool("chief"), request.pool("worker")
    if request.max_restarts != DEFAULT_MAX_RESTARTS:
        raise SpecError(f"--max-restarts {request.max_restarts}: the runtime {runtime} restarts a TrainJob's JobSet at "
                        f"most {DEFAULT_MAX_RESTARTS} times (its failurePolicy), which a TrainJob cannot change: its "
                        "runtimePatches reach only the pod templates (trainjob_types.go JobSpecPatch)")
    if request.strategy == "mwms":
        if request.pool("evaluator"):
            raise SpecError(f"--evaluator: the runtime {runtime} has no evaluator (tensorflow-parameter-server has one)")
        nodes = chief.replicas + workers.replicas
    else:
        ps, evaluator = request.pool("ps"), request.pool("evaluator")
        if ps.replicas != 1:
            raise SpecError(f"--ps {ps.replicas}: the runtime {runtime} has one parameter server, as Trainer gives "
                            "every replicatedJob it labels trainer the runtime's mlPolicy.numNodes pods")
        if evaluator is None:
            raise SpecError(f"--strategy pss needs --evaluator: the runtime {runtime} always runs its evaluator")
        if (evaluator.image_uri, evaluator.accelerator_type, evaluator.accelerator_count) != \
                (chief.image_uri, chief.accelerator_type, chief.accelerator_count):
            raise SpecError(f"the evaluator's own machine or image: the runtime {runtime} runs every pod on the "
                            "TrainJob's one image and resourcesPerNode")
        nodes = workers.replicas
    _check_name(name, runtime, nodes)
    env = [{"name": trainer_cluster.TRAINJOB_NUM_NODES, "value": str(nodes)}]
    args = list(request.trainer_args)
    if request.base_output_dir:
        base = request.base_output_dir.rstrip("/")
        env += [{"name": "AIP_MODEL_DIR", "value": f"{base}/model/"},
                {"name": "AIP_CHECKPOINT_DIR", "value": f"{base}/checkpoints/"},
                {"name": "AIP_TENSORBOARD_LOG_DIR", "value": f"{base}/logs/"}]
        if args and "--model-dir" not in args:
            args += ["--model-dir", f"{base}/model"]
    trainer: dict = {"image": chief.image_uri}
    if args:
        # Without trainer arguments, none: the image's own CMD runs under its ENTRYPOINT.
        trainer["args"] = args
    trainer["env"] = env
    trainer["numNodes"] = nodes
    if chief.accelerator_type:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": chief.accelerator_count}}
    spec: dict = {"runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
                  "trainer": trainer}
    pod_patch: dict = {}
    if request.service_account:
        pod_patch["serviceAccountName"] = request.service_account
    if request.spot:
        pod_patch["nodeSelector"] = {GKE_SPOT_LABEL: "true"}
        pod_patch["tolerations"] = [{"key": GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    if pod_patch:
        spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": job, "template": {"spec": {"template": {"spec": dict(pod_patch)}}}} for job in RUNTIME_JOBS[runtime]]}}}}]
    if request.timeout_seconds:
        # The TrainJob's own limit, counted from its creation: Trainer fails it and deletes its JobSet.
        spec["activeDeadlineSeconds"] = request.timeout_seconds
    metadata: dict = {"name": name, "namespace": namespace}
    labels = dict(request.labels)
    if queue:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", queue) or len(queue) > 63:
            raise SpecError(f"--queue {queue!r}: a LocalQueue name is lower-case letters, digits and '-', "
                            "at most 63, starting and ending with a letter or digit")
        labels[KUEUE_QUEUE_LABEL] = queue
    if labels:
        metadata["labels"] = labels
    manifest = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    check_schema(manifest)
    return manifest


def trainjob_warnings(request: JobRequest) -> list[str]:
    """What a TrainJob for `request` gives that the request did not ask for."""
    if request.strategy == "pss" and request.pool("chief").accelerator_type:
        return [f"warning: the parameter server's and the evaluator's pods get the workers' GPUs too: resourcesPerNode "
                f"reaches every replicatedJob the runtime {RUNTIMES['pss']} labels trainer (Trainer v2.3.0, "
                "trainingruntime.go:199-237)"]
    return []


def _check_name(name: str, runtime: str, nodes: int) -> None:
    """The TrainJob's CRD takes an RFC 1035 label of at most 63 characters (trainjob_types.go:36-37);
    its JobSet, named alike, must leave its longest pod name, `{name}-{job}-0-{index}-` plus 5
    random characters, within 63."""
    if not _DNS1035.fullmatch(name) or len(name) > 63:
        raise SpecError(f"--name {name}: a TrainJob's name starts with a letter and holds at most 63 lowercase letters, "
                        "digits and '-' (its pods' DNS subdomain)")
    counts = {job: (nodes if job == "node" else 1) for job in RUNTIME_JOBS[runtime]}
    longest = max((f"{name}-{job}-0-{count - 1}-abcde" for job, count in counts.items()), key=len)
    if len(longest) > 63:
        raise SpecError(f"--name {name}: too long for a TrainJob, pod names such as {longest[:-5]}xxxxx would pass "
                        f"63 characters; use at most {63 - (len(longest) - len(name))}")


def _model(kind: str):
    from kubeflow_trainer_api import models

    return {"TrainJob": models.TrainerV1alpha1TrainJob,
            "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
            "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime}.get(kind)


def check_schema(document: dict) -> None:
    """Raises SpecError, one line, unless kubeflow-trainer-api 2.3.0's model reads `document` whole:
    a wrong type, or a field it does not know (its from_dict drops those, so what it reads is
    compared with what was given, as kubectl's strict field validation refuses them)."""
    from pydantic import ValidationError

    kind = document.get("kind")
    model = _model(kind)
    name = (document.get("metadata") or {}).get("name")
    if model is None:
        raise SpecError(f"kind {kind!r} is not a TrainJob, ClusterTrainingRuntime or TrainingRuntime")
    try:
        read = model.from_dict(document).to_dict()
    except (ValidationError, ValueError, TypeError) as error:
        # The models read each nested object with its own from_dict: the error names that object's
        # model (TrainerV1alpha1Trainer) and the field in it.
        first = error.errors()[0] if isinstance(error, ValidationError) else None
        where = ".".join([error.title, *(str(part) for part in first["loc"])]) if first else ""
        raise SpecError(f"{kind} {name}: {where + ': ' if where else ''}{first['msg'] if first else error}") from None
    difference = _first_difference(document, read, "")
    if difference is not None:
        raise SpecError(f'{kind} {name}: strict decoding error: unknown field "{difference}"')


def _first_difference(given, read, path: str) -> str | None:
    """The first path of `given` that `read` lacks or holds otherwise."""
    if isinstance(given, dict):
        for key, value in given.items():
            if value is None:
                continue
            if not isinstance(read, dict) or key not in read:
                return f"{path}.{key}".lstrip(".")
            found = _first_difference(value, read[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(given, list):
        if not isinstance(read, list) or len(read) != len(given):
            return path.lstrip(".")
        for index, (item, read_item) in enumerate(zip(given, read)):
            found = _first_difference(item, read_item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return None if given == read else path.lstrip(".")
