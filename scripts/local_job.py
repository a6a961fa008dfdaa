"""Runs a Vertex AI CustomJob or HyperparameterTuningJob on this machine, as Vertex would run it.

    python -m scripts.submit_job local vertex [vertex options] [-- TRAINER_ARGS]
    python -m scripts.submit_job local hptune [hptune options] [-- TRAINER_ARGS]
    python -m scripts.submit_job local --spec job.json

One container per replica, from the spec's imageUri, command, args and env, on a private network
where each replica is reachable by its Vertex name (workerpool0-0, workerpool1-0, ...). Each is
told what Vertex tells it: CLUSTER_SPEC and TF_CONFIG, the AIP_* output directories under the
baseOutputDirectory (under BASE/TRIAL/ in a tuning trial), CLOUD_ML_JOB_ID, CLOUD_ML_TRIAL_ID.

Vertex's rules, applied here:
- a replica that exits non-zero is restarted under its name, on the same machine (the same
  container, so its local disk is kept), up to 5 times; one more failure restarts the whole
  job, at most 3 times, and then the job fails;
- with scheduling.restartJobOnWorkerRestart, a restarted replica restarts every replica;
- the job ends when pool 0's replica ends; the others are then stopped;
- scheduling.timeout ends the job;
- `--preempt REPLICA@SECONDS` is a Spot preemption: SIGTERM, SIGKILL 30 s later, and the replica
  comes back on a new machine (a new container). `REPLICA@/REGEX/` preempts it when it prints a
  line that matches, such as `workerpool1-0@/epoch 2/3 begins/`.
Every line is shown with its replica and the severity Cloud Logging gives it: stdout is INFO,
stderr is ERROR.

gs:// goes to a local Cloud Storage server (scripts/local_gcs.py) that holds every bucket the spec
names, reached through a proxy only the job's network may use. The same buckets are files under
/gcs/BUCKET/ in every replica, as Cloud Storage FUSE shows them on Vertex (scripts/gcs_fuse.py,
mounted on this machine and bound into each container). With --real-gcs, the containers use
Google's Cloud Storage with your Application Default Credentials, mounted as
`gcloud ai custom-jobs local-run` mounts them.

Why the runner drives the engine itself instead of `docker compose up`: compose restarts one
container at a time and ends when it likes, and Vertex's rules are about the job (a restart of
every replica, job retries after a replica's restarts run out, the end of pool 0, preemption).
The runner needs to see every exit to apply them. `--print-compose` prints the same replicas as a
compose file, for those who want one; it restarts replicas as Vertex does, and nothing more.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import ipaddress
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
    from scripts import jobspec, local_gcs
except ImportError:  # python scripts/submit_job.py puts scripts/ itself first on sys.path
    import jobspec
    import local_gcs

PORT = 2222
REPLICA_RESTARTS = 5  # per replica, after a non-zero exit
JOB_RETRIES = 3  # the whole job, once a replica has used its restarts
SPOT_GRACE_SECONDS = 30  # between a Spot VM's shutdown signal and its hard stop
STOP_GRACE_SECONDS = 10  # for replicas the job stops (its end, a restart of every replica)
CA_IN_CONTAINER = "/etc/local-gcs/ca.pem"
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
            value = json.loads(cluster[variable])
            if trial:
                value["task"]["trial"] = trial
            if variable == "CLUSTER_SPEC":
                value["job"] = json.dumps(job_spec)  # Vertex puts the job's own spec here, as a string
            env[variable] = json.dumps(value)
        env.update(output_directories(job_spec, trial))
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
    replica: str
    seconds: float | None = None  # after the job starts
    pattern: re.Pattern | None = None  # or when the replica prints a matching line


def parse_preemption(text: str) -> Preemption:
    name, _, when = text.partition("@")
    if re.fullmatch(r"workerpool[0-3]-\d+", name):
        if re.fullmatch(r"\d+(\.\d+)?", when):
            return Preemption(name, seconds=float(when))
        if len(when) > 2 and when.startswith("/") and when.endswith("/"):
            try:
                return Preemption(name, pattern=re.compile(when[1:-1]))
            except re.error:
                pass
    raise JobError(f"--preempt takes REPLICA@SECONDS or REPLICA@/REGEX/, like workerpool1-0@40; got {text!r}")


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
    """The replicas as a compose file: Vertex's names and environment, Vertex's per-replica restarts."""
    services = {}
    for replica in replicas_of(job_spec):
        env = replica_environments(job_spec, job_id)[replica.name]
        service: dict = {"image": replica.image, "hostname": replica.name,
                         "networks": {"job": {"aliases": [replica.name]}},
                         "environment": env, "restart": f"on-failure:{REPLICA_RESTARTS}", "stop_grace_period": "30s"}
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

class Engine:
    """docker or podman, through its command line."""

    def __init__(self, tool: str):
        self.tool = tool

    @staticmethod
    def detect(requested: str | None = None) -> "Engine":
        if requested:
            return Engine(requested)
        if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            return Engine("docker")
        if shutil.which("podman"):
            return Engine("podman")
        raise JobError("no container engine: install docker (with its daemon running) or podman")

    def __call__(self, *args: str, check: bool = True) -> str:
        result = subprocess.run([self.tool, *args], capture_output=True, text=True)
        if check and result.returncode != 0:
            raise JobError(f"{self.tool} {' '.join(args[:2])}: {result.stderr.strip().splitlines()[-1:] or result.returncode}")
        return result.stdout

    def create_network(self, name: str) -> tuple[str, str]:
        """Creates a network; (its subnet, the host's address on it)."""
        self("network", "create", name)
        info = json.loads(self("network", "inspect", name))[0]
        if "subnets" in info:  # podman
            subnet = info["subnets"][0]
            return subnet["subnet"], subnet["gateway"]
        config = info["IPAM"]["Config"][0]  # docker
        return config["Subnet"], config["Gateway"]

    def gpu_flags(self) -> list[str]:
        if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
            return []
        return ["--gpus", "all"] if self.tool == "docker" else ["--device", "nvidia.com/gpu=all"]


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


@dataclasses.dataclass
class Outcome:
    state: str  # JOB_STATE_SUCCEEDED, JOB_STATE_FAILED
    exit_code: int
    message: str


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
        self.restart_all = bool(scheduling.get("restartJobOnWorkerRestart"))
        self.timeout = float(scheduling["timeout"].rstrip("s")) if scheduling.get("timeout") else None
        self.exits = {r.name: [] for r in self.replicas}
        self.launches = collections.Counter()  # a replica's starts: its first, then every restart
        self.last_errors = {r.name: collections.deque(maxlen=3) for r in self.replicas}
        self.processes: dict[str, subprocess.Popen] = {}
        self.readers: dict[str, list[threading.Thread]] = {}
        self.started: set[str] = set()
        self.failed_replica: Replica | None = None
        self.matched: set[str] = set()  # replicas that printed their preemption's pattern
        self.storage = dict(options.storage)
        self.removed = False

    def container(self, replica: Replica) -> str:
        return f"{self.network}-{replica.name}"

    def source(self, replica: Replica) -> str:
        return f"trial-{self.trial}/{replica.name}" if self.trial else replica.name

    # containers

    def launch(self, replica: Replica, new_machine: bool) -> None:
        """Starts the replica: a new container on a new machine, else the stopped one again."""
        engine, name = self.options.engine, self.container(replica)
        if name in self.started and not new_machine:
            command = [engine.tool, "start", "--attach", name]
        else:
            engine("rm", "-f", name, check=False)
            env = {**self.environments[replica.name], **self.storage}
            if "https_proxy" in env:
                # gRPC honours the proxy too: the replicas' own traffic must not go through it.
                env["no_proxy"] = env["NO_PROXY"] = ",".join(["localhost", "127.0.0.1", "::1", *(r.name for r in self.replicas)])
            command = [engine.tool, "run", "--name", name, "--hostname", replica.name, "--network", self.network,
                       "--network-alias", replica.name]
            for key, value in env.items():
                command += ["-e", f"{key}={value}"]
            for mount in self.options.mounts:
                command += ["-v", mount]
            if self.metrics_dir is not None and replica.pool == 0:
                command += ["-v", f"{self.metrics_dir}:{HYPERTUNE_DIR}"]
            if replica.accelerators:
                command += engine.gpu_flags()
            if replica.command:
                command += ["--entrypoint", replica.command[0], replica.image, *replica.command[1:]]
            else:
                command += [replica.image]
            command += list(replica.args)
            self.started.add(name)
        self.launches[replica.name] += 1
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        self.processes[replica.name] = process
        self.readers[replica.name] = [
            threading.Thread(target=self.relay, args=(replica, process.stdout, "INFO"), daemon=True),
            threading.Thread(target=self.relay, args=(replica, process.stderr, "ERROR"), daemon=True)]
        for reader in self.readers[replica.name]:
            reader.start()

    def relay(self, replica: Replica, stream, severity: str) -> None:
        patterns = [p.pattern for p in self.options.preemptions if p.replica == replica.name and p.pattern]
        for line in stream:
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
            self.reap(replica, code)

    def remove(self) -> None:
        """Stops and removes every container and the network; safe to call again."""
        if self.removed:
            return
        engine = self.options.engine
        self.stop(self.replicas)
        engine("rm", "-f", *(self.container(r) for r in self.replicas), check=False)
        engine("network", "rm", "-f", self.network, check=False)
        self.removed = True

    # the rules

    def run(self) -> Outcome:
        subnet, gateway = self.options.engine.create_network(self.network)
        if self.options.on_network:
            self.storage.update(self.options.on_network(subnet, gateway))
        try:
            started = time.monotonic()
            for retry in range(self.options.job_retries + 1):
                if retry:
                    self.output.note(f"restarting the whole job (retry {retry} of {self.options.job_retries})", "WARNING")
                outcome = self.attempt(started)
                if outcome is not None:
                    return outcome
            failed = self.failed_replica
            return Outcome("JOB_STATE_FAILED", self.exits[failed.name][-1], self.failure_message(failed))
        finally:
            self.remove()

    def attempt(self, started: float) -> Outcome | None:
        """One run of every replica; None when a replica used up its restarts (the job is retried)."""
        failures = collections.Counter()
        preempted: dict[str, float] = {}  # replica -> when SIGKILL follows
        # Each preemption happens once, in the job's first run.
        due = list(self.options.preemptions) if not any(self.exits.values()) else []
        by_name = {r.name: r for r in self.replicas}
        for replica in self.replicas:
            self.launch(replica, new_machine=True)
        while True:
            now = time.monotonic() - started
            if self.timeout and now > self.timeout:
                self.stop(self.replicas)
                return Outcome("JOB_STATE_FAILED", 124, f"the job ran past scheduling.timeout ({self.timeout:g}s)")
            for preemption in [p for p in due if (p.seconds is not None and p.seconds <= now) or p.replica in self.matched]:
                due.remove(preemption)
                name = preemption.replica
                if name in self.processes:
                    self.output.note(f"preempting {name}: SIGTERM now, SIGKILL in {SPOT_GRACE_SECONDS}s (Spot VM)", "WARNING")
                    self.send(by_name[name], "TERM")
                    preempted[name] = time.monotonic() + SPOT_GRACE_SECONDS
            for name, kill_at in list(preempted.items()):
                if name in self.processes and time.monotonic() > kill_at:
                    self.send(by_name[name], "KILL")
            for replica in self.replicas:
                process = self.processes.get(replica.name)
                if process is None or process.poll() is None:
                    continue
                code = process.returncode
                self.reap(replica, code)
                if replica.pool == 0 and code == 0:
                    self.stop(self.replicas)
                    return Outcome("JOB_STATE_SUCCEEDED", 0, "the replica in pool 0 finished")
                if code == 0:
                    continue
                new_machine = preempted.pop(replica.name, None) is not None
                if not new_machine:
                    failures[replica.name] += 1
                    if failures[replica.name] > self.options.replica_restarts:
                        self.failed_replica = replica
                        self.output.note(self.failure_message(replica), "ERROR")
                        self.stop(self.replicas)
                        return None
                how = "on a new machine" if new_machine else "on the same machine"
                if self.restart_all:
                    others = [r for r in self.replicas if r is not replica]
                    self.stop(others)
                    # A preempted replica that exited meanwhile (its peers may exit first, having
                    # saved a backup together) comes back on a new machine too.
                    new_machines = {replica.name} if new_machine else set()
                    new_machines |= {name for name in list(preempted) if name not in self.processes and preempted.pop(name)}
                    self.output.note(f"{replica.name} exited {code}: restarting every replica (restartJobOnWorkerRestart)"
                                     + "".join(f", {name} on a new machine" for name in sorted(new_machines)), "WARNING")
                    for each in self.replicas:
                        self.launch(each, new_machine=each.name in new_machines)
                else:
                    self.output.note(f"{replica.name} exited {code}: restarting it {how}", "WARNING")
                    self.launch(replica, new_machine)
            time.sleep(0.2)

    def failure_message(self, replica: Replica) -> str:
        last = self.last_errors[replica.name]
        return (f"The replica {replica.name} exited with a non-zero status of {self.exits[replica.name][-1]}."
                + (f" Last error: {last[-1]}" if last else ""))

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
        seed: int = 0, output: Output | None = None) -> int:
    """Runs the spec; returns the job's exit code (0 when pool 0 succeeded)."""
    output = output or Output()
    kind, job_spec = job_spec_of(spec)
    replicas = replicas_of(job_spec)
    names = {r.name for r in replicas}
    preemptions = [parse_preemption(p) for p in preemptions]
    for preemption in preemptions:
        if preemption.replica not in names:
            raise JobError(f"--preempt {preemption.replica}: the job has no such replica ({', '.join(sorted(names))})")
    tool = Engine.detect(engine)
    job_id = str(int(time.time() * 1000))
    scratch = Path(tempfile.mkdtemp(prefix="vertex-local-"))
    server = fuse = None
    # SIGTERM (a CI runner's cancel, `kill`) cleans up as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        if real_gcs:
            if stages:
                raise JobError("--stage is for the local Cloud Storage server; with --real-gcs, copy with gcloud storage cp")
            credentials = default_credentials()
            options = Options(tool, {"GOOGLE_APPLICATION_CREDENTIALS": CREDENTIALS_IN_CONTAINER},
                              [f"{credentials}:{CREDENTIALS_IN_CONTAINER}:ro"])
        else:
            # The proxy listens beyond loopback, for the job's networks only (Front admits their subnets).
            server = local_gcs.LocalGCS(scratch / "gcs", host="0.0.0.0").start()
            buckets = buckets_named(spec)
            for bucket in buckets:
                server.create_bucket(bucket)
            buckets = sorted(set(buckets) | set(stage(server, list(stages))))
            options = Options(tool, {}, [f"{server.ca}:{CA_IN_CONTAINER}:ro"])
            fuse = mount_buckets(server, scratch / "gcs-files", output)
            if fuse is not None:
                options.mounts.append(f"{scratch / 'gcs-files'}:/gcs")

            def admit(subnet: str, gateway: str) -> dict[str, str]:
                server.front.clients += (ipaddress.ip_network(subnet),)
                proxy = f"http://{gateway}:{server.port}"  # this machine, as the job's network sees it
                return {"https_proxy": proxy, "HTTPS_PROXY": proxy, "CURL_CA_BUNDLE": CA_IN_CONTAINER,
                        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"}
            options.on_network = admit
        options.preemptions, options.replica_restarts, options.job_retries = preemptions, replica_restarts, job_retries
        output.note(not_emulated(job_spec))
        output.note("Cloud Storage: " + ("Google's, with your Application Default Credentials" if real_gcs else
                                          f"a local server holding {', '.join(f'gs://{b}' for b in buckets) or 'no bucket'}"))
        if kind == "custom":
            job = JobRun(job_spec, job_id, options, output)
            ACTIVE.append(job)
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
        output.note("interrupted: removing the job's containers and networks", "WARNING")
        return 130
    finally:
        if previous is not None:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for job in ACTIVE:  # trials still running in other threads, or a job interrupted
            job.remove()
        ACTIVE.clear()
        if fuse is not None:
            unmount(fuse, scratch / "gcs-files")
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


ACTIVE: list[JobRun] = []  # the jobs whose containers exist, for the cleanup on any exit


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
        ACTIVE.append(job)
        outcome = job.run()
        for line in job.summary():
            output.note(f"trial {number}: {line}")
        return number, outcome, last_metric(metrics_dir / "output.metrics", metric["metricId"])

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(trial, trials))
    reverse = metric.get("goal", "MAXIMIZE") == "MAXIMIZE"
    ranked = sorted(results, key=lambda r: (r[2] is None, -(r[2] or 0) if reverse else (r[2] or 0)))
    output.note(f"trials ranked by {metric['metricId']} ({metric.get('goal', 'MAXIMIZE')}):")
    for rank, (number, outcome, value) in enumerate(ranked, 1):
        shown = "-" if value is None else f"{value:.4f}"
        params = " ".join(f"{k}={v}" for k, v in trials[number].items())
        output.note(f"{rank}. trial {number}: {metric['metricId']}={shown} {params} {outcome.state}")
    return 0 if any(o.exit_code == 0 for _, o, _ in results) else 1
