"""Vertex AI's rules over the runner: a CustomJob or HyperparameterTuningJob as Vertex runs it.

One container per replica, from the spec's imageUri, command, args and env, reachable by its
Vertex name (workerpool0-0, workerpool1-0, ...). Each is told what Vertex tells it
(`replica_environments`): CLUSTER_SPEC (and TF_CONFIG when the job has more than one replica),
the AIP_* output directories under the baseOutputDirectory (under BASE/TRIAL/ in a tuning
trial), CLOUD_ML_PROJECT_ID, CLOUD_ML_JOB_ID, CLOUD_ML_TRIAL_ID.

The rules, as Vertex's documentation states them (docs/rehearsal.md quotes each page):
- a replica that exits non-zero fails the job at once ("User code exception", a permanent error;
  "Understanding the training service"), with the replica's exit code and last error line;
- except SIGABRT and SIGSEGV (exit 134, 139), "exit codes that could be transient": the whole
  job restarts, at most 3 times;
- a Spot preemption: SIGTERM, SIGKILL 30 s later, and "the job fails with a STOCKOUT error and
  Compute Engine tries to restart the job up to six times" ("Use Spot VMs"): every replica starts
  again on a new machine (a new container, a fresh disk);
- VM maintenance: SIGTERM, SIGKILL 30 s later, and the replica alone comes back on another machine
  under the same hostname, up to 5 times before the job is retried; with
  scheduling.restartJobOnWorkerRestart every replica restarts with it ("Distributed training");
- scheduling.disableRetries turns all of these restarts and retries off, and "overrides
  restart_job_on_worker_restart to false" (CustomJobSpec reference, Scheduling): the event that
  would have restarted the job fails it;
- the job ends when pool 0's replica exits 0; the others are then stopped. A worker that exits 0
  first stays finished;
- scheduling.timeout ends the job.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
import random
import time
from pathlib import Path

from scripts import jobspec
from scripts.rehearsal import fields
from scripts.rehearsal.runner import (PREFIX, Container, Fault, Outcome, Output, RehearsalError, Restart, Run, Session,
                                      drive, parse_fault)
from trainer import cluster as trainer_cluster

# Vertex's retry rules ("Understanding the training service", "Use Spot VMs"; docs/rehearsal.md).
REPLICA_RESTARTS = 5  # a replica restarted for a non-permanent reason (VM maintenance), before the job is retried
JOB_RETRIES = 3  # the whole job, after a possibly transient exit or a replica's restarts
TRANSIENT_EXIT_CODES = (6, 11, 134, 139)  # SIGABRT and SIGSEGV: "exit codes that could be transient"
SPOT_RESTARTS = 6  # "the job fails with a STOCKOUT error and Compute Engine tries to restart the job up to six times"
SPOT, MAINTENANCE, RETRY = "spot", "maintenance", "retry"
SPOT_GRACE_SECONDS = 30  # between a Spot VM's (or a maintenance event's) shutdown signal and its hard stop
STOP_GRACE_SECONDS = 10  # for replicas the job stops (its end, a restart of every replica)
# The project number Vertex gives CLOUD_ML_PROJECT_ID; a rehearsal has none.
LOCAL_PROJECT_NUMBER = "000000000000"
HYPERTUNE_DIR = "/tmp/hypertune"  # cloudml-hypertune's default metrics file is output.metrics here
REPLICA_NAME = r"workerpool[0-3]-\d+"
# A stand-in for a Reduction Server reducer: up, doing nothing, until the job stops it.
STAND_IN_COMMAND = ("sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait")

# What the rehearsal emulates of a CustomJob or HyperparameterTuningJob (fields.py); everything
# else a spec holds is named once, at the start, as not emulated.
_JOB_SPEC = {
    "workerPoolSpecs": [{"replicaCount": fields.ALL,
                         "containerSpec": {"imageUri": fields.ALL, "command": fields.ALL, "args": fields.ALL,
                                           "env": fields.ALL}}],
    "baseOutputDirectory": {"outputUriPrefix": fields.ALL},
    "scheduling": {"timeout": fields.ALL, "restartJobOnWorkerRestart": fields.ALL, "disableRetries": fields.ALL},
}
EMULATED = {"displayName": fields.ALL, "labels": fields.ALL, "jobSpec": _JOB_SPEC, "trialJobSpec": _JOB_SPEC,
            "studySpec": {"metrics": fields.ALL, "parameters": fields.ALL, "algorithm": fields.ALL},
            "maxTrialCount": fields.ALL, "parallelTrialCount": fields.ALL,
            # a bare jobSpec, as --spec also takes
            **_JOB_SPEC}


@dataclasses.dataclass(frozen=True)
class Replica:
    pool: int
    index: int
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    accelerators: int = 0
    stand_in: bool = False  # a Reduction Server reducer, which the rehearsal does not run

    @property
    def name(self) -> str:
        return f"workerpool{self.pool}-{self.index}"


def job_spec_of(spec: dict) -> tuple[str, dict]:
    """("custom" | "tuning", the jobSpec). Takes a CustomJob, a HyperparameterTuningJob, or a bare jobSpec."""
    if "trialJobSpec" in spec:
        if "studySpec" not in spec:
            raise RehearsalError("a HyperparameterTuningJob needs a studySpec")
        return "tuning", spec["trialJobSpec"]
    job_spec = spec.get("jobSpec", spec)
    if not isinstance(job_spec, dict) or not job_spec.get("workerPoolSpecs"):
        raise RehearsalError("the spec has no jobSpec.workerPoolSpecs (nor trialJobSpec): not a CustomJob")
    return "custom", job_spec


def replicas_of(job_spec: dict) -> list[Replica]:
    pools = job_spec["workerPoolSpecs"]
    if not pools or not pools[0]:
        raise RehearsalError("workerPoolSpecs[0] is empty: Vertex needs a replica in pool 0")
    replicas = []
    for pool, spec in enumerate(pools):
        if not spec:
            continue
        container = spec.get("containerSpec")
        if not container or not container.get("imageUri"):
            raise RehearsalError(f"workerPoolSpecs[{pool}] has no containerSpec.imageUri (python packages are not run locally)")
        count = int(spec.get("replicaCount", 1))
        if pool == 0 and count != 1:
            raise RehearsalError(f"workerPoolSpecs[0].replicaCount is {count}; Vertex runs exactly one replica in pool 0")
        env = tuple((item["name"], str(item.get("value", ""))) for item in container.get("env", []))
        # Reduction Server reducers run Google's image, which cannot be pulled here: stand-ins on
        # the chief's image take their names and addresses, and do nothing.
        stand_in = pool == 2 and trainer_cluster.runs_reduction_server(job_spec)
        image = pools[0]["containerSpec"]["imageUri"] if stand_in else container["imageUri"]
        for index in range(count):
            replicas.append(Replica(pool, index, image, tuple(container.get("command", [])),
                                    tuple(container.get("args", [])), env,
                                    int(spec.get("machineSpec", {}).get("acceleratorCount", 0)), stand_in))
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


def parse_preemption(text: str, kind: str = SPOT) -> Fault:
    """REPLICA@SECONDS or REPLICA@/REGEX/: a Spot preemption (--preempt), or VM maintenance
    (--maintenance), of that replica then, or when it prints a matching line."""
    option = "--preempt" if kind == SPOT else "--maintenance"
    return parse_fault(text, kind, option, REPLICA_NAME, "workerpool1-0@40")


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
            raise RehearsalError(f"parameter {name}: no value spec this runner knows")
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
    from scripts.rehearsal.storage import CREDENTIALS_IN_CONTAINER

    services = {}
    environments = replica_environments(job_spec, job_id)
    for replica in replicas_of(job_spec):
        env = environments[replica.name]
        service: dict = {"image": replica.image, "hostname": replica.name,
                         "networks": {"job": {"aliases": [replica.name]}},
                         "environment": env, "restart": "no", "stop_grace_period": "30s"}
        command = STAND_IN_COMMAND if replica.stand_in else replica.command
        if command:
            service["entrypoint"] = list(command)
        if replica.args and not replica.stand_in:
            service["command"] = list(replica.args)
        if credentials:
            service["volumes"] = [f"{credentials}:{CREDENTIALS_IN_CONTAINER}:ro"]
            env["GOOGLE_APPLICATION_CREDENTIALS"] = CREDENTIALS_IN_CONTAINER
        services[replica.name] = service
    return {"name": f"{PREFIX}{job_id}", "services": services, "networks": {"job": {}}}


def not_emulated(spec: dict) -> str:
    """The one line that names every field of the spec the rehearsal does not emulate."""
    unknown = fields.not_emulated(spec, EMULATED)
    return ("not emulated, every replica runs here at once on this machine's CPUs: "
            + ("; ".join(unknown) if unknown else "nothing else the spec asks"))


def stand_ins_note(job_spec: dict) -> str | None:
    reducers = [r for r in replicas_of(job_spec) if r.stand_in]
    if not reducers:
        return None
    image = job_spec["workerPoolSpecs"][2]["containerSpec"]["imageUri"]
    return (f"{', '.join(r.name for r in reducers)}: Reduction Server reducers ({image}) run here as stand-ins "
            f"that stay up and do nothing, on {reducers[0].image}; the workers all-reduce among themselves, as "
            "they do without GPUs or without Google's NCCL plugin")


class VertexRules:
    """One CustomJob (or one tuning trial) from start to its end, with Vertex's restart rules."""

    def __init__(self, job_spec: dict, job_id: str, output: Output, *, network: str, trial: str | None = None,
                 metrics_dir: Path | None = None, files_volume: str | None = None,
                 replica_restarts: int = REPLICA_RESTARTS, job_retries: int = JOB_RETRIES):
        self.output, self.trial, self.network = output, trial, network
        self.replicas = replicas_of(job_spec)
        self.by_name = {r.name: r for r in self.replicas}
        self.environments = replica_environments(job_spec, job_id, trial)
        self.metrics_dir, self.files_volume = metrics_dir, files_volume
        self.replica_restarts, self.job_retries = replica_restarts, job_retries
        scheduling = job_spec.get("scheduling", {})
        self.disable_retries = bool(scheduling.get("disableRetries"))
        # disableRetries "overrides restart_job_on_worker_restart to false" (CustomJobSpec reference).
        self.restart_all = bool(scheduling.get("restartJobOnWorkerRestart")) and not self.disable_retries
        self.timeout = float(scheduling["timeout"].rstrip("s")) if scheduling.get("timeout") else None
        self.retries = collections.Counter()
        self.started: float | None = None

    def container(self, replica: Replica) -> Container:
        volumes = [self.files_volume] if self.files_volume else []
        if self.metrics_dir is not None and replica.pool == 0:
            volumes.append(f"{self.metrics_dir}:{HYPERTUNE_DIR}")
        return Container(key=replica.name, name=f"{self.network}-{replica.name}", hostname=replica.name,
                         image=replica.image, command=STAND_IN_COMMAND if replica.stand_in else replica.command,
                         args=() if replica.stand_in else replica.args, env=self.environments[replica.name],
                         aliases=(replica.name,), volumes=tuple(volumes), gpus=bool(replica.accelerators),
                         grace=STOP_GRACE_SECONDS, source=f"trial-{self.trial}/{replica.name}" if self.trial else "")

    def begin(self, run: Run, attempt: int) -> None:
        self.started = self.started or time.monotonic()
        self.maintenance = collections.Counter()  # a replica's restarts after maintenance, this attempt
        self.stockout: str | None = None  # the Spot preemption that ends this attempt
        for replica in self.replicas:
            run.launch(self.container(replica))

    def disrupt(self, run: Run, container: Container, fault: Fault) -> float:
        what = "preempting (Spot VM)" if fault.kind == SPOT else "VM maintenance on"
        self.output.note(f"{what} {container.key}: SIGTERM now, SIGKILL in {SPOT_GRACE_SECONDS}s", "WARNING")
        if fault.kind == SPOT:
            self.stockout = container.key
        return SPOT_GRACE_SECONDS

    def exited(self, run: Run, container: Container, code: int, fault: Fault | None):
        replica = self.by_name[container.key]
        if replica.pool == 0 and code == 0:
            return Outcome(0, "the replica in pool 0 finished")
        if self.stockout is not None:
            if container.key == self.stockout:
                # Spot: the job fails with STOCKOUT and is restarted whole, on new machines.
                return self.retry(SPOT, f"{container.key} was preempted (STOCKOUT)", code)
            return None  # the job restarts anyway
        if code == 0:
            return None  # a finished worker stays finished
        if fault is not None and fault.kind == MAINTENANCE:
            # Not the replica's fault: it comes back on another machine, under its name.
            self.maintenance[container.key] += 1
            if self.disable_retries:
                return Outcome(code, f"{container.key} was stopped by VM maintenance and is not restarted "
                                     "(scheduling.disableRetries)")
            if self.maintenance[container.key] > self.replica_restarts:
                return self.retry(RETRY, f"{container.key} was restarted {self.replica_restarts} times", code)
            if self.restart_all:
                self.output.note(f"{container.key} restarted on another machine: restarting every replica "
                                 "(restartJobOnWorkerRestart)", "WARNING")
                run.stop()
                for each in self.replicas:
                    run.launch(self.container(each), fresh=each is replica)
            else:
                self.output.note(f"{container.key} restarted on another machine", "WARNING")
                run.launch(self.container(replica))
            return None
        message = self.failure_message(run, container, code)
        if code in TRANSIENT_EXIT_CODES:
            return self.retry(RETRY, f"{message} (possibly transient)", code)
        return Outcome(code, message)

    def retry(self, kind: str, reason: str, code: int):
        """The whole job again on new machines, within its kind's limit."""
        if self.disable_retries:
            return Outcome(code, f"{reason}; the job is not restarted (scheduling.disableRetries)")
        limit = SPOT_RESTARTS if kind == SPOT else self.job_retries
        self.retries[kind] += 1
        if self.retries[kind] > limit:
            return Outcome(code, f"{reason}; the job was already restarted {limit} times")
        self.output.note(f"{reason}: restarting the whole job on new machines "
                         f"({'Spot restart' if kind == SPOT else 'retry'} {self.retries[kind]} of {limit})", "WARNING")
        return Restart()

    def tick(self, run: Run, now: float):
        if self.timeout and now - self.started > self.timeout:
            return Outcome(124, f"the job ran past scheduling.timeout ({self.timeout:g}s)")
        return None

    def failure_message(self, run: Run, container: Container, code: int) -> str:
        if run.engine.out_of_memory(container.name):
            said = f"The replica {container.key} ran out of memory and exited with a non-zero status of {code}."
        else:
            said = f"The replica {container.key} exited with a non-zero status of {code}."
        last = run.last_errors[container.key]
        return said + (f" Last error: {last[-1]}" if last else "")


def state(outcome: Outcome) -> str:
    if outcome.cancelled:
        return "JOB_STATE_CANCELLED"
    return "JOB_STATE_SUCCEEDED" if outcome.code == 0 else "JOB_STATE_FAILED"


@dataclasses.dataclass(frozen=True)
class Options:
    replica_restarts: int = REPLICA_RESTARTS
    job_retries: int = JOB_RETRIES
    seed: int = 0


def run_job(session: Session, job_spec: dict, job_id: str, faults=(), files_volume: str | None = None,
            options: Options = Options(), trial: str | None = None, metrics_dir: Path | None = None) -> tuple[Outcome, Run]:
    network = f"{PREFIX}{job_id}" + (f"-trial-{trial}" if trial else "")
    rules = VertexRules(job_spec, job_id, session.output, network=network, trial=trial, metrics_dir=metrics_dir,
                        files_volume=files_volume, replica_restarts=options.replica_restarts,
                        job_retries=options.job_retries)
    run = Run(session, network, hosts=tuple(rules.by_name))
    return drive(run, rules, faults), run


def check(spec: dict, faults=()) -> None:
    """Raises RehearsalError, one line, for a spec or a fault the rehearsal cannot run."""
    names = {r.name for r in replicas_of(job_spec_of(spec)[1])}
    for fault in faults:
        if fault.replica not in names:
            option = "--preempt" if fault.kind == SPOT else "--maintenance"
            raise RehearsalError(f"{option} {fault.replica}: the job has no such replica ({', '.join(sorted(names))})")


def run(session: Session, spec: dict, job_id: str, faults=(), files_volume: str | None = None,
        options: Options = Options(), scratch: Path | None = None) -> int:
    """A CustomJob, or every trial of a HyperparameterTuningJob; returns the rehearsal's exit code."""
    check(spec, faults)
    kind, job_spec = job_spec_of(spec)
    output = session.output
    output.note(not_emulated(spec))
    stand_ins = stand_ins_note(job_spec)
    if stand_ins:
        output.note(stand_ins)
    if kind == "tuning":
        return run_trials(session, spec, job_spec, job_id, files_volume, options, scratch)
    outcome, job = run_job(session, job_spec, job_id, faults, files_volume, options)
    for line in job.summary(r.name for r in replicas_of(job_spec)):
        output.note(line)
    output.note(f"{state(outcome)}: {outcome.message}", "INFO" if outcome.code == 0 else "ERROR")
    return outcome.code


def run_trials(session: Session, spec: dict, job_spec: dict, job_id: str, files_volume: str | None,
               options: Options, scratch: Path) -> int:
    """Runs maxTrialCount trials, parallelTrialCount at a time, and prints them ranked."""
    output = session.output
    study = spec["studySpec"]
    metric = study["metrics"][0]
    total, parallel = int(spec.get("maxTrialCount", 1)), int(spec.get("parallelTrialCount", 1))
    rng = random.Random(options.seed)
    trials = {str(n): draw_parameters(study, rng) for n in range(1, total + 1)}

    def trial(number: str) -> tuple[str, Outcome, float | None]:
        metrics_dir = scratch / f"trial-{number}"
        metrics_dir.mkdir()
        metrics_dir.chmod(0o777)  # the image's user may not be this machine's
        output.note(f"trial {number}: " + " ".join(f"--{k}={v}" for k, v in trials[number].items()))
        trial_spec = with_trial_args(job_spec, trials[number])
        outcome, job = run_job(session, trial_spec, job_id, (), files_volume, options, number, metrics_dir)
        for line in job.summary(r.name for r in replicas_of(trial_spec)):
            output.note(f"trial {number}: {line}")
        return number, outcome, last_metric(metrics_dir / "output.metrics", metric["metricId"])

    executor = concurrent.futures.ThreadPoolExecutor(parallel)
    try:
        futures = [executor.submit(trial, number) for number in trials]
        results = [future.result() for future in futures]
    except BaseException:
        session.cancel()  # the running trials stop now, instead of being waited for
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    reverse = metric.get("goal", "MAXIMIZE") == "MAXIMIZE"
    ranked = sorted(results, key=lambda r: (r[2] is None, -(r[2] or 0) if reverse else (r[2] or 0)))
    output.note(f"trials ranked by {metric['metricId']} ({metric.get('goal', 'MAXIMIZE')}):")
    for rank, (number, outcome, value) in enumerate(ranked, 1):
        shown = "-" if value is None else f"{value:.4f}"
        params = " ".join(f"{k}={v}" for k, v in trials[number].items())
        output.note(f"{rank}. trial {number}: {metric['metricId']}={shown} {params} {state(outcome)}")
    return 0 if any(o.code == 0 for _, o, _ in results) else 1
