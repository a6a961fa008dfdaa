"""Job specs for Vertex AI, AI Platform Training, Kubeflow TFJob and JobSet, as plain dicts, from
one request.

Pure functions: no cloud SDK, no network. `scripts/submit_job.py` prints or submits what these
build; the tests load them into each platform's own schema. `cluster_environments` derives the
TF_CONFIG / CLUSTER_SPEC each replica would be given, as each platform sets them, so the specs can
be checked against `trainer.cluster` without running anything (a JobSet's pods: scripts/rehearsal/jobset/).
"""

from __future__ import annotations

import dataclasses
import json
import re

from scripts import accelerators  # the machine and GPU table, with its sources
from trainer import cluster as trainer_cluster  # imports no TensorFlow

# Kubernetes restarts a TFJob's pods at most this often (runPolicy.backoffLimit) before the job fails.
DEFAULT_MAX_RESTARTS = 5
# TFJob restartPolicy: ExitCode restarts only on the retryable codes (130, 137, 138, 143), which
# cassava.task uses for a lost cluster or a preemption; its configuration errors (2) and bugs
# (1) fail the job at once instead of restarting forever, as OnFailure would.
TFJOB_RESTART_POLICY = "ExitCode"


class SpecError(ValueError):
    """An inconsistent request. str() is one line."""


@dataclasses.dataclass(frozen=True)
class Pool:
    """One kind of replica: its role, count, machine and image."""

    role: str  # chief, worker, ps, evaluator, reducer (Vertex's Reduction Server)
    replicas: int
    machine_type: str
    image_uri: str
    accelerator_type: str | None = None
    accelerator_count: int = 0
    # Vertex: the boot disk, and whether the pool takes the job's reservation (the training
    # machine's pools: a reservation holds one machine configuration).
    boot_disk_type: str = accelerators.PD_SSD
    boot_disk_size_gb: int = accelerators.BOOT_DISK_GB[0]
    reserved: bool = False


# Google's Reduction Server image, one per multi-region ("Distributed training" page, "Train using
# Reduction Server"), and the reducer machine that page recommends, n1-highcpu-16 ("relatively
# high bandwidth for its resources": 32 Gbps egress).
REDUCTION_SERVER_IMAGES = trainer_cluster.REDUCTION_SERVER_IMAGES
REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"
# Scheduling.timeout defaults to 7 days; Dynamic Workload Scheduler takes jobs of at most that [dws].
FLEX_START_MAX_TIMEOUT = 7 * 24 * 3600
_RESERVATION = re.compile(r"projects/[^/\s]+/zones/[^/\s]+/reservations/[^/\s]+")
_TENSORBOARD = re.compile(r"projects/[^/\s]+/locations/[^/\s]+/tensorboards/[^/\s]+")
# CreatePersistentResourceRequest.persistent_resource_id (aiplatform v1).
_PERSISTENT_RESOURCE_ID = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclasses.dataclass(frozen=True)
class VertexOptions:
    """What only a Vertex AI CustomJob (or a tuning job's trials) can say: how capacity is obtained,
    boot disks, web access, a Vertex AI TensorBoard, retries. Each maps to one field of the
    aiplatform v1 CustomJobSpec (`vertex_custom_job`)."""

    flex_start: bool = False  # scheduling.strategy FLEX_START (Dynamic Workload Scheduler)
    max_wait_seconds: int | None = None  # scheduling.maxWaitDuration; 0 waits without limit
    reservation: str | None = None  # "any", "none" or projects/P/zones/Z/reservations/NAME
    persistent_resource_id: str | None = None
    boot_disk_type: str | None = None  # default: the training machine's own default
    boot_disk_size_gb: int | None = None
    enable_web_access: bool = False
    tensorboard: str | None = None  # projects/P/locations/L/tensorboards/ID
    disable_retries: bool = False

    def given(self) -> list[str]:
        """The options set, as their flags, for targets that take none of them."""
        flags = {"--flex-start": self.flex_start, "--max-wait": self.max_wait_seconds is not None,
                 "--reservation": self.reservation, "--persistent-resource-id": self.persistent_resource_id,
                 "--boot-disk-type": self.boot_disk_type, "--boot-disk-size-gb": self.boot_disk_size_gb is not None,
                 "--enable-web-access": self.enable_web_access, "--tensorboard": self.tensorboard,
                 "--disable-retries": self.disable_retries}
        return [flag for flag, value in flags.items() if value]


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
    vertex: VertexOptions = VertexOptions()

    def pool(self, role: str) -> Pool | None:
        return next((p for p in self.pools if p.role == role), None)


def parse_duration(text: str, flag: str) -> int:
    """Seconds from "3600", "3600s", "90m", "12h" or "2d"; one-line SpecError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", str(text))
    if not match:
        raise SpecError(f"{flag} takes a duration such as 3600, 3600s, 90m, 12h or 2d; got {text!r}")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def _machine(flag: str, machine_type: str, accelerator_type: str | None, accelerator_count: int):
    try:
        return accelerators.check_machine(machine_type, accelerator_type, accelerator_count)
    except accelerators.AcceleratorError as error:
        raise SpecError(f"{flag}: {error}" if flag else str(error)) from None


def build_request(
    *, name: str, strategy: str, workers: int, ps: int, evaluator: bool, image_uri: str,
    gpu_image_uri: str | None, machine_type: str, accelerator_type: str | None, accelerator_count: int,
    ps_machine_type: str, evaluator_machine_type: str | None, evaluator_image_uri: str | None = None,
    trainer_args=(), base_output_dir=None, service_account=None, network=None, labels=(),
    spot=False, timeout_seconds=None, max_restarts=DEFAULT_MAX_RESTARTS,
    reducers: int = 0, reducer_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    reducer_image_uri: str = REDUCTION_SERVER_IMAGES[0], vertex: VertexOptions = VertexOptions(),
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
    training_machine = _machine("", machine_type, accelerator_type, accelerator_count)
    if ps:
        _machine("--ps-machine-type", ps_machine_type, None, 0)
    if evaluator and evaluator_machine_type:
        _machine("--evaluator-machine-type", evaluator_machine_type, None, 0)
    try:
        accelerators.check_boot_disk(machine_type, vertex.boot_disk_type, vertex.boot_disk_size_gb)
    except accelerators.AcceleratorError as error:
        raise SpecError(str(error)) from None

    training_image = (gpu_image_uri or image_uri) if accelerator_type else image_uri
    training = dict(machine_type=machine_type, image_uri=training_image,
                    accelerator_type=accelerator_type, accelerator_count=accelerator_count,
                    boot_disk_type=vertex.boot_disk_type or training_machine.boot_disks[0],
                    boot_disk_size_gb=vertex.boot_disk_size_gb or accelerators.BOOT_DISK_GB[0],
                    reserved=vertex.reservation is not None)

    def own_machine(role: str, replicas: int, machine: str, image: str) -> Pool:
        """A pool on a machine of its own: its default disk, no GPUs, no reservation."""
        return Pool(role, replicas, machine, image, boot_disk_type=accelerators.machine(machine).boot_disks[0])

    pools = [Pool("chief", 1, **training), Pool("worker", workers, **training)]
    if ps:
        pools.append(own_machine("ps", ps, ps_machine_type, image_uri))
    if reducers:
        pools.append(_reducer_pool(strategy, accelerator_type, reducers, reducer_machine_type, reducer_image_uri,
                                   own_machine))
    if evaluator:
        if evaluator_machine_type:
            pools.append(own_machine("evaluator", 1, evaluator_machine_type, evaluator_image_uri or training_image))
        else:
            pools.append(Pool("evaluator", 1, **{**training, "image_uri": evaluator_image_uri or training_image}))
    args = list(trainer_args)
    # Only beside trainer flags: with none, the image's own command runs as it is (a user's image;
    # the trainer picks parameter_server by itself when the cluster has ps tasks).
    if strategy == "pss" and args and "--strategy" not in args:
        args = ["--strategy", "parameter_server", *args]
    if timeout_seconds is not None and timeout_seconds < 1:
        raise SpecError(f"--timeout must be a positive number of seconds, got {timeout_seconds}")
    if max_restarts < 0:
        raise SpecError(f"--max-restarts must be 0 or more, got {max_restarts}")
    request = JobRequest(name, strategy, tuple(pools), tuple(args), base_output_dir, service_account, network,
                         tuple(labels), spot, timeout_seconds, max_restarts, vertex)
    _check_capacity(request)
    return request


def _reducer_pool(strategy, accelerator_type, reducers, machine_type, image_uri, own_machine) -> Pool:
    """Vertex's Reduction Server: reducers in worker pool 2, running Google's image. Its
    prerequisites ("Distributed training" page): distributed training with GPU workers whose
    framework all-reduces with NCCL; reducers use no GPUs."""
    if reducers < 0:
        raise SpecError(f"--reduction-server takes a number of reducers, got {reducers}")
    if strategy != "mwms":
        raise SpecError("--reduction-server is for --strategy mwms: worker pool 2 holds either parameter servers or "
                        "reducers, and reducers serve NCCL all-reduce, which ParameterServerStrategy does not use")
    if not accelerator_type:
        raise SpecError("--reduction-server needs GPU workers (--accelerator-type): Reduction Server aggregates the "
                        "NCCL all-reduce between GPU workers")
    if image_uri not in REDUCTION_SERVER_IMAGES:
        raise SpecError(f"--reduction-server-image must be one of Google's Reduction Server images: "
                        f"{', '.join(REDUCTION_SERVER_IMAGES)}")
    _machine("--reduction-server-machine-type", machine_type, None, 0)
    return own_machine("reducer", reducers, machine_type, image_uri)


def _check_capacity(request: JobRequest) -> None:
    """Combinations Vertex AI refuses, refused here first, each from the page that states it."""
    options, chief = request.vertex, request.pool("chief")
    gpu = accelerators.GPUS.get(chief.accelerator_type) if chief.accelerator_type else None
    if options.max_wait_seconds is not None and not options.flex_start:
        # Scheduling.maxWaitDuration applies to the FLEX_START strategy only (aiplatform v1 Scheduling).
        raise SpecError("--max-wait is for --flex-start: it is how long Dynamic Workload Scheduler may wait for "
                        "the GPUs")
    if options.flex_start and request.spot:
        raise SpecError("--flex-start and --spot are two values of one field, scheduling.strategy: choose one")
    if options.flex_start:
        # "Schedule training jobs based on resource availability": the job requests L4, A100, H100,
        # H200 or B200 GPUs, has a timeout of 7 days or less, and uses the same machine
        # configuration for all worker pools.
        if gpu is None or not gpu.flex_start:
            allowed = ", ".join(name for name, g in accelerators.GPUS.items() if g.flex_start)
            raise SpecError(f"--flex-start needs GPUs Dynamic Workload Scheduler provisions ({allowed}); this job "
                            f"asks for {chief.accelerator_type or 'none'}")
        other = next((p for p in request.pools if (p.machine_type, p.accelerator_type, p.accelerator_count) !=
                      (chief.machine_type, chief.accelerator_type, chief.accelerator_count)), None)
        if other is not None:
            raise SpecError(f"--flex-start needs the same machine configuration in every worker pool (Dynamic Workload "
                            f"Scheduler), but the {other.role} pool runs on {other.machine_type} without the "
                            f"workers' GPUs")
        if request.timeout_seconds and request.timeout_seconds > FLEX_START_MAX_TIMEOUT:
            raise SpecError(f"--flex-start takes jobs with a --timeout of at most 7 days ({FLEX_START_MAX_TIMEOUT} s), "
                            f"got {request.timeout_seconds}")
    reservation = options.reservation
    if reservation not in (None, "any", "none") and not _RESERVATION.fullmatch(reservation):
        raise SpecError(f"--reservation is any, none, or a reservation's full name "
                        f"projects/PROJECT/zones/ZONE/reservations/NAME; got {reservation!r}")
    if reservation not in (None, "none"):
        # Compute Engine, "Choose a reservation type", limitations: reserved capacity cannot create
        # Spot VMs. Vertex AI, "Use reservations with training": Flex Start and persistent
        # resources are supported "except when using Compute Engine reservations".
        if request.spot:
            raise SpecError("--reservation with --spot: a reservation's capacity cannot create Spot VMs "
                            "(use --reservation none, or drop --spot)")
        if options.flex_start:
            raise SpecError("--reservation with --flex-start: Vertex AI runs Flex Start jobs without Compute Engine "
                            "reservations; choose one")
        if options.persistent_resource_id:
            raise SpecError("--reservation with --persistent-resource-id: Vertex AI runs jobs on a persistent "
                            "resource without Compute Engine reservations; choose one")
    if options.persistent_resource_id:
        if not _PERSISTENT_RESOURCE_ID.fullmatch(options.persistent_resource_id):
            raise SpecError(f"--persistent-resource-id is a persistent resource's ID (lowercase letters, digits and "
                            f"'-', at most 63), got {options.persistent_resource_id!r}")
        # "Run training jobs on a persistent resource": the job runs on the resource's existing
        # VMs, whose machine and disk it must match; how new VMs are obtained does not apply.
        if request.spot or options.flex_start:
            raise SpecError(f"--persistent-resource-id with {'--spot' if request.spot else '--flex-start'}: a job on "
                            "a persistent resource runs on the VMs the resource already holds")
    if options.tensorboard:
        if not _TENSORBOARD.fullmatch(options.tensorboard):
            raise SpecError(f"--tensorboard is a Vertex AI TensorBoard's name, "
                            f"projects/PROJECT/locations/REGION/tensorboards/ID; got {options.tensorboard!r}")
        # The trainer writes its events to AIP_TENSORBOARD_LOG_DIR, which Vertex sets only with a
        # base output directory, and the upload needs a service account ("Use Vertex AI
        # TensorBoard with custom training"; the SDK's CustomJob.run: "`service_account` is
        # required with provided `tensorboard`").
        if not request.base_output_dir:
            raise SpecError("--tensorboard needs --base-output-dir: Vertex uploads what the trainer writes to "
                            "AIP_TENSORBOARD_LOG_DIR, which it sets under the base output directory")
        if not request.service_account:
            raise SpecError("--tensorboard needs --service-account: Vertex AI uploads TensorBoard logs as that "
                            "service account")


# --- Vertex AI -------------------------------------------------------------------------------

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


# What the workers' image needs for Reduction Server ("Distributed training", prerequisites: a
# custom container "with NCCL 2.7 or later and the google-reduction-server package installed"),
# which this project's GPU image cannot carry: Google's apt repository is not reachable where it
# is built and tested. docs/gpus.md#reduction-server gives the Dockerfile lines.
REDUCTION_SERVER_IMAGE_WARNING = (
    "warning: --reduction-server: the workers' image must carry Google's NCCL plugin, the apt package "
    "google-reduction-server from https://packages.cloud.google.com/apt (suite google-fast-socket), for NCCL to "
    "send its all-reduce through the reducers; this project's GPU image does not (add the lines in "
    "docs/gpus.md#reduction-server to Dockerfile.gpu). Without it NCCL does not use the reducers, which are billed "
    "all the same.")


def accelerator_warnings(request: JobRequest) -> list[str]:
    """One line per thing to know before paying: a GPU the wheel has only PTX for (from the
    wheel's own kernel list), a deprecated GPU, a reducer pool the image cannot serve."""
    lines, seen = [], set()
    for pool in request.pools:
        if pool.accelerator_type and pool.accelerator_type not in seen:
            seen.add(pool.accelerator_type)
            lines += accelerators.gpu_warnings(pool.accelerator_type, pool.machine_type, pool.accelerator_count)
    if request.pool("reducer"):
        lines.append(REDUCTION_SERVER_IMAGE_WARNING)
    return lines


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


def vertex_only(request: JobRequest, target: str) -> None:
    """Reduction Server and the capacity and machine options exist only in Vertex AI's CustomJob."""
    given = request.vertex.given() + (["--reduction-server"] if request.pool("reducer") else [])
    if given:
        raise SpecError(f"{', '.join(given)}: for the vertex and hptune targets; {target} has no such setting")


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


# --- Kubeflow TFJob -------------------------------------------------------------------------------

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
    return (f"# A JobSet ({JOBSET_API_VERSION}): one Indexed Job per role; each pod gets its cluster as TF_CONFIG, and\n"
            f"# as its JobSet labels and JOBSET_PODS (trainer/cluster.py). Needs {needs}.\n"
            f"# Apply with: kubectl apply -f FILE\n")


def jobset_manifest(request: JobRequest, namespace: str, queue: str | None = None) -> dict:
    """A JobSet: one replicatedJob per role (chief, worker, ps, evaluator), each a single Job
    (replicas: 1) whose pods are the role's tasks (Indexed, completions = parallelism = pods), so
    pod i of role R has the hostname `{name}-{R}-0-{i}` and the DNS name `{name}-{R}-0-{i}.{name}`.
    Every container gets trainer.cluster's JobSet variables and a TF_CONFIG that says the same
    (jobset_container_env)."""
    vertex_only(request, "a JobSet")
    name = request.name.lower().replace("_", "-")
    _check_jobset_names(name, request.pools)
    pods = {pool.role: pool.replicas for pool in request.pools}
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
            "replicatedJobs": [{"name": pool.role, "replicas": 1, "template": _jobset_job(request, name, pool, pods)}
                               for pool in request.pools],
        },
    }


# The annotation the Job controller gives each pod of an Indexed Job its index in
# (batch.kubernetes.io/job-completion-index), and reads JOB_COMPLETION_INDEX from.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def jobset_container_env(jobset: str, pods: dict[str, int], role: str) -> list[dict]:
    """A container's env in the JobSet `jobset` whose replicatedJob R has pods[R] pods, for a pod of
    `role`: trainer.cluster's JobSet variables (the labels through the downward API, the pods of
    every role as a plain value), then TF_CONFIG, for a command that reads nothing else.

    TF_CONFIG's cluster is the one trainer.cluster computes from those variables (jobset_cluster),
    the evaluator left out of it as TensorFlow expects; its task index is the pod's completion
    index, through `$(JOB_COMPLETION_INDEX)`. Kubernetes expands a `$(VAR)` only to a variable
    defined earlier in the list, and the Job controller appends its JOB_COMPLETION_INDEX last
    (addCompletionIndexEnvVariable, pkg/controller/job), so it is defined here first, from the same
    annotation; the controller then leaves a container that has one alone."""
    env: list[dict] = [{"name": variable, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
                       for variable, label in trainer_cluster.JOBSET_LABEL_ENV.items()]
    env.append({"name": trainer_cluster.JOBSET_PODS, "value": ",".join(f"{name}={count}" for name, count in pods.items())})
    env.append({"name": trainer_cluster.JOB_COMPLETION_INDEX,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}})
    hosts = trainer_cluster.jobset_cluster(jobset, pods)
    training = {name: addresses for name, addresses in hosts.items() if name != trainer_cluster.EVALUATOR}
    # The index is a JSON number once Kubernetes has put the pod's index in place of the reference.
    index = "$(" + trainer_cluster.JOB_COMPLETION_INDEX + ")"
    tf_config = json.dumps({"cluster": training, "task": {"type": role, "index": 0}}).replace('"index": 0}', f'"index": {index}}}')
    env.append({"name": "TF_CONFIG", "value": tf_config})
    return env


def _jobset_job(request: JobRequest, jobset: str, pool: Pool, pods: dict[str, int]) -> dict:
    """The Job template of one role."""
    args = list(request.trainer_args)
    env = jobset_container_env(jobset, pods, pool.role)
    if request.base_output_dir:
        # As Vertex names them under baseOutputDirectory: trainer.outputs reads them when no flag
        # is given, and so can any script.
        base = request.base_output_dir.rstrip("/")
        env += [{"name": "AIP_MODEL_DIR", "value": f"{base}/model/"},
                {"name": "AIP_CHECKPOINT_DIR", "value": f"{base}/checkpoints/"},
                {"name": "AIP_TENSORBOARD_LOG_DIR", "value": f"{base}/logs/"}]
        if args and "--model-dir" not in args:
            args += ["--model-dir", f"{base}/model"]
    container: dict = {"name": "trainer", "image": pool.image_uri}
    if args:
        # Without trainer arguments, no args: the image's own ENTRYPOINT and CMD run, whatever they are.
        container["args"] = args
    container.update({"ports": [{"name": "tf", "containerPort": trainer_cluster.TF_PORT, "protocol": "TCP"}],
                      "env": env})
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
    than one replica (Vertex's "Distributed training" page). Vertex names every task by its pool's
    position, so a Reduction Server job's reducers are pool 2 like parameter servers: `workerpool2`
    in CLUSTER_SPEC and `ps` in TF_CONFIG, on every replica, the reducers' own included; the page
    documents no other variables for them. Only `job`, the spec itself, tells them apart: its pool
    2 runs Google's reduction-server image, which trainer.cluster reads;
    ai-platform: CLUSTER_SPEC with `master`, TF_CONFIG with `chief` (useChiefInTfConfig);
    tfjob: TF_CONFIG from the replica types, the evaluator left out of the cluster.
    A JobSet sets no cluster variable: each pod's whole environment, from which trainer.cluster
    finds the cluster itself, is scripts/rehearsal/jobset.py's `jobset_pods`.
    """
    if platform == "vertex":
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
