"""Job specs for Vertex AI, AI Platform Training, Kubeflow TFJob and JobSet, as plain dicts, from
one request.

Pure functions: no cloud SDK, no network. `scripts/submit_job.py` prints or submits what these
build; the tests load them into each platform's own schema. `cluster_environments` derives the
TF_CONFIG / CLUSTER_SPEC each replica would be given, as each platform sets them, so the specs can
be checked against `trainer.cluster` without running anything (a JobSet's pods: scripts/rehearsal/jobset.py).
"""

from __future__ import annotations

import dataclasses
import json
import re

from trainer import cluster as trainer_cluster  # imports no TensorFlow

# Which accelerators each machine family can take (Vertex AI / Compute Engine).
ACCELERATORS_BY_FAMILY = {
    "n1": {"NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4", "NVIDIA_TESLA_K80"},
    "a2": {"NVIDIA_TESLA_A100", "NVIDIA_A100_80GB"},
    "g2": {"NVIDIA_L4"},
    "a3": {"NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB"},
}


# GPUs for which TF 2.21's wheel has no compiled kernels, only compute_90 PTX (its build info lists
# sm_60/70/80/89 and compute_90): the driver JIT-compiles every kernel at start, which "could take
# 30 minutes or longer" (tensorflow/tensorflow#60739, #62320).
PTX_ONLY_ACCELERATORS = {"NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB", "NVIDIA_B200", "NVIDIA_GB200"}


# Kubernetes restarts a TFJob's pods at most this often (runPolicy.backoffLimit) before the job fails.
DEFAULT_MAX_RESTARTS = 5
# TFJob restartPolicy: ExitCode restarts only on the retryable codes (130, 137, 138, 143), which
# trainer.task uses for a lost cluster or a preemption; its configuration errors (2) and bugs
# (1) fail the job at once instead of restarting forever, as OnFailure would.
TFJOB_RESTART_POLICY = "ExitCode"


class SpecError(ValueError):
    """An inconsistent request. str() is one line."""


@dataclasses.dataclass(frozen=True)
class Pool:
    """One kind of replica: its role, count, machine and image."""

    role: str  # chief, worker, ps, evaluator
    replicas: int
    machine_type: str
    image_uri: str
    accelerator_type: str | None = None
    accelerator_count: int = 0


@dataclasses.dataclass(frozen=True)
class JobRequest:
    name: str
    strategy: str  # "mwms" or "pss"
    pools: tuple[Pool, ...]
    trainer_args: tuple[str, ...] = ()
    base_output_dir: str | None = None
    service_account: str | None = None
    network: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    # Faults: Spot VMs (Vertex), a time limit in seconds, and how often Kubernetes may restart.
    spot: bool = False
    timeout_seconds: int | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS

    def pool(self, role: str) -> Pool | None:
        return next((p for p in self.pools if p.role == role), None)


def build_request(
    *, name: str, strategy: str, workers: int, ps: int, evaluator: bool, image_uri: str,
    gpu_image_uri: str | None, machine_type: str, accelerator_type: str | None, accelerator_count: int,
    ps_machine_type: str, evaluator_machine_type: str | None, evaluator_image_uri: str | None = None,
    trainer_args=(), base_output_dir=None, service_account=None, network=None, labels=(),
    spot=False, timeout_seconds=None, max_restarts=DEFAULT_MAX_RESTARTS,
) -> JobRequest:
    """Validates a request and lays out its pools; raises SpecError when it cannot work."""
    if workers < 1:
        raise SpecError(f"--workers must be at least 1, got {workers}: a job needs workers besides the chief")
    if strategy == "pss" and ps < 1:
        raise SpecError("--strategy pss needs at least one parameter server (--ps)")
    if strategy == "mwms" and ps:
        raise SpecError("--ps is for --strategy pss; MultiWorkerMirrored jobs have no parameter servers")
    if accelerator_type and accelerator_count < 1:
        raise SpecError(f"--accelerator-type {accelerator_type} needs --accelerator-count of at least 1")
    if accelerator_count and not accelerator_type:
        raise SpecError("--accelerator-count needs --accelerator-type")
    if accelerator_type:
        family = machine_type.split("-")[0]
        allowed = ACCELERATORS_BY_FAMILY.get(family, set())
        if accelerator_type not in allowed:
            takes = ", ".join(sorted(allowed)) if allowed else "no GPUs"
            raise SpecError(f"machine type {machine_type} cannot take {accelerator_type} ({family} machines take {takes})")
    training_image = (gpu_image_uri or image_uri) if accelerator_type else image_uri
    training = dict(machine_type=machine_type, image_uri=training_image,
                    accelerator_type=accelerator_type, accelerator_count=accelerator_count)
    pools = [Pool("chief", 1, **training), Pool("worker", workers, **training)]
    if ps:
        pools.append(Pool("ps", ps, ps_machine_type, image_uri))
    if evaluator:
        pools.append(Pool("evaluator", 1, evaluator_machine_type or machine_type,
                          evaluator_image_uri or training_image,
                          accelerator_type if not evaluator_machine_type else None,
                          accelerator_count if not evaluator_machine_type else 0))
    args = list(trainer_args)
    if strategy == "pss" and "--strategy" not in args:
        args = ["--strategy", "parameter_server", *args]
    if timeout_seconds is not None and timeout_seconds < 1:
        raise SpecError(f"--timeout must be a positive number of seconds, got {timeout_seconds}")
    if max_restarts < 0:
        raise SpecError(f"--max-restarts must be 0 or more, got {max_restarts}")
    return JobRequest(name, strategy, tuple(pools), tuple(args), base_output_dir, service_account, network,
                      tuple(labels), spot, timeout_seconds, max_restarts)


# --- Vertex AI -------------------------------------------------------------------------------

VERTEX_POOL_INDEX = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}


def vertex_custom_job(request: JobRequest) -> dict:
    """A Vertex AI CustomJob (aiplatform v1 JSON): pool 0 chief, 1 workers, 2 ps, 3 evaluator.
    A pool that is not used stays an empty entry, so the indices keep their meaning."""
    specs = [{} for _ in range(1 + max(VERTEX_POOL_INDEX[p.role] for p in request.pools))]
    for pool in request.pools:
        machine = {"machineType": pool.machine_type}
        if pool.accelerator_type:
            machine.update(acceleratorType=pool.accelerator_type, acceleratorCount=pool.accelerator_count)
        specs[VERTEX_POOL_INDEX[pool.role]] = {
            "replicaCount": str(pool.replicas),
            "machineSpec": machine,
            "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100},
            "containerSpec": {"imageUri": pool.image_uri, "args": list(request.trainer_args)},
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
    job = {"displayName": request.name, "jobSpec": job_spec}
    if request.labels:
        job["labels"] = dict(request.labels)
    return job


SELFCHECK_COMMAND = ("python", "-m", "trainer.selfcheck")


def vertex_selfcheck_job(request: JobRequest) -> dict:
    """One replica on the chief's machine, GPUs and image, running `python -m trainer.selfcheck`
    (the trainer args become its args): proves an image on that GPU before a large job pays."""
    chief = dataclasses.replace(request.pool("chief"), role="chief", replicas=1)
    job = vertex_custom_job(dataclasses.replace(request, pools=(chief,), base_output_dir=None,
                                                name=f"{request.name}-selfcheck"))
    job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = list(SELFCHECK_COMMAND)
    return job


def accelerator_warnings(request: JobRequest) -> list[str]:
    """One line per kind of GPU this TensorFlow build has to JIT-compile for."""
    slow = sorted({p.accelerator_type for p in request.pools if p.accelerator_type in PTX_ONLY_ACCELERATORS})
    return [f"warning: {name}: TensorFlow 2.21 ships no kernels for this GPU, only PTX, so each new container "
            f"JIT-compiles them at start (30 minutes or longer, tensorflow/tensorflow#60739); the image caches them "
            f"for later processes (CUDA_CACHE_MAXSIZE). Prove it first with --self-check." for name in slow]


def vertex_scheduling(request: JobRequest) -> dict:
    """Vertex restarts only the replica that failed. A MultiWorkerMirrored job cannot take a
    replica back mid-collective (the others fail or hang), so the whole job restarts and resumes
    from its backup; ParameterServer workers rejoin on their own, so those jobs keep the default."""
    scheduling: dict = {}
    if request.strategy == "mwms":
        scheduling["restartJobOnWorkerRestart"] = True
    if request.spot:
        scheduling["strategy"] = "SPOT"
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


# --- AI Platform Training (retired on 2025-04-07) -----------------------------------------------

# Printed above the config.yaml: the service is gone, the shape it gives the trainer is not.
AI_PLATFORM_HEADER = (
    "# AI Platform Training config.yaml (trainingInput): the format of a retired service, shut down on\n"
    "# 2025-04-07 (Vertex AI's deprecations page); `gcloud ai-platform jobs submit training` runs it no\n"
    "# more. Kept because its cluster shape (a chief named `master` in CLUSTER_SPEC, and in TF_CONFIG\n"
    "# without useChiefInTfConfig) still reaches the trainer. New jobs: `submit_job.py vertex`.\n")


def ai_platform_config(request: JobRequest, region: str, tuning: Tuning | None = None) -> dict:
    """config.yaml in AI Platform Training's format (`gcloud ai-platform jobs submit training
    --config`), a Job with trainingInput. The service is retired (AI_PLATFORM_HEADER)."""
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


# --- Kubeflow TFJob -------------------------------------------------------------------------------

TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


# Printed above the TFJob: what it needs, and where new clusters should go instead.
TFJOB_HEADER = ("# Kubeflow training-operator v1 (TFJob), maintained only on its release-1.9 branch; for new\n"
                "# clusters use `submit_job.py jobset`. Apply with: kubectl apply -f FILE\n")


def tfjob_manifest(request: JobRequest, namespace: str) -> dict:
    """A kubeflow.org/v1 TFJob. GPUs are requested as nvidia.com/gpu limits on GPU pools."""
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


# --- JobSet (jobset.x-k8s.io/v1alpha2) ------------------------------------------------------------

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The exit codes a pod may be retried after, the ones Kubeflow's `restartPolicy: ExitCode` retries
# (training-operator's IsRetryableExitCode): 143 is trainer.exits.RETRYABLE (a lost cluster, a
# preemption), 130/137/138 are signals (137: out of memory, or SIGKILL after the grace period).
# Any other code (2: configuration or bad input; 1: a bug) fails the JobSet at once, as a TFJob fails.
RETRYABLE_EXIT_CODES = (130, 137, 138, 143)
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A DNS-1035 label: what Kubernetes requires of the Service (the subdomain) and the pods' hostnames.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def jobset_header(manifest: dict) -> str:
    """The comment printed above a JobSet: what it is and what the cluster needs to run it."""
    queue = manifest["metadata"].get("labels", {}).get(KUEUE_QUEUE_LABEL)
    needs = "the JobSet controller (v0.7 or later)"
    if queue:
        needs += f" and Kueue, with a LocalQueue {queue} in namespace {manifest['metadata'].get('namespace', 'default')}"
    return (f"# A JobSet ({JOBSET_API_VERSION}) of the cassava trainer: one Indexed Job per role; each pod finds its\n"
            f"# cluster from its JobSet labels and JOBSET_PODS (trainer/cluster.py). Needs {needs}.\n"
            f"# Apply with: kubectl apply -f FILE\n")


def jobset_manifest(request: JobRequest, namespace: str, queue: str | None = None) -> dict:
    """A JobSet: one replicatedJob per role (chief, worker, ps, evaluator), each a single Job
    (replicas: 1) whose pods are the role's tasks (Indexed, completions = parallelism = pods), so
    pod i of role R has the hostname `{name}-{R}-0-{i}` and the DNS name `{name}-{R}-0-{i}.{name}`.
    Every container gets trainer.cluster's JobSet variables; nothing else tells a pod its cluster."""
    name = request.name.lower().replace("_", "-")
    _check_jobset_names(name, request.pools)
    pods = ",".join(f"{pool.role}={pool.replicas}" for pool in request.pools)
    # The JobSet succeeds when the chief does; JobSet then deletes the Jobs still running (parameter
    # servers and PSS workers serve until stopped). The evaluator is waited for as well: it
    # evaluates the last checkpoint after the chief has finished, then exits by itself.
    succeeds_with = ["chief"] + (["evaluator"] if request.pool("evaluator") else [])
    # A Job fails for a permanent exit code through its podFailurePolicy (reason PodFailurePolicy):
    # that fails the JobSet. Any other Job failure restarts the whole JobSet (the default action),
    # at most maxRestarts times. BlockingRecreate starts no new pod until every old one is gone, so
    # a new task never reaches a task of the previous attempt under the same DNS name, and every
    # old task has written its SIGTERM backup before the new ones read it.
    rules = [{"name": "permanentExitCode", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    if request.timeout_seconds:
        rules.append({"name": "timeLimit", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]})
    metadata: dict = {"name": name, "namespace": namespace}
    labels = dict(request.labels)
    if queue:
        # A LocalQueue is a Kubernetes object named as a DNS label, and the name is a label value:
        # anything else the API server refuses only when the JobSet is applied.
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", queue) or len(queue) > 63:
            raise SpecError(f"--queue {queue!r}: a LocalQueue name is lower-case letters, digits and '-', "
                            "at most 63, starting and ending with a letter or digit")
        # Kueue's webhook suspends the JobSet on creation and resumes it when the queue admits it.
        labels[KUEUE_QUEUE_LABEL] = queue
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            # The webhook defaults both to true; written out because the cluster depends on them:
            # pods are reached by DNS name, and before they are Ready (TensorFlow connects at start).
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": succeeds_with},
            "failurePolicy": {"maxRestarts": request.max_restarts, "restartStrategy": "BlockingRecreate", "rules": rules},
            "replicatedJobs": [{"name": pool.role, "replicas": 1, "template": _jobset_job(request, pool, pods)}
                               for pool in request.pools],
        },
    }


def jobset_container_env(pods: str) -> list[dict]:
    """trainer.cluster's JobSet variables as a container's env: the labels through the downward
    API, the pods of every role as a plain value. JOB_COMPLETION_INDEX is the Job controller's."""
    env: list[dict] = [{"name": variable, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
                       for variable, label in trainer_cluster.JOBSET_LABEL_ENV.items()]
    env.append({"name": trainer_cluster.JOBSET_PODS, "value": pods})
    return env


def _jobset_job(request: JobRequest, pool: Pool, pods: str) -> dict:
    """The Job template of one role."""
    args = list(request.trainer_args)
    if request.base_output_dir and "--model-dir" not in args:
        args += ["--model-dir", f"{request.base_output_dir.rstrip('/')}/model"]
    container: dict = {"name": "trainer", "image": pool.image_uri, "args": args,
                       "ports": [{"name": "tf", "containerPort": trainer_cluster.TF_PORT, "protocol": "TCP"}],
                       "env": jobset_container_env(pods)}
    if pool.accelerator_type:
        container["resources"] = {"limits": {"nvidia.com/gpu": pool.accelerator_count}}
    # restartPolicy Never: a failed pod is replaced by a new one with the same index, and so the same
    # hostname, and podFailurePolicy (which needs Never) can judge its exit code.
    pod_spec: dict = {"restartPolicy": "Never", "containers": [container]}
    if request.service_account:
        pod_spec["serviceAccountName"] = request.service_account
    if request.spot:
        pod_spec["nodeSelector"] = {GKE_SPOT_LABEL: "true"}
        pod_spec["tolerations"] = [{"key": GKE_SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    # A PSS worker or the evaluator can be replaced alone: the coordinator moves a lost worker's
    # functions to the others and takes the new one back under the same DNS name, and the evaluator
    # only reads checkpoints. Their pods are replaced up to max-restarts times, and a pod stopped by
    # a preemption, an eviction or a drain (condition DisruptionTarget) is not counted. Any other
    # task cannot rejoin alone (an MWMS collective, the coordinator, a parameter server's variables),
    # so its first failure fails its Job and the JobSet restarts whole; a disruption counts as
    # that failure rather than ever being taken for a permanent exit code.
    alone = pool.role == "evaluator" or (request.strategy == "pss" and pool.role == "worker")
    job_spec: dict = {
        "completionMode": "Indexed",
        "completions": pool.replicas,
        "parallelism": pool.replicas,
        "backoffLimit": request.max_restarts if alone else 0,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore" if alone else "Count",
             "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": list(RETRYABLE_EXIT_CODES)}},
        ]},
        "template": {"spec": pod_spec},
    }
    if request.timeout_seconds:
        # JobSet v1alpha2 has no JobSet-wide time limit, so each Job has one; it counts from the
        # Job's start, and so starts over when the JobSet restarts (the failure rule "timeLimit"
        # makes the first expiry final).
        job_spec["activeDeadlineSeconds"] = request.timeout_seconds
    return {"spec": job_spec}


def _check_jobset_names(name: str, pools) -> None:
    """JobSet's webhook rejects a JobSet whose name is not a DNS label or whose longest pod name,
    `{name}-{role}-0-{index}-` plus 5 random characters, passes 63 characters."""
    if not _DNS_LABEL.fullmatch(name):
        raise SpecError(f"--name {name}: a JobSet name must start with a letter and hold only lowercase letters, "
                        "digits and '-' (it becomes the pods' DNS subdomain)")
    longest = max((f"{name}-{pool.role}-0-{pool.replicas - 1}-abcde" for pool in pools), key=len)
    if len(longest) > 63:
        raise SpecError(f"--name {name}: too long for a JobSet, pod names such as {longest[:-5]}xxxxx would pass "
                        f"63 characters; use at most {63 - (len(longest) - len(name))}")


# --- What each replica is told ----------------------------------------------------------------

def cluster_environments(platform: str, spec: dict) -> list[dict[str, str]]:
    """The cluster variables every replica of `spec` gets, as the platform would set them.

    vertex: CLUSTER_SPEC (workerpool0..3, the job's spec under "job") on every replica, and TF_CONFIG
    (chief/worker/ps; an evaluator is told its task but is not in the cluster) when there is more
    than one replica (Vertex's "Distributed training" page);
    ai-platform: CLUSTER_SPEC with `master`, TF_CONFIG with `chief` (useChiefInTfConfig);
    tfjob: TF_CONFIG from the replica types, the evaluator left out of the cluster.
    A JobSet sets no cluster variable: each pod's whole environment, from which trainer.cluster
    finds the cluster itself, is scripts/rehearsal/jobset.py's `jobset_pods`.
    """
    if platform == "vertex":
        job_spec = spec.get("jobSpec", spec.get("trialJobSpec"))
        pools = job_spec["workerPoolSpecs"]
        roles = {0: "chief", 1: "worker", 2: "ps", 3: "evaluator"}
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
    if platform == "ai-platform":
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
    if platform == "tfjob":
        name = spec["metadata"]["name"]
        replicas = {rtype.lower(): int(r["replicas"]) for rtype, r in spec["spec"]["tfReplicaSpecs"].items()}
        hosts = {rtype: [f"{name}-{rtype}-{i}.{spec['metadata']['namespace']}.svc:2222" for i in range(n)]
                 for rtype, n in replicas.items()}
        cluster = {rtype: h for rtype, h in hosts.items() if rtype != "evaluator"}
        return [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": rtype, "index": i}, "environment": "cloud"})}
                for rtype, h in hosts.items() for i in range(len(h))]
    raise ValueError(f"unknown platform {platform!r}")
