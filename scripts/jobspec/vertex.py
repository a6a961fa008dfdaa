"""Vertex AI: a CustomJob, a HyperparameterTuningJob's trials, the self-check job (aiplatform v1
JSON), and what each replica is told (CLUSTER_SPEC and TF_CONFIG, as Vertex's "Distributed
training" page says it sets them)."""

from __future__ import annotations

import dataclasses
import json

from scripts.jobspec.request import RESERVATION_NAME_KEY, JobRequest, SpecError

# Worker pool 2 holds parameter servers or Reduction Server reducers ("Distributed training").
VERTEX_POOL_INDEX = {"chief": 0, "worker": 1, "ps": 2, "reducer": 2, "evaluator": 3}


def _reservation_affinity(reservation: str) -> dict:
    """MachineSpec.reservationAffinity ("Use reservations with training"): any matching
    reservation (else on-demand), none, or one reservation by its full name."""
    if reservation == "any":
        return {"reservationAffinityType": "ANY_RESERVATION"}
    if reservation == "none":
        return {"reservationAffinityType": "NO_RESERVATION"}
    return {"reservationAffinityType": "SPECIFIC_RESERVATION", "key": RESERVATION_NAME_KEY, "values": [reservation]}


def vertex_custom_job(request: JobRequest) -> dict:
    """A Vertex AI CustomJob (aiplatform v1 JSON): pool 0 chief, 1 workers, 2 ps or reducers,
    3 evaluator. A pool that is not used stays an empty entry, so the indices keep their meaning.
    The reducers run Google's image as it is: no command, no args. Without trainer args no pool
    has args either, so a user's image runs its own ENTRYPOINT and CMD untouched."""
    specs = [{} for _ in range(1 + max(VERTEX_POOL_INDEX[p.role] for p in request.pools))]
    for pool in request.pools:
        machine = {"machineType": pool.machine_type}
        if pool.accelerator_type:
            machine.update(acceleratorType=pool.accelerator_type, acceleratorCount=pool.accelerator_count)
        if pool.reserved and request.vertex.reservation:
            machine["reservationAffinity"] = _reservation_affinity(request.vertex.reservation)
        container: dict = {"imageUri": pool.image_uri}
        if pool.role != "reducer" and request.trainer_args:
            container["args"] = list(request.trainer_args)
        specs[VERTEX_POOL_INDEX[pool.role]] = {
            "replicaCount": str(pool.replicas),
            "machineSpec": machine,
            "diskSpec": {"bootDiskType": pool.boot_disk_type, "bootDiskSizeGb": pool.boot_disk_size_gb},
            "containerSpec": container,
        }
    job_spec: dict = {"workerPoolSpecs": specs}
    scheduling = vertex_scheduling(request)
    if scheduling:
        job_spec["scheduling"] = scheduling
    if request.base_output_dir:
        # Vertex then sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.
        job_spec["baseOutputDirectory"] = {"outputUriPrefix": request.base_output_dir}
    if request.service_account:
        job_spec["serviceAccount"] = request.service_account
    if request.network:
        job_spec["network"] = request.network
    options = request.vertex
    if options.persistent_resource_id:
        job_spec["persistentResourceId"] = options.persistent_resource_id
    if options.enable_web_access:
        job_spec["enableWebAccess"] = True  # an interactive shell in each replica; the images carry bash
    if options.tensorboard:
        job_spec["tensorboard"] = options.tensorboard
    job = {"displayName": request.name, "jobSpec": job_spec}
    if request.labels:
        job["labels"] = dict(request.labels)
    return job


SELFCHECK_COMMAND = ("python", "-m", "trainer.selfcheck")


def vertex_selfcheck_job(request: JobRequest) -> dict:
    """One replica on the chief's machine, GPUs and image, running `python -m trainer.selfcheck`
    (the trainer args become its args): proves an image on that GPU before a large job pays.
    It obtains its machine as the job would (Spot, FLEX_START, reservation, persistent resource)
    and writes no output, so it has no base output directory and no TensorBoard."""
    chief = dataclasses.replace(request.pool("chief"), role="chief", replicas=1)
    job = vertex_custom_job(dataclasses.replace(request, pools=(chief,), base_output_dir=None,
                                                vertex=dataclasses.replace(request.vertex, tensorboard=None),
                                                name=f"{request.name}-selfcheck"))
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = list(SELFCHECK_COMMAND)
    return job


def vertex_scheduling(request: JobRequest) -> dict:
    """Vertex restarts only the replica that failed. A MultiWorkerMirrored job cannot take a
    replica back mid-collective (the others fail or hang), so the whole job restarts and resumes
    from its backup; ParameterServer workers rejoin on their own, so those jobs keep the default.
    disableRetries "overrides restart_job_on_worker_restart to false" (aiplatform v1 Scheduling),
    so with it the restart flag is left out rather than written and ignored."""
    options = request.vertex
    scheduling: dict = {}
    if request.strategy == "mwms" and not options.disable_retries:
        scheduling["restartJobOnWorkerRestart"] = True
    if options.disable_retries:
        scheduling["disableRetries"] = True
    if request.spot:
        scheduling["strategy"] = "SPOT"
    if options.flex_start:
        scheduling["strategy"] = "FLEX_START"
        if options.max_wait_seconds is not None:
            scheduling["maxWaitDuration"] = f"{options.max_wait_seconds}s"
    if request.timeout_seconds:
        scheduling["timeout"] = f"{request.timeout_seconds}s"
    return scheduling


@dataclasses.dataclass(frozen=True)
class Tuning:
    metric: str = "accuracy"
    goal: str = "MAXIMIZE"
    max_trials: int = 8
    parallel_trials: int = 2
    learning_rate_range: tuple[float, float] = (1e-5, 1e-2)
    batch_sizes: tuple[int, ...] = (32, 64, 128)


def vertex_tuning_job(request: JobRequest, tuning: Tuning) -> dict:
    """A Vertex AI HyperparameterTuningJob around the same CustomJob. Each trial gets
    --learning-rate and --per-replica-batch-size appended to the trainer's args."""
    custom = vertex_custom_job(request)
    return {
        "displayName": request.name,
        "studySpec": {
            "metrics": [{"metricId": tuning.metric, "goal": tuning.goal}],
            "parameters": [
                {"parameterId": "learning-rate", "scaleType": "UNIT_LOG_SCALE",
                 "doubleValueSpec": {"minValue": tuning.learning_rate_range[0], "maxValue": tuning.learning_rate_range[1]}},
                {"parameterId": "per-replica-batch-size", "scaleType": "UNIT_LINEAR_SCALE",
                 "discreteValueSpec": {"values": [float(b) for b in tuning.batch_sizes]}},
            ],
            "algorithm": "ALGORITHM_UNSPECIFIED",
        },
        "maxTrialCount": tuning.max_trials,
        "parallelTrialCount": tuning.parallel_trials,
        "trialJobSpec": custom["jobSpec"],
        **({"labels": custom["labels"]} if "labels" in custom else {}),
    }


def replica_environments(spec: dict) -> list[dict[str, str]]:
    """CLUSTER_SPEC (workerpool0..3, the job's spec under "job") on every replica, and TF_CONFIG
    (chief/worker/ps; an evaluator is told its task but is not in the cluster) when there is more
    than one replica (Vertex's "Distributed training" page). Vertex names every task by its pool's
    position, so a Reduction Server job's reducers are pool 2 like parameter servers: `workerpool2`
    in CLUSTER_SPEC and `ps` in TF_CONFIG, on every replica, the reducers' own included; the page
    documents no other variables for them. Only `job`, the spec itself, tells them apart: its pool
    2 runs Google's reduction-server image, which trainer.cluster reads."""
    job_spec = spec.get("jobSpec", spec.get("trialJobSpec"))
    pools = job_spec["workerPoolSpecs"]
    roles = {0: "chief", 1: "worker", 2: "ps", 3: "evaluator"}  # by position, whatever pool 2 runs
    hosts = {i: [f"workerpool{i}-{r}:2222" for r in range(int(p["replicaCount"]))] for i, p in enumerate(pools) if p}
    # TF_CONFIG's cluster "never contains evaluator as a key"; CLUSTER_SPEC lists every pool.
    tf_cluster = {roles[i]: h for i, h in hosts.items() if roles[i] != "evaluator"}
    pool_cluster = {f"workerpool{i}": h for i, h in hosts.items()}
    # "Vertex AI does not set TF_CONFIG for single-replica training jobs."
    distributed = sum(len(h) for h in hosts.values()) > 1
    environments = []
    for i, pool_hosts in hosts.items():
        for r in range(len(pool_hosts)):
            env = {"CLUSTER_SPEC": json.dumps({"cluster": pool_cluster, "environment": "cloud",
                                               "task": {"type": f"workerpool{i}", "index": r}, "job": job_spec})}
            if distributed:
                env["TF_CONFIG"] = json.dumps({"cluster": tf_cluster, "environment": "cloud",
                                               "task": {"type": roles[i], "index": r}, "job": job_spec})
            environments.append(env)
    return environments
