"""The request every platform's job spec is built from: the pools (role, count, machine, image),
the trainer's arguments, outputs and faults, validated once, whatever the target. Vertex AI's
capacity options (VertexOptions) are checked here too, against the pages that state each limit:
they combine with the request's other settings (Spot VMs, the timeout, GPUs)."""

from __future__ import annotations

import dataclasses
import re

from scripts.jobspec import accelerators  # the machine and GPU table, with its sources
from trainer import cluster as trainer_cluster  # imports no TensorFlow

# Kubernetes restarts a TFJob's pods at most this often (runPolicy.backoffLimit) before the job fails.
DEFAULT_MAX_RESTARTS = 5


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


def vertex_only(request: JobRequest, target: str) -> None:
    """Reduction Server and the capacity and machine options exist only in Vertex AI's CustomJob."""
    given = request.vertex.given() + (["--reduction-server"] if request.pool("reducer") else [])
    if given:
        raise SpecError(f"{', '.join(given)}: for the vertex and hptune targets; {target} has no such setting")
