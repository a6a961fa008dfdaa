"""Kubeflow training-operator v1 (TFJob): the manifest, and what each replica is told (TF_CONFIG
from the replica types, the evaluator left out of the cluster)."""

from __future__ import annotations

import json

from scripts.jobspec.request import JobRequest, vertex_only

# TFJob restartPolicy: ExitCode restarts only on the retryable codes (130, 137, 138, 143), which
# cassava.task uses for a lost cluster or a preemption; its configuration errors (2) and bugs
# (1) fail the job at once instead of restarting forever, as OnFailure would.
TFJOB_RESTART_POLICY = "ExitCode"

TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


# Printed above the TFJob: what it needs, and where new clusters should go instead.
TFJOB_HEADER = ("# Kubeflow training-operator v1 (TFJob), maintained only on its release-1.9 branch; for new\n"
                "# clusters use `submit_job.py jobset`. Apply with: kubectl apply -f FILE\n")


def tfjob_manifest(request: JobRequest, namespace: str) -> dict:
    """A kubeflow.org/v1 TFJob. GPUs are requested as nvidia.com/gpu limits on GPU pools."""
    vertex_only(request, "a TFJob")
    name = request.name.lower().replace("_", "-")
    replica_specs = {}
    for pool in request.pools:
        args = list(request.trainer_args)
        if request.base_output_dir and "--model-dir" not in args:
            args += ["--model-dir", f"{request.base_output_dir.rstrip('/')}/model"]
        container: dict = {"name": "tensorflow", "image": pool.image_uri, "args": args, "ports": [{"name": "tfjob-port", "containerPort": 2222}]}
        if pool.accelerator_type:
            container["resources"] = {"limits": {"nvidia.com/gpu": pool.accelerator_count}}
        replica_specs[TFJOB_REPLICA_TYPES[pool.role]] = {
            "replicas": pool.replicas,
            "restartPolicy": TFJOB_RESTART_POLICY,
            "template": {"spec": {"containers": [container],
                                  **({"serviceAccountName": request.service_account} if request.service_account else {})}},
        }
    metadata: dict = {"name": name, "namespace": namespace}
    if request.labels:
        metadata["labels"] = dict(request.labels)
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
            "spec": {"runPolicy": tfjob_run_policy(request), "tfReplicaSpecs": replica_specs}}


def tfjob_run_policy(request: JobRequest) -> dict:
    policy: dict = {"cleanPodPolicy": "Running", "backoffLimit": request.max_restarts}
    if request.timeout_seconds:
        policy["activeDeadlineSeconds"] = request.timeout_seconds
    return policy


def replica_environments(spec: dict) -> list[dict[str, str]]:
    """TF_CONFIG from the replica types, the evaluator left out of the cluster."""
    name = spec["metadata"]["name"]
    replicas = {rtype.lower(): int(r["replicas"]) for rtype, r in spec["spec"]["tfReplicaSpecs"].items()}
    hosts = {rtype: [f"{name}-{rtype}-{i}.{spec['metadata']['namespace']}.svc:2222" for i in range(n)]
             for rtype, n in replicas.items()}
    cluster = {rtype: h for rtype, h in hosts.items() if rtype != "evaluator"}
    return [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": rtype, "index": i}, "environment": "cloud"})}
            for rtype, h in hosts.items() for i in range(len(h))]
