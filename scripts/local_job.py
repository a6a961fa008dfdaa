"""Runs a Vertex AI CustomJob or HyperparameterTuningJob on this machine, as Vertex would run it.

    python -m scripts.submit_job local vertex [vertex options] [-- TRAINER_ARGS]
    python -m scripts.submit_job local hptune [hptune options] [-- TRAINER_ARGS]
    python -m scripts.submit_job local --spec job.json

One container per replica, from the spec's imageUri, command, args and env, on a private network
where each replica is reachable by its Vertex name (workerpool0-0, workerpool1-0, ...). Each is
told what Vertex tells it: CLUSTER_SPEC (and TF_CONFIG when the job has more than one replica),
the AIP_* output directories under the baseOutputDirectory (under BASE/TRIAL/ in a tuning trial),
CLOUD_ML_PROJECT_ID, CLOUD_ML_JOB_ID, CLOUD_ML_TRIAL_ID.

Vertex's rules, as its documentation states them (docs/rehearsal.md quotes each):
- a replica that exits non-zero fails the job at once ("User code exception", a permanent error),
  with the replica's exit code and last error line; the others are stopped;
- except SIGABRT and SIGSEGV (exit 134, 139), "exit codes that could be transient": the whole job
  restarts, at most 3 times;
- `--preempt REPLICA@SECONDS` is a Spot preemption: SIGTERM, SIGKILL 30 s later, and "the job
  fails with a STOCKOUT error and Compute Engine tries to restart the job up to six times": every
  replica starts again on a new machine (a new container, a fresh disk);
- `--maintenance REPLICA@SECONDS` is VM maintenance: SIGTERM, SIGKILL 30 s later, and the replica
  alone comes back on another machine under the same hostname, up to 5 times before the job is
  retried; with scheduling.restartJobOnWorkerRestart (unless scheduling.disableRetries) every
  replica restarts with it;
- `REPLICA@/REGEX/` instead of seconds: when the replica prints a line that matches, such as
  `workerpool1-0@/epoch 2/3 begins/`;
- the job ends when pool 0's replica exits 0; the others are then stopped. A worker that exits 0
  first stays finished;
- scheduling.timeout ends the job;
- the engine failing to run a replica (an image it cannot find or pull, a container it cannot
  create, a command that cannot start) ends the job at once, with exit code 125 and one line.
Every line is shown with its replica and the severity Cloud Logging gives it: stdout is INFO,
stderr is ERROR.

gs:// goes to a local Cloud Storage server (scripts/local_gcs.py) that holds every bucket the spec
names. Its proxy listens on this machine's loopback and on each job network's gateway, admits only
those networks, and reaches nothing but Cloud Storage (and the hosts --allow-host names): the
images a rehearsal runs cannot reach this machine's own services through it. Objects of other
buckets are read from the real Cloud Storage, anonymously (public objects: Keras' ImageNet
weights). The same buckets are files under /gcs/BUCKET/ in every replica, as Cloud Storage FUSE
shows them on Vertex (scripts/gcs_fuse.py, mounted on this machine and bound into each container).
With --real-gcs, the containers use Google's Cloud Storage with your Application Default
Credentials, mounted as `gcloud ai custom-jobs local-run` mounts them.

Why the runner drives the engine itself instead of `docker compose up`: compose restarts one
container at a time and ends when it likes, and Vertex's rules are about the job (a restart of
every replica, job retries, the end of pool 0, preemption).
The runner needs to see every exit to apply them. `--print-compose` prints the same replicas as a
compose file, for those who want one, without those rules.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    from scripts import engine as engine_settings, jobspec, local_gcs
except ImportError:  # python scripts/submit_job.py puts scripts/ itself first on sys.path
    import engine as engine_settings
    import jobspec
    import local_gcs

PORT = 2222
# Vertex's retry rules ("Understanding the training service", "Use Spot VMs"; docs/rehearsal.md).
REPLICA_RESTARTS = 5  # a replica restarted for a non-permanent reason (VM maintenance), before the job is retried
JOB_RETRIES = 3  # the whole job, after a possibly transient exit or a replica's restarts
TRANSIENT_EXIT_CODES = (6, 11, 134, 139)  # SIGABRT and SIGSEGV: "exit codes that could be transient"
SPOT_RESTARTS = 6  # "the job fails with a STOCKOUT error and Compute Engine tries to restart the job up to six times"
SPOT, RETRY = "spot", "retry"  # why a job restarts: each kind has its own limit
SPOT_GRACE_SECONDS = 30  # between a Spot VM's shutdown signal and its hard stop
STOP_GRACE_SECONDS = 10  # for replicas the job stops (its end, a restart of every replica)
# The project number Vertex gives CLOUD_ML_PROJECT_ID; a rehearsal has none.
LOCAL_PROJECT_NUMBER = "000000000000"
# Where gs:// objects of buckets the rehearsal does not hold come from: `{host}` is the Google host
# the job asked (public objects only, such as Keras' ImageNet weights).
PUBLIC_GCS = "https://{host}"
CA_IN_CONTAINER = "/etc/local-gcs/ca-bundle.pem"
CREDENTIALS_IN_CONTAINER = "/tmp/keys/cred_key.json"
HYPERTUNE_DIR = "/tmp/hypertune"  # cloudml-hypertune's default metrics file is output.metrics here
BUCKET_NAME = r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"


class JobError(jobspec.SpecError):
    """A spec or an option this runner cannot run; str() is one line."""


# --- the job as plain values ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Replica:
    pool: int
    index: int
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    accelerators: int = 0

    @property
    def name(self) -> str:
        return f"workerpool{self.pool}-{self.index}"


def job_spec_of(spec: dict) -> tuple[str, dict]:
    """("custom" | "tuning", the jobSpec). Takes a CustomJob, a HyperparameterTuningJob, or a bare jobSpec."""
    if "trialJobSpec" in spec:
        if "studySpec" not in spec:
            raise JobError("a HyperparameterTuningJob needs a studySpec")
        return "tuning", spec["trialJobSpec"]
    job_spec = spec.get("jobSpec", spec)
    if not isinstance(job_spec, dict) or not job_spec.get("workerPoolSpecs"):
        raise JobError("the spec has no jobSpec.workerPoolSpecs (nor trialJobSpec): not a CustomJob")
    return "custom", job_spec


def replicas_of(job_spec: dict) -> list[Replica]:
    pools = job_spec["workerPoolSpecs"]
    if not pools or not pools[0]:
        raise JobError("workerPoolSpecs[0] is empty: Vertex needs a replica in pool 0")
    replicas = []
    for pool, spec in enumerate(pools):
        if not spec:
            continue
        container = spec.get("containerSpec")
        if not container or not container.get("imageUri"):
            raise JobError(f"workerPoolSpecs[{pool}] has no containerSpec.imageUri (python packages are not run locally)")
        count = int(spec.get("replicaCount", 1))
        if pool == 0 and count != 1:
            raise JobError(f"workerPoolSpecs[0].replicaCount is {count}; Vertex runs exactly one replica in pool 0")
        env = tuple((item["name"], str(item.get("value", ""))) for item in container.get("env", []))
        for index in range(count):
            replicas.append(Replica(pool, index, container["imageUri"], tuple(container.get("command", [])),
                                    tuple(container.get("args", [])), env,
                                    int(spec.get("machineSpec", {}).get("acceleratorCount", 0))))
    return replicas


def output_directories(job_spec: dict, trial: str | None = None) -> dict[str, str]:
    base = job_spec.get("baseOutputDirectory", {}).get("outputUriPrefix")
    if not base:
        return {}
    base = base.rstrip("/") + (f"/{trial}" if trial else "")
    return {"AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/"}


def replica_environments(job_spec: dict, job_id: str, trial: str | None = None) -> dict[str, dict[str, str]]:
    """What Vertex tells each replica, by replica name: the spec's env, then Vertex's own variables."""
    clusters = jobspec.cluster_environments("vertex", {"jobSpec": job_spec})
    environments = {}
    for replica, cluster in zip(replicas_of(job_spec), clusters):
        env = dict(replica.env)
        for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
            if variable in cluster:
                value = json.loads(cluster[variable])
                if trial:
                    value["task"]["trial"] = trial
                env[variable] = json.dumps(value)
        env.update(output_directories(job_spec, trial))
        env["CLOUD_ML_PROJECT_ID"] = LOCAL_PROJECT_NUMBER
        env["CLOUD_ML_JOB_ID"] = job_id
        if trial:
            env["CLOUD_ML_TRIAL_ID"] = trial
        environments[replica.name] = env
    return environments


def buckets_named(spec: dict) -> list[str]:
    """Every bucket the spec mentions, as gs://BUCKET or /gcs/BUCKET."""
    text = json.dumps(spec)
    return sorted(set(re.findall(rf"(?:gs:/|/gcs)/({BUCKET_NAME})(?![a-z0-9._-])", text)))


@dataclasses.dataclass(frozen=True)
class Preemption:
    """An event that takes a replica's machine away: a Spot preemption (SPOT: the job fails with
    STOCKOUT and is restarted whole) or VM maintenance ("maintenance": the replica alone comes back
    on another machine under its name)."""

    replica: str
    seconds: float | None = None  # after the job starts
    pattern: re.Pattern | None = None  # or when the replica prints a matching line
    kind: str = SPOT


def parse_preemption(text: str, kind: str = SPOT) -> Preemption:
    option = "--preempt" if kind == SPOT else "--maintenance"
    name, _, when = text.partition("@")
    if re.fullmatch(r"workerpool[0-3]-\d+", name):
        if re.fullmatch(r"\d+(\.\d+)?", when):
            return Preemption(name, seconds=float(when), kind=kind)
        if len(when) > 2 and when.startswith("/") and when.endswith("/"):
            try:
                return Preemption(name, pattern=re.compile(when[1:-1]), kind=kind)
            except re.error:
                pass
    raise JobError(f"{option} takes REPLICA@SECONDS or REPLICA@/REGEX/, like workerpool1-0@40; got {text!r}")


def draw_parameters(study_spec: dict, rng: random.Random) -> dict[str, str]:
    """One trial's values, drawn as random search draws them, formatted as Vertex passes them."""
    values = {}
    for parameter in study_spec.get("parameters", []):
        name = parameter["parameterId"]
        log_scale = parameter.get("scaleType") == "UNIT_LOG_SCALE"
        if "doubleValueSpec" in parameter:
            low, high = parameter["doubleValueSpec"]["minValue"], parameter["doubleValueSpec"]["maxValue"]
            value = math.exp(rng.uniform(math.log(low), math.log(high))) if log_scale else rng.uniform(low, high)
            values[name] = f"{value:.6g}"
        elif "integerValueSpec" in parameter:
            spec = parameter["integerValueSpec"]
            values[name] = str(rng.randint(int(spec["minValue"]), int(spec["maxValue"])))
        elif "discreteValueSpec" in parameter:
            value = float(rng.choice(parameter["discreteValueSpec"]["values"]))
            values[name] = str(int(value)) if value.is_integer() else f"{value:g}"
        elif "categoricalValueSpec" in parameter:
            values[name] = rng.choice(parameter["categoricalValueSpec"]["values"])
        else:
            raise JobError(f"parameter {name}: no value spec this runner knows")
    return values


def with_trial_args(job_spec: dict, values: dict[str, str]) -> dict:
    """The trial's jobSpec: Vertex appends --PARAMETER=VALUE to every pool's args."""
    trial = json.loads(json.dumps(job_spec))
    for pool in trial["workerPoolSpecs"]:
        if pool:
            container = pool["containerSpec"]
            container["args"] = list(container.get("args", [])) + [f"--{k}={v}" for k, v in values.items()]
    return trial


def last_metric(metrics_file: Path, metric: str) -> float | None:
    """The last value cloudml-hypertune wrote for `metric` (one JSON object per line)."""
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return float(json.loads(line)[metric])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def compose_file(job_spec: dict, job_id: str, credentials: str | None = None) -> dict:
    """The replicas as a compose file: Vertex's names and environment. A failed replica is not
    restarted: on Vertex it fails the job, which compose cannot express."""
    services = {}
    for replica in replicas_of(job_spec):
        env = replica_environments(job_spec, job_id)[replica.name]
        service: dict = {"image": replica.image, "hostname": replica.name,
                         "networks": {"job": {"aliases": [replica.name]}},
                         "environment": env, "restart": "no", "stop_grace_period": "30s"}
        if replica.command:
            service["entrypoint"] = list(replica.command)
        if replica.args:
            service["command"] = list(replica.args)
        if credentials:
            service["volumes"] = [f"{credentials}:{CREDENTIALS_IN_CONTAINER}:ro"]
            env["GOOGLE_APPLICATION_CREDENTIALS"] = CREDENTIALS_IN_CONTAINER
        services[replica.name] = service
    return {"name": f"vertex-local-{job_id}", "services": services, "networks": {"job": {}}}


def default_credentials(environ=os.environ) -> str:
    path = environ.get("GOOGLE_APPLICATION_CREDENTIALS") or os.path.join(
        os.path.expanduser("~"), ".config", "gcloud", "application_default_credentials.json")
    if not os.path.isfile(path):
        raise JobError(f"--real-gcs needs Application Default Credentials; {path} does not exist "
                       "(run `gcloud auth application-default login`)")
    return path


# --- the container engine ---------------------------------------------------------------------

class EngineFailure(Exception):
    """The engine could not run a replica: its image could not be found or pulled, its container
    could not be created, or its command could not start. Vertex reports these once, as a job
    error, and restarts nothing."""

    def __init__(self, replica: "Replica", message: str):
        super().__init__(f"{replica.name}: the engine could not run {replica.image}: {message}")


ENGINE_FAILURE_EXIT = 125  # what docker and podman themselves return when they, not the command, failed


class Engine:
    """docker or podman, through its command line, with the settings scripts/engine.py gives every
    script of the project (so it sees the images scripts/images.sh builds)."""

    def __init__(self, tool: str, environ: dict[str, str] | None = None):
        self.tool = tool
        self.environ = {**os.environ, **(environ or {})}

    @staticmethod
    def detect(requested: str | None = None) -> "Engine":
        try:
            chosen = engine_settings.settings(requested)
        except engine_settings.EngineError as error:
            raise JobError(str(error)) from None
        return Engine(chosen.engine, chosen.environ)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.tool, *args], capture_output=True, text=True, env=self.environ)

    def __call__(self, *args: str, check: bool = True) -> str:
        result = self.run(*args)
        if check and result.returncode != 0:
            raise JobError(f"{self.tool} {' '.join(args[:2])}: {last_line(result.stderr) or result.returncode}")
        return result.stdout

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=self.environ)

    def create_network(self, name: str) -> tuple[str, str]:
        """Creates a network; (its subnet, the host's address on it)."""
        self("network", "create", name)
        info = json.loads(self("network", "inspect", name))[0]
        if "subnets" in info:  # podman
            subnet = info["subnets"][0]
            return subnet["subnet"], subnet["gateway"]
        config = info["IPAM"]["Config"][0]  # docker
        return config["Subnet"], config["Gateway"]

    def state(self, container: str, field: str) -> str | None:
        """A field of the container's State, as the engine prints it; None if there is no such container."""
        inspected = self.run("inspect", "--format", f"{{{{.State.{field}}}}}", container)
        return inspected.stdout.strip() if inspected.returncode == 0 else None

    def has_started(self, container: str) -> bool:
        """Whether the container's command has ever run (a container that could not start has
        the zero time). True for a container that is gone: nothing more can be said of it."""
        started = self.state(container, "StartedAt")
        return started is None or not started.startswith("0001-01-01")

    def out_of_memory(self, container: str) -> bool:
        return self.state(container, "OOMKilled") == "true"

    def gpu_flags(self) -> list[str]:
        if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
            return []
        return ["--gpus", "all"] if self.tool == "docker" else ["--device", "nvidia.com/gpu=all"]


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- one job ----------------------------------------------------------------------------------

class Output:
    """Every line of the run, with its replica and severity, one writer at a time."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.lock = threading.Lock()

    def line(self, source: str, severity: str, text: str) -> None:
        with self.lock:
            self.stream.write(f"{source:<15} {severity:<7} {text.rstrip()}\n")
            self.stream.flush()

    def note(self, text: str, severity: str = "NOTICE") -> None:
        self.line("local-run", severity, text)


@dataclasses.dataclass
class Options:
    engine: Engine
    storage: dict[str, str]  # variables for every container
    mounts: list[str]  # -v arguments for every container
    preemptions: list[Preemption] = dataclasses.field(default_factory=list)
    replica_restarts: int = REPLICA_RESTARTS
    job_retries: int = JOB_RETRIES
    # Called with each job network's (subnet, gateway) as it is made; returns the variables that
    # reach Cloud Storage from that network.
    on_network: object = None
    # Set when the run is interrupted: no replica starts any more, and running jobs end.
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    jobs: list = dataclasses.field(default_factory=list)  # every JobRun started, for the cleanup


@dataclasses.dataclass
class Outcome:
    state: str  # JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED
    exit_code: int
    message: str


class Cancelled(Exception):
    """The run was interrupted while this job was running."""


class JobRun:
    """One CustomJob (or one tuning trial) from start to its end, with Vertex's restart rules."""

    def __init__(self, job_spec: dict, job_id: str, options: Options, output: Output, trial: str | None = None,
                 metrics_dir: Path | None = None):
        self.job_spec, self.options, self.output, self.trial = job_spec, options, output, trial
        self.replicas = replicas_of(job_spec)
        self.environments = replica_environments(job_spec, job_id, trial)
        self.network = f"vertex-local-{job_id}" + (f"-trial-{trial}" if trial else "")
        self.metrics_dir = metrics_dir
        scheduling = job_spec.get("scheduling", {})
        # disableRetries "overrides restart_job_on_worker_restart to false" (CustomJobSpec reference).
        self.restart_all = bool(scheduling.get("restartJobOnWorkerRestart")) and not scheduling.get("disableRetries")
        self.timeout = float(scheduling["timeout"].rstrip("s")) if scheduling.get("timeout") else None
        self.exits = {r.name: [] for r in self.replicas}
        self.launches = collections.Counter()  # a replica's starts: its first, then every restart
        self.last_errors = {r.name: collections.deque(maxlen=3) for r in self.replicas}
        self.processes: dict[str, subprocess.Popen] = {}
        self.readers: dict[str, list[threading.Thread]] = {}
        self.created: set[str] = set()  # containers that exist: a restart on the same machine starts them again
        self.engine_errors: dict[str, list[str]] = {}  # what the engine said when a container could not start
        self.failed_replica: Replica | None = None
        self.retry_reason: tuple[str, str] = ("", "")  # why the last attempt ended in a restart of the job
        self.matched: set[str] = set()  # replicas that printed their preemption's pattern
        self.storage = dict(options.storage)
        self.lock = threading.Lock()  # launches against removal, which may come from another thread

    def container(self, replica: Replica) -> str:
        return f"{self.network}-{replica.name}"

    def source(self, replica: Replica) -> str:
        return f"trial-{self.trial}/{replica.name}" if self.trial else replica.name

    # containers

    def create_arguments(self, replica: Replica) -> list[str]:
        env = {**self.environments[replica.name], **self.storage}
        if "https_proxy" in env:
            # gRPC honours the proxy too: the replicas' own traffic must not go through it.
            env["no_proxy"] = env["NO_PROXY"] = ",".join(["localhost", "127.0.0.1", "::1", *(r.name for r in self.replicas)])
        arguments = ["--name", self.container(replica), "--hostname", replica.name, "--network", self.network,
                     "--network-alias", replica.name]
        for key, value in env.items():
            arguments += ["-e", f"{key}={value}"]
        for mount in self.options.mounts:
            arguments += ["-v", mount]
        if self.metrics_dir is not None and replica.pool == 0:
            arguments += ["-v", f"{self.metrics_dir}:{HYPERTUNE_DIR}"]
        if replica.accelerators:
            arguments += self.options.engine.gpu_flags()
        if replica.command:
            arguments += ["--entrypoint", replica.command[0], replica.image, *replica.command[1:]]
        else:
            arguments += [replica.image]
        return arguments + list(replica.args)

    def launch(self, replica: Replica, new_machine: bool) -> None:
        """Starts the replica: a new container on a new machine, else the stopped one again.
        Raises EngineFailure when its container cannot be created (an image that is not there)."""
        engine, name = self.options.engine, self.container(replica)
        with self.lock:
            if self.options.cancelled.is_set():
                raise Cancelled()
            if new_machine or name not in self.created:
                engine.run("rm", "-f", name)
                self.created.add(name)  # before create: an interrupted create still gets removed
                created = engine.run("create", *self.create_arguments(replica))
                if created.returncode != 0:
                    raise EngineFailure(replica, last_line(created.stderr) or f"{engine.tool} create exited {created.returncode}")
            self.launches[replica.name] += 1
            process = engine.popen("start", "--attach", name)
            self.processes[replica.name] = process
        self.engine_errors.pop(replica.name, None)
        self.readers[replica.name] = [
            threading.Thread(target=self.relay, args=(replica, process.stdout, "INFO"), daemon=True),
            threading.Thread(target=self.relay, args=(replica, process.stderr, "ERROR"), daemon=True)]
        for reader in self.readers[replica.name]:
            reader.start()

    def relay(self, replica: Replica, stream, severity: str) -> None:
        patterns = [p.pattern for p in self.options.preemptions if p.replica == replica.name and p.pattern]
        # The engine's own complaint when the command cannot start (`start --attach` prints it on
        # stderr) is not the replica's: stderr is held back until the container is seen running.
        held: list[str] | None = [] if severity == "ERROR" else None
        for line in stream:
            if held is not None:
                if not self.options.engine.has_started(self.container(replica)):
                    held.append(line)
                    continue
                for early in held:
                    self.replica_line(replica, severity, early, patterns)
                held = None
            self.replica_line(replica, severity, line, patterns)
        if held:
            if self.options.engine.has_started(self.container(replica)):
                for early in held:
                    self.replica_line(replica, severity, early, patterns)
            else:
                self.engine_errors[replica.name] = [line.strip() for line in held if line.strip()]

    def replica_line(self, replica: Replica, severity: str, line: str, patterns) -> None:
        self.output.line(self.source(replica), severity, line)
        if any(pattern.search(line) for pattern in patterns):
            self.matched.add(replica.name)
        if severity == "ERROR" and line.strip():
            self.last_errors[replica.name].append(line.strip())

    def send(self, replica: Replica, name: str) -> None:
        self.options.engine("kill", "--signal", name, self.container(replica), check=False)

    def reap(self, replica: Replica, code: int) -> None:
        for reader in self.readers.pop(replica.name, []):
            reader.join(timeout=10)
        del self.processes[replica.name]
        self.exits[replica.name].append(code)
        said = self.engine_errors.get(replica.name)
        if code != 0 and said is not None and not self.options.engine.has_started(self.container(replica)):
            raise EngineFailure(replica, said[-1] if said else f"{self.options.engine.tool} start exited {code}")

    def stop(self, replicas) -> None:
        """Stops these replicas as a job ends or restarts: SIGTERM, then SIGKILL after the grace."""
        running = [r for r in replicas if r.name in self.processes]
        if not running:
            return
        self.options.engine("stop", "-t", str(STOP_GRACE_SECONDS), *(self.container(r) for r in running), check=False)
        for replica in running:
            process = self.processes[replica.name]
            try:
                code = process.wait(timeout=STOP_GRACE_SECONDS + 30)
            except subprocess.TimeoutExpired:
                self.send(replica, "KILL")
                code = process.wait()
            for reader in self.readers.pop(replica.name, []):
                reader.join(timeout=10)
            del self.processes[replica.name]
            self.exits[replica.name].append(code)

    def halt(self) -> None:
        """Stops every container of the job at once, from any thread: an interrupted run. The
        job's own thread then sees them exit, and ends."""
        with self.lock:
            names = sorted(self.created)
        if names:
            self.options.engine("stop", "-t", str(STOP_GRACE_SECONDS), *names, check=False)

    def remove(self) -> None:
        """Removes every container it made, whatever state it is in, and its network. Safe to
        call again, and from any thread."""
        with self.lock:
            names = sorted(self.created)
        if names:
            self.options.engine("rm", "-f", *names, check=False)
        self.options.engine("network", "rm", "-f", self.network, check=False)

    # the rules

    def run(self) -> Outcome:
        self.options.jobs.append(self)
        subnet, gateway = self.options.engine.create_network(self.network)
        if self.options.on_network:
            self.storage.update(self.options.on_network(subnet, gateway))
        try:
            started, retries = time.monotonic(), collections.Counter()
            while True:
                outcome = self.attempt(started, first=not retries)
                if outcome is not None:
                    return outcome
                kind, reason = self.retry_reason
                limit = SPOT_RESTARTS if kind == SPOT else self.options.job_retries
                retries[kind] += 1
                if retries[kind] > limit:
                    code = self.exits[self.failed_replica.name][-1] if self.failed_replica else 1
                    return Outcome("JOB_STATE_FAILED", code, f"{reason}; the job was already restarted {limit} times")
                self.output.note(f"{reason}: restarting the whole job on new machines "
                                 f"({'Spot restart' if kind == SPOT else 'retry'} {retries[kind]} of {limit})", "WARNING")
        except EngineFailure as failure:
            self.stop(self.replicas)
            return Outcome("JOB_STATE_FAILED", ENGINE_FAILURE_EXIT, str(failure))
        except Cancelled:
            return Outcome("JOB_STATE_CANCELLED", 130, "interrupted")
        except BaseException:
            self.halt()  # Ctrl-C or SIGTERM in this thread: the replicas get their grace, as on Vertex
            raise
        finally:
            self.remove()

    def attempt(self, started: float, first: bool) -> Outcome | None:
        """One run of every replica. Returns the job's outcome, or None when the job is to be
        retried (self.retry_reason says why)."""
        failures = collections.Counter()  # non-permanent failures (maintenance) per replica
        evicted: dict[str, float] = {}  # replica -> when SIGKILL follows its SIGTERM
        stockout: str | None = None  # the Spot preemption that ends this attempt
        # Each preemption and maintenance event happens once, in the job's first run.
        due = list(self.options.preemptions) if first else []
        by_name = {r.name: r for r in self.replicas}
        for replica in self.replicas:
            self.launch(replica, new_machine=True)
        while True:
            if self.options.cancelled.is_set():
                raise Cancelled()
            now = time.monotonic() - started
            if self.timeout and now > self.timeout:
                self.stop(self.replicas)
                return Outcome("JOB_STATE_FAILED", 124, f"the job ran past scheduling.timeout ({self.timeout:g}s)")
            for event in [p for p in due if (p.seconds is not None and p.seconds <= now) or p.replica in self.matched]:
                due.remove(event)
                if event.replica in self.processes:
                    what = "preempting (Spot VM)" if event.kind == SPOT else "VM maintenance on"
                    self.output.note(f"{what} {event.replica}: SIGTERM now, SIGKILL in {SPOT_GRACE_SECONDS}s", "WARNING")
                    self.send(by_name[event.replica], "TERM")
                    evicted[event.replica] = time.monotonic() + SPOT_GRACE_SECONDS
                    if event.kind == SPOT:
                        stockout = event.replica
            for name, kill_at in list(evicted.items()):
                if name in self.processes and time.monotonic() > kill_at:
                    self.send(by_name[name], "KILL")
            if stockout is not None and stockout not in self.processes:
                # Spot: the job fails with STOCKOUT and is restarted whole, on new machines.
                self.stop(self.replicas)
                self.failed_replica = by_name[stockout]
                self.retry_reason = (SPOT, f"{stockout} was preempted (STOCKOUT)")
                return None
            for replica in self.replicas:
                process = self.processes.get(replica.name)
                if process is None or process.poll() is None:
                    continue
                code = process.returncode
                self.reap(replica, code)
                if replica.pool == 0 and code == 0:
                    self.stop(self.replicas)
                    return Outcome("JOB_STATE_SUCCEEDED", 0, "the replica in pool 0 finished")
                if code == 0 or stockout is not None:
                    continue  # a finished worker stays finished; after a preemption the job restarts anyway
                if evicted.pop(replica.name, None) is not None:
                    # Maintenance, not the replica's fault: it comes back on another machine, under
                    # its name, at most replica_restarts times.
                    failures[replica.name] += 1
                    if failures[replica.name] > self.options.replica_restarts:
                        self.stop(self.replicas)
                        self.retry_reason = (RETRY, f"{replica.name} was restarted {self.options.replica_restarts} times")
                        return None
                    if self.restart_all:
                        self.output.note(f"{replica.name} restarted on another machine: restarting every replica "
                                         "(restartJobOnWorkerRestart)", "WARNING")
                        self.stop(self.replicas)
                        for each in self.replicas:
                            self.launch(each, new_machine=each is replica)
                    else:
                        self.output.note(f"{replica.name} restarted on another machine", "WARNING")
                        self.launch(replica, new_machine=True)
                    continue
                self.failed_replica = replica
                self.stop(self.replicas)
                if code in TRANSIENT_EXIT_CODES:
                    self.retry_reason = (RETRY, f"{self.failure_message(replica)} (possibly transient)")
                    return None
                return Outcome("JOB_STATE_FAILED", code, self.failure_message(replica))
            time.sleep(0.2)

    def failure_message(self, replica: Replica) -> str:
        code = self.exits[replica.name][-1]
        if self.options.engine.out_of_memory(self.container(replica)):
            said = f"The replica {replica.name} ran out of memory and exited with a non-zero status of {code}."
        else:
            said = f"The replica {replica.name} exited with a non-zero status of {code}."
        last = self.last_errors[replica.name]
        return said + (f" Last error: {last[-1]}" if last else "")

    def summary(self) -> list[str]:
        return [f"{r.name}: exit codes {','.join(map(str, self.exits[r.name])) or '-'}; "
                f"restarts {max(self.launches[r.name] - 1, 0)}" for r in self.replicas]


# --- the command ------------------------------------------------------------------------------

def stage(server, pairs: list[str]) -> list[str]:
    """Copies local files into the local server before the job: LOCAL=gs://BUCKET/PREFIX.
    Returns the buckets written to."""
    buckets = []
    for pair in pairs:
        local, _, target = pair.partition("=")
        match = re.fullmatch(rf"gs://({BUCKET_NAME})/?(.*)", target)
        if not match or not os.path.exists(local):
            raise JobError(f"--stage takes LOCAL_PATH=gs://BUCKET/PREFIX with an existing LOCAL_PATH; got {pair!r}")
        bucket, prefix = match.group(1), match.group(2).rstrip("/")
        server.create_bucket(bucket)
        buckets.append(bucket)
        root = Path(local)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            relative = path.name if root.is_file() else path.relative_to(root).as_posix()
            server.upload(bucket, f"{prefix}/{relative}" if prefix else relative, path.read_bytes())
    return buckets


def keep(server, buckets: list[str], directory: Path) -> int:
    """Copies every object out of the local server, which keeps them only in memory."""
    count = 0
    for bucket in buckets:
        for name in server.list(bucket):
            if name.endswith("/"):
                (directory / bucket / name).mkdir(parents=True, exist_ok=True)
                continue
            path = directory / bucket / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(server.download(bucket, name))
            count += 1
    return count


def mount_buckets(server, mountpoint: Path, output: Output) -> subprocess.Popen | None:
    """The server's buckets as files (scripts/gcs_fuse.py), or None, said once, where FUSE is missing."""
    missing = [what for what, there in (("/dev/fuse", os.path.exists("/dev/fuse")),
                                        ("fusermount3 (Debian: fuse3)", shutil.which("fusermount3")))
               if not there]
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as error:
        missing.append(f"mfusepy ({error})")
    if missing:
        output.note(f"no /gcs/ in the replicas: this machine lacks {', '.join(missing)}; gs:// works", "WARNING")
        return None
    mountpoint.mkdir(parents=True)
    log = mountpoint.with_suffix(".log")
    with open(log, "wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "scripts.gcs_fuse", "--api",
                                    f"http://127.0.0.1:{server.backend_port}", str(mountpoint)],
                                   cwd=Path(__file__).resolve().parent.parent, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not os.path.ismount(mountpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            lines = log.read_text(errors="replace").strip().splitlines()
            raise JobError(f"could not mount the buckets under {mountpoint}: {lines[-1] if lines else 'no output'}")
        time.sleep(0.1)
    return process


def unmount(process: subprocess.Popen, mountpoint: Path) -> None:
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def not_emulated(job_spec: dict) -> str:
    machines = sorted({json.dumps(p.get("machineSpec", {}), sort_keys=True) for p in job_spec["workerPoolSpecs"] if p})
    return ("machine types and accelerators are not emulated: every replica runs on this machine "
            f"({'; '.join(machines)} asked)")


def run(spec: dict, *, engine: str | None = None, real_gcs: bool = False, preemptions=(), stages=(),
        keep_dir: str | None = None, replica_restarts: int = REPLICA_RESTARTS, job_retries: int = JOB_RETRIES,
        seed: int = 0, allow_hosts=(), public_gcs: str | None = PUBLIC_GCS, output: Output | None = None) -> int:
    """Runs the spec; returns the job's exit code (0 when pool 0 succeeded)."""
    output = output or Output()
    kind, job_spec = job_spec_of(spec)
    replicas = replicas_of(job_spec)
    names = {r.name for r in replicas}
    preemptions = [p if isinstance(p, Preemption) else parse_preemption(p) for p in preemptions]
    for preemption in preemptions:
        if preemption.replica not in names:
            option = "--preempt" if preemption.kind == SPOT else "--maintenance"
            raise JobError(f"{option} {preemption.replica}: the job has no such replica ({', '.join(sorted(names))})")
    if real_gcs and stages:
        raise JobError("--stage is for the local Cloud Storage server; with --real-gcs, copy with gcloud storage cp")
    tool = Engine.detect(engine)
    job_id = str(int(time.time() * 1000))
    scratch = Path(tempfile.mkdtemp(prefix="vertex-local-"))
    server = fuse = None
    options = Options(tool, {}, [], preemptions, replica_restarts, job_retries)
    previous_handlers = _interrupt_on_signals()
    try:
        if real_gcs:
            credentials = default_credentials()
            options.storage["GOOGLE_APPLICATION_CREDENTIALS"] = CREDENTIALS_IN_CONTAINER
            options.mounts.append(f"{credentials}:{CREDENTIALS_IN_CONTAINER}:ro")
        else:
            server = local_gcs.LocalGCS(scratch / "gcs", allowed_hosts=allow_hosts, upstream=public_gcs,
                                        log=lambda line: output.note(line, "WARNING")).start()
            buckets = buckets_named(spec)
            for bucket in buckets:
                server.create_bucket(bucket)
            buckets = sorted(set(buckets) | set(stage(server, list(stages))))
            options.mounts.append(f"{server.ca}:{CA_IN_CONTAINER}:ro")
            fuse = mount_buckets(server, scratch / "gcs-files", output)
            if fuse is not None:
                options.mounts.append(f"{scratch / 'gcs-files'}:/gcs")

            def admit(subnet: str, gateway: str) -> dict[str, str]:
                # The proxy listens on the network's gateway (this machine, as the job's network
                # sees it) and admits the network's addresses, nothing wider.
                proxy = server.serve_network(subnet, gateway)
                return {"https_proxy": proxy, "HTTPS_PROXY": proxy, **local_gcs.ca_variables(CA_IN_CONTAINER),
                        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"}
            options.on_network = admit
        output.note(not_emulated(job_spec))
        output.note("Cloud Storage: " + ("Google's, with your Application Default Credentials" if real_gcs else
                                          f"a local server holding {', '.join(f'gs://{b}' for b in buckets) or 'no bucket'}"))
        if kind == "custom":
            job = JobRun(job_spec, job_id, options, output)
            outcome = job.run()
            for line in job.summary():
                output.note(line)
            output.note(f"{outcome.state}: {outcome.message}", "INFO" if outcome.exit_code == 0 else "ERROR")
            code = outcome.exit_code
        else:
            code = run_trials(spec, job_spec, job_id, options, output, scratch, seed)
        if keep_dir and server is not None:
            count = keep(server, buckets, Path(keep_dir))
            output.note(f"copied {count} objects from the local Cloud Storage server to {keep_dir}")
        return code
    except KeyboardInterrupt:
        output.note("interrupted: stopping and removing the job's containers and networks", "WARNING")
        return 130
    finally:
        if previous_handlers is not None:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cancel(options)
        for job in options.jobs:  # whatever an interrupted trial made after it was told to stop
            job.remove()
        if fuse is not None:
            unmount(fuse, scratch / "gcs-files")
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        if previous_handlers is not None:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)


def _interrupt_on_signals() -> dict | None:
    """Ctrl-C and SIGTERM (a CI runner's cancel, `kill`) both interrupt the run, which then cleans
    up; returns the handlers to restore. Signals reach only the main thread: elsewhere, None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, _interrupt)
    return previous


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def cancel(options: Options) -> None:
    """No replica starts any more; every running one gets its stop signal now (the jobs' own
    threads then see them exit). A no-op once every job has ended."""
    options.cancelled.set()
    for job in options.jobs:
        if job.processes:
            job.halt()


def run_trials(spec: dict, job_spec: dict, job_id: str, options: Options, output: Output, scratch: Path,
               seed: int) -> int:
    """Runs maxTrialCount trials, parallelTrialCount at a time, and prints them ranked."""
    study = spec["studySpec"]
    metric = study["metrics"][0]
    total, parallel = int(spec.get("maxTrialCount", 1)), int(spec.get("parallelTrialCount", 1))
    rng = random.Random(seed)
    trials = {str(n): draw_parameters(study, rng) for n in range(1, total + 1)}

    def trial(number: str) -> tuple[str, Outcome, float | None]:
        metrics_dir = scratch / f"trial-{number}"
        metrics_dir.mkdir()
        metrics_dir.chmod(0o777)  # the image's user may not be this machine's
        output.note(f"trial {number}: " + " ".join(f"--{k}={v}" for k, v in trials[number].items()))
        job = JobRun(with_trial_args(job_spec, trials[number]), job_id, options, output, number, metrics_dir)
        outcome = job.run()
        for line in job.summary():
            output.note(f"trial {number}: {line}")
        return number, outcome, last_metric(metrics_dir / "output.metrics", metric["metricId"])

    executor = concurrent.futures.ThreadPoolExecutor(parallel)
    try:
        futures = [executor.submit(trial, number) for number in trials]
        results = [future.result() for future in futures]
    except BaseException:
        cancel(options)  # the running trials stop now, instead of being waited for
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    reverse = metric.get("goal", "MAXIMIZE") == "MAXIMIZE"
    ranked = sorted(results, key=lambda r: (r[2] is None, -(r[2] or 0) if reverse else (r[2] or 0)))
    output.note(f"trials ranked by {metric['metricId']} ({metric.get('goal', 'MAXIMIZE')}):")
    for rank, (number, outcome, value) in enumerate(ranked, 1):
        shown = "-" if value is None else f"{value:.4f}"
        params = " ".join(f"{k}={v}" for k, v in trials[number].items())
        output.note(f"{rank}. trial {number}: {metric['metricId']}={shown} {params} {outcome.state}")
    return 0 if any(o.exit_code == 0 for _, o, _ in results) else 1
