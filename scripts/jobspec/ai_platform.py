"""AI Platform Training (retired on 2025-04-07): a job's config.yaml (ml v1 TrainingInput), and
what each replica is told (CLUSTER_SPEC with `master`, TF_CONFIG with `chief`)."""

from __future__ import annotations

import json

from scripts.jobspec.request import JobRequest, SpecError, vertex_only
from scripts.jobspec.vertex import Tuning

# Printed above the config.yaml: the service is gone, the shape it gives the trainer is not.
AI_PLATFORM_HEADER = (
    "# AI Platform Training config.yaml (trainingInput): the format of a retired service, shut down on\n"
    "# 2025-04-07 (Vertex AI's deprecations page); `gcloud ai-platform jobs submit training` runs it no\n"
    "# more. Kept because its cluster shape (a chief named `master` in CLUSTER_SPEC, and in TF_CONFIG\n"
    "# without useChiefInTfConfig) still reaches the trainer. New jobs: `submit_job.py vertex`.\n")


def ai_platform_config(request: JobRequest, region: str, tuning: Tuning | None = None) -> dict:
    """config.yaml in AI Platform Training's format (`gcloud ai-platform jobs submit training
    --config`), a Job with trainingInput. The service is retired (AI_PLATFORM_HEADER)."""
    vertex_only(request, "AI Platform Training")
    names = {"chief": "master", "worker": "worker", "ps": "parameterServer", "evaluator": "evaluator"}
    training: dict = {"scaleTier": "CUSTOM", "region": region, "useChiefInTfConfig": True, "args": list(request.trainer_args)}
    for pool in request.pools:
        prefix = names[pool.role]
        training[f"{prefix}Type"] = pool.machine_type
        config: dict = {"imageUri": pool.image_uri}
        if pool.accelerator_type:
            config["acceleratorConfig"] = {"count": str(pool.accelerator_count), "type": pool.accelerator_type}
        training[f"{prefix}Config"] = config
        if pool.role != "chief":
            training[f"{prefix}Count"] = str(pool.replicas)
    if request.base_output_dir:
        training["jobDir"] = request.base_output_dir
    if request.service_account:
        training["serviceAccount"] = request.service_account
    if request.network:
        training["network"] = request.network
    if request.spot:
        raise SpecError("--spot: AI Platform Training has no Spot VMs (use the vertex target)")
    if request.timeout_seconds:
        # The only restart-related setting it has; failed replicas are retried by the service itself.
        training["scheduling"] = {"maxRunningTime": f"{request.timeout_seconds}s"}
    if tuning:
        training["hyperparameters"] = {
            "goal": tuning.goal,
            "hyperparameterMetricTag": tuning.metric,
            "maxTrials": tuning.max_trials,
            "maxParallelTrials": tuning.parallel_trials,
            "params": [
                {"parameterName": "learning-rate", "type": "DOUBLE", "minValue": tuning.learning_rate_range[0],
                 "maxValue": tuning.learning_rate_range[1], "scaleType": "UNIT_LOG_SCALE"},
                {"parameterName": "per-replica-batch-size", "type": "DISCRETE",
                 "discreteValues": [float(b) for b in tuning.batch_sizes]},
            ],
        }
    job: dict = {"trainingInput": training}
    if request.labels:
        job["labels"] = dict(request.labels)
    return job


def replica_environments(spec: dict) -> list[dict[str, str]]:
    """CLUSTER_SPEC with `master`, TF_CONFIG with `chief` (useChiefInTfConfig), on every replica."""
    training = spec["trainingInput"]
    counts = {"master": 1}
    for role, prefix in (("worker", "worker"), ("ps", "parameterServer"), ("evaluator", "evaluator")):
        if f"{prefix}Config" in training:
            counts[role] = int(training.get(f"{prefix}Count", 1))
    hosts = {role: [f"{role}-{i}:2222" for i in range(n)] for role, n in counts.items()}
    chief_name = "chief" if training.get("useChiefInTfConfig") else "master"
    tf_cluster = {(chief_name if r == "master" else r): h for r, h in hosts.items() if r != "evaluator"}
    environments = []
    for role, role_hosts in hosts.items():
        for index in range(len(role_hosts)):
            tf_type = chief_name if role == "master" else role
            environments.append({
                "TF_CONFIG": json.dumps({"cluster": tf_cluster, "task": {"type": tf_type, "index": index, "trial": "1"}}),
                "CLUSTER_SPEC": json.dumps({"cluster": hosts, "task": {"type": role, "index": index, "trial": "1"}, "job": {}}),
            })
    return environments
