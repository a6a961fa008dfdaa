"""One JobSet from its creation to its end, over the runner (runner.py): the Jobs of each attempt,
each pod's exit through the policies (failure_policy.py, success_policy.py, depends_on.py), and the
JobSet's restarts. Like JobSet's one reconcile loop (pkg/controllers/jobset_controller.go,
kubernetes-sigs/jobset v0.12.0), it owns the lifecycle; the rules live in those modules."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

from scripts.rehearsal.jobset import depends_on, prober, success_policy
from scripts.rehearsal.jobset.admission import admitted
from scripts.rehearsal.jobset.failure_policy import (BACKOFF_MESSAGE, DEADLINE_MESSAGE, DEFAULT_BACKOFF_LIMIT,
                                                     crash_loop_delay, first_failed_rule_and_job, pod_failure_action,
                                                     pod_failure_message)
from scripts.rehearsal.jobset.identity import pod_identities, random_suffix
from scripts.rehearsal.jobset.manifest import not_emulated
from scripts.rehearsal.jobset.pods import ALL_BUCKETS, Pod, pod_of, pods_of
from scripts.rehearsal.jobset.probes import READINESS, STARTUP, ContainerProbes, Probe
from scripts.rehearsal.runner import (PREFIX, Container, Fault, Outcome, Output, RehearsalError, Restart, Run, Session,
                                      drive, parse_fault)

DEADLINE_EXIT = 124  # the rehearsal's exit code when a Job's activeDeadlineSeconds ended the JobSet
EVICTION = "eviction"
POD_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@dataclasses.dataclass(frozen=True)
class JobFailure:
    """Why a Job failed: its Failed condition's reason and message, and the pod that failed it."""

    reason: str
    message: str
    code: int  # the rehearsal's exit code should this failure end the JobSet
    hostname: str | None  # the pod whose exit failed the Job; None for a deadline
    at: float

    def described(self, job_name: str) -> str:
        return f"Job {job_name} failed ({self.reason}): " + (
            f"pod {self.hostname} exited {self.code}" if self.hostname else self.message)


@dataclasses.dataclass
class Job:
    """One of the JobSet's Jobs in the current attempt."""

    name: str
    replicated_job: str
    spec: dict  # the Job's spec (the replicatedJob's template.spec)
    created: float
    hostnames: list[str] = dataclasses.field(default_factory=list)
    succeeded: set = dataclasses.field(default_factory=set)  # hostnames whose pod completed
    counted_failures: int = 0  # pods failed and counted against backoffLimit (restartPolicy Never)
    restarts_in_place: int = 0  # container restarts (restartPolicy OnFailure)
    finished: str | None = None  # "Complete" or "Failed"
    failure: JobFailure | None = None

    @property
    def backoff_limit(self) -> int:
        return int(self.spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))

    @property
    def restart_policy(self) -> str:
        return self.spec["template"]["spec"]["restartPolicy"]


@dataclasses.dataclass(frozen=True)
class OwnerDeadline:
    """A time limit on the whole JobSet kept by the object that owns it (a TrainJob's
    activeDeadlineSeconds): once passed, the owner deletes the JobSet, and its pods stop."""

    seconds: float
    message: str  # the job's end, as the owner states it


class JobSetRules:
    """One JobSet from its creation to its end, with JobSet's and Kubernetes' rules."""

    def __init__(self, manifest: dict, output: Output, *, network: str, bucket_directory=None,
                 owner_deadline: OwnerDeadline | None = None):
        self.manifest = admitted(manifest)
        self.owner_deadline = owner_deadline
        self.created = time.monotonic()
        self.output, self.network = output, network
        self.bucket_directory = bucket_directory  # gs:// bucket -> its files here, for CSI volumes
        spec = self.manifest["spec"]
        self.name = self.manifest["metadata"]["name"]
        self.rjobs = {rjob["name"]: rjob for rjob in spec["replicatedJobs"]}
        self.failure_policy = spec.get("failurePolicy")
        self.success_policy = spec["successPolicy"]
        self.blocking = (self.failure_policy or {}).get("restartStrategy") == "BlockingRecreate"
        self.requirements = depends_on.requirements(spec)
        self.restarts = 0  # js.Status.Restarts: every restart; the new pods' restart-attempt
        self.restarts_counted = 0  # js.Status.RestartsCountTowardsMax
        self.pods = pods_of(self.manifest)  # every pod resolves now: a bad manifest stops before anything runs
        self.lock = threading.Lock()  # the probes' results, written from their threads
        self.spawn: Callable[[Callable[[], None]], None] = lambda task: threading.Thread(target=task, daemon=True).start()
        self.hostnames = [pod.hostname for pod in self.pods]

    def hosts(self) -> tuple[str, ...]:
        return tuple(alias for pod in self.pods for alias in pod.aliases)

    def container(self, run: Run, pod: Pod) -> Container:
        volumes = []
        for source, path, read_only in pod.mounts:
            if source is None:
                volume = path  # an anonymous volume of this container alone
            elif source == f"gs://{ALL_BUCKETS}":
                directory = self.every_bucket()
                if directory is None:
                    continue
                volume = f"{directory}:{path}"
            elif source.startswith("gs://"):
                if self.bucket_directory is None:
                    raise RehearsalError(f"pod {pod.hostname}: a Cloud Storage FUSE volume needs the local Cloud Storage "
                                         "(not --real-gcs)")
                volume = f"{self.bucket_directory(source[len('gs://'):])}:{path}"
            else:
                volume = f"{run.volume(source)}:{path}"
            volumes.append(volume + (":ro" if read_only else ""))
        return Container(key=pod.hostname, name=f"{self.network}-{pod.name}", hostname=pod.hostname, image=pod.image,
                         command=tuple(pod.command), args=tuple(pod.args), env=pod.env, aliases=pod.aliases,
                         volumes=tuple(volumes), labels={"jobset.sigs.k8s.io/restart-attempt": str(self.restarts)},
                         gpus=pod.gpus > 0, grace=pod.grace)

    def every_bucket(self):
        """The directory of every local bucket, for a dynamic Cloud Storage FUSE mount (bucketName
        "_"); None, said once, where there is none (--real-gcs, or no FUSE on this machine): the pods
        then reach Cloud Storage through gs:// alone."""
        if not hasattr(self, "_every_bucket"):
            try:
                self._every_bucket = self.bucket_directory(ALL_BUCKETS) if self.bucket_directory else None
            except RehearsalError as error:
                self._every_bucket = None
                self.output.note(str(error), "WARNING")
            if self._every_bucket is None:
                self.output.note("the pods' Cloud Storage FUSE volume of every bucket (bucketName \"_\") is left out: "
                                 "/gcs/ is empty in them, gs:// works", "WARNING")
        return self._every_bucket

    def new_pod(self, run: Run, hostname: str) -> None:
        """The Job creates a pod for `hostname`: a new name, this attempt's labels."""
        identity = self.identities[hostname]
        pod = pod_of(self.manifest, identity, f"{hostname}-{random_suffix(hostname)}")
        self.current[hostname] = pod
        run.launch(self.container(run, pod))
        self.watch(hostname)

    def watch(self, hostname: str) -> None:
        """The kubelet starts probing a new container of `hostname` (a new pod, or a restart in
        place): every probe worker from its initial state."""
        self.generation[hostname] = self.generation.get(hostname, 0) + 1
        self.kill_at.pop(hostname, None)
        probes = self.current[hostname].probes
        self.probing[hostname] = ContainerProbes.start(probes, time.monotonic())
        self.was_ready.discard(hostname)

    # the attempt

    def begin(self, run: Run, attempt: int) -> None:
        self.identities = {identity["hostname"]: identity for identity in pod_identities(self.manifest, self.restarts)}
        self.current: dict[str, Pod] = {}
        self.jobs: dict[str, Job] = {}
        self.pending: list[tuple[float, str]] = []  # (when, hostname): restarts in place after their back-off
        self.launched: list[str] = []  # replicatedJobs whose Jobs exist
        self.probing: dict[str, ContainerProbes] = {}  # hostname -> its container's probe workers
        self.generation: dict[str, int] = {}  # hostname -> its container's number: a result for an older one is dropped
        self.probe_results: list[tuple[str, int, str, bool | None]] = []  # (hostname, generation, kind, success)
        self.kill_at: dict[str, float] = {}  # hostname -> SIGKILL after a failed startup probe's SIGTERM
        self.was_ready: set[str] = set()
        self.create_ready_jobs(run)

    def create_ready_jobs(self, run: Run) -> None:
        """Creates the Jobs of every replicatedJob whose dependencies have reached their status
        (reconcileReplicatedJobs, dependencyReachedStatus), judged on the state before this pass:
        a Job created now is not yet Ready for the next replicatedJob."""
        ready = [(name, needs) for name, needs in self.requirements.items()
                 if name not in self.launched and all(self.reached(run, dependency, status) for dependency, status in needs)]
        for name, needs in ready:
            if needs:
                self.output.note(f"{name}: {' and '.join(f'{d} is {s}' for d, s in needs)}: creating its Jobs")
            self.launched.append(name)
            for identity in self.identities.values():
                if identity["replicated_job"] == name:
                    job = self.jobs.setdefault(identity["job"], Job(identity["job"], name, self.rjobs[name]["template"]["spec"],
                                                                    time.monotonic()))
                    job.hostnames.append(identity["hostname"])
                    self.new_pod(run, identity["hostname"])

    def job_of(self, hostname: str) -> Job:
        return self.jobs[self.identities[hostname]["job"]]

    def reached(self, run: Run, replicated_job: str, status: str) -> bool:
        """Whether `replicated_job` has reached `status` (depends_on.py), once all its Jobs exist."""
        jobs = [job for job in self.jobs.values() if job.replicated_job == replicated_job]
        replicas = int(self.rjobs[replicated_job]["replicas"])
        if len(jobs) < replicas:
            return False
        ready = sum(1 for job in jobs if not job.finished and self.job_ready(run, job))
        return depends_on.reached(status, replicas, ready=ready,
                                  succeeded=sum(1 for job in jobs if job.finished == "Complete"),
                                  failed=sum(1 for job in jobs if job.finished == "Failed"))

    def job_ready(self, run: Run, job: Job) -> bool:
        """A Job's succeeded and Ready pods reach its pods' number (JobSet's count of a Job's
        readiness, updateReplicatedJobsStatuses: its succeeded plus Ready pods reach the smaller of
        parallelism and completions, equal here)."""
        return sum(1 for h in job.hostnames if h in job.succeeded or self.pod_ready(run, h)) >= len(job.hostnames)

    def pod_ready(self, run: Run, hostname: str) -> bool:
        """The pod's Ready condition: its container runs, has started and its readiness probe
        succeeded (probes.py); without probes, once its command runs."""
        if run.current(hostname) is None:
            return False
        probing = self.probing.get(hostname)
        if probing is not None and probing.workers:
            return probing.ready
        return run.started(hostname)

    # the kubelet's probes

    def probe(self, run: Run, now: float) -> None:
        """Applies the probe results that came in, then starts the probes that are due, each in
        the background (an exec probe takes as long as its command)."""
        with self.lock:
            results, self.probe_results = self.probe_results, []
        for hostname, generation, kind, success in results:
            probing = self.probing.get(hostname)
            if probing is None or generation != self.generation.get(hostname):
                continue  # a container that has gone since
            worker = probing.workers[kind]
            worker.in_flight = False
            if success is None:
                continue  # not running when probed: doProbe probes nothing
            if worker.record(success):
                self.probe_changed(run, hostname, probing, kind, now)
        for hostname, at in list(self.kill_at.items()):
            if run.current(hostname) is not None and now > at:
                run.send(run.current(hostname), "KILL")
                del self.kill_at[hostname]
        for hostname, probing in self.probing.items():
            container = run.current(hostname)
            if container is None or hostname in self.kill_at:
                continue
            for probe in probing.due(now):
                probing.workers[probe.kind].in_flight = True
                self.spawn(self.probe_task(run, hostname, self.generation[hostname], container.name, probe))

    def probe_task(self, run: Run, hostname: str, generation: int, name: str, probe: Probe):
        def task():
            success = self.run_probe(run, name, probe)
            with self.lock:
                self.probe_results.append((hostname, generation, probe.kind, success))
        return task

    def run_probe(self, run: Run, name: str, probe: Probe) -> bool | None:
        """One probe of the container the engine calls `name`; None when it is not running."""
        if run.engine.state(name, "Running") != "true":
            return None
        if probe.handler == "exec" or probe.host:
            return prober.succeeds(probe, run.engine, name, "")
        address = run.engine.address(name, self.network)
        return address is not None and prober.succeeds(probe, run.engine, name, address)

    def probe_changed(self, run: Run, hostname: str, probing: ContainerProbes, kind: str, now: float) -> None:
        worker = probing.workers[kind]
        if kind == STARTUP and worker.state is False:
            container = run.current(hostname)
            grace = container.grace if container else 0
            self.output.note(f"{hostname}: startupProbe failed {worker.probe.failure_threshold} times: the kubelet kills "
                             f"its container (SIGTERM, SIGKILL in {grace:g}s)", "WARNING")
            if container is not None:
                run.send(container, "TERM")
                self.kill_at[hostname] = now + grace
            return
        if kind == STARTUP:
            self.output.note(f"{hostname}: startupProbe succeeded: the container has started")
        if probing.ready and hostname not in self.was_ready:
            self.was_ready.add(hostname)
            self.output.note(f"{hostname}: Ready ({'readinessProbe succeeded' if READINESS in probing.workers else 'started'})")
        elif not probing.ready and hostname in self.was_ready:
            self.was_ready.discard(hostname)
            self.output.note(f"{hostname}: not Ready (readinessProbe failed {worker.probe.failure_threshold} times)",
                             "WARNING")

    def disrupt(self, run: Run, container: Container, fault: Fault) -> float:
        self.output.note(f"evicting {container.key} (node preempted): SIGTERM now, SIGKILL in {container.grace:g}s",
                         "WARNING")
        return container.grace

    def exited(self, run: Run, container: Container, code: int, fault: Fault | None):
        """One pod's exit through its Job's rules. What the JobSet does about it is decided in tick,
        once every exit of this poll is in, as one reconcile sees every Job's status at once."""
        job = self.job_of(container.key)
        if job.finished:
            return None
        if code == 0:
            job.succeeded.add(container.key)
            if len(job.succeeded) == len(job.hostnames):
                job.finished = "Complete"
                # The Job controller's Completed event: a replicatedJob that depends on this one
                # being Ready counts a Complete Job as Ready too (depends_on.reached), also when
                # its pods' startup probes never got to succeed before they ended.
                self.output.note(f"Job {job.name}: Complete ({len(job.succeeded)} of {len(job.hostnames)} pods succeeded)")
            return None
        if job.restart_policy == "OnFailure":
            # pastBackoffLimitOnFailure: the containers' restarts, summed over the Job's pods.
            job.restarts_in_place += 1
            if job.restarts_in_place >= max(job.backoff_limit, 1):
                self.job_failed(run, job, "BackoffLimitExceeded", BACKOFF_MESSAGE, code, container.key)
                return None
            delay = crash_loop_delay(job.restarts_in_place)
            self.output.note(f"{container.key} exited {code}: the kubelet restarts its container in place in "
                             f"{delay:g}s (restartPolicy OnFailure)", "WARNING")
            self.pending.append((time.monotonic() + delay, container.key))
            return None
        pod, disrupted = self.current[container.key], fault is not None
        action = pod_failure_action(job.spec, code, disrupted, pod.container)
        if action == "FailJob":
            message = pod_failure_message(job.spec, code, disrupted, pod, self.identities[pod.hostname]["namespace"])
            self.job_failed(run, job, "PodFailurePolicy", message, code, container.key)
            return None
        if action == "Count":
            job.counted_failures += 1
            if job.counted_failures > job.backoff_limit:
                self.job_failed(run, job, "BackoffLimitExceeded", BACKOFF_MESSAGE, code, container.key)
                return None
        self.output.note(f"{container.key} exited {code}: Job {job.name} recreates it ({action})", "WARNING")
        self.new_pod(run, container.key)
        return None

    def job_failed(self, run: Run, job: Job, reason: str, message: str, code: int, hostname: str | None) -> None:
        """A Job failed: its pods stop; the JobSet's failurePolicy decides in tick (failure_decision)."""
        job.finished = "Failed"
        job.failure = JobFailure(reason, message, code, hostname, time.monotonic())
        run.stop([c for c in run.running() if c.key in job.hostnames])

    def failure_decision(self):
        """executeFailurePolicy over every Job failed so far in this attempt, earliest first: the
        first rule that matches any of them decides (a permanent exit wins over a disruption that
        failed another Job first); else RestartJobSet, for the earliest."""
        failed = sorted((job for job in self.jobs.values() if job.failure is not None), key=lambda job: job.failure.at)
        if not failed:
            return None
        rule, index = first_failed_rule_and_job(  # no policy: no rule, the earliest failed Job
            self.failure_policy or {}, [(job.replicated_job, job.failure.reason, job.failure.message) for job in failed])
        job = failed[index]
        for other in failed:
            if other is not job:
                self.output.note(f"{other.failure.described(other.name)}, as well", "WARNING")
        failure, failed_line = job.failure, job.failure.described(job.name)
        if self.failure_policy is None:
            return Outcome(failure.code, f"failed: {failed_line} (no failurePolicy: a failed Job fails the JobSet)")
        action = rule["action"] if rule else "RestartJobSet"
        limit = int(self.failure_policy.get("maxRestarts", 0))
        if action == "FailJobSet":
            return Outcome(failure.code, f"failed: {failed_line} (failurePolicy: FailJobSet, rule {rule['name']})")
        if action == "RestartJobSet" and self.restarts_counted >= limit:
            return Outcome(failure.code, f"failed: {failed_line} (maxRestarts {limit} reached)")
        self.restarts += 1
        counted = action == "RestartJobSet"
        self.restarts_counted += counted
        shown = f"restart {self.restarts_counted} of {limit}" if counted else f"restart {self.restarts}, not counted"
        how = "" if self.blocking else "; Recreate: the new pods start while the old ones stop"
        self.output.note(f"{failed_line}: JobSet recreates every Job ({action}, {shown}{how})", "WARNING")
        return Restart(blocking=self.blocking)

    def succeeded(self) -> bool:
        replicas = {name: int(rjob["replicas"]) for name, rjob in self.rjobs.items()}
        complete = [job.replicated_job for job in self.jobs.values() if job.finished == "Complete"]
        return success_policy.met(self.success_policy, replicas, complete)

    def stuck(self, run: Run):
        """Nothing runs, nothing waits, and the successPolicy is not met: on a cluster the JobSet
        would stay active for ever; the rehearsal ends instead. Asked after every exit the runner
        reaped in one poll has been judged: pods that end together can meet the policy together."""
        if run.running() or self.pending or len(self.launched) < len(self.rjobs):
            return None
        return Outcome(1, "every pod has ended, but the successPolicy is not met: on a cluster the JobSet would "
                          "stay active until deleted")

    def tick(self, run: Run, now: float):
        """After every exit of a poll: the failurePolicy over the failed Jobs, then the
        successPolicy, as JobSet's reconcile orders them; then what time brings."""
        if self.owner_deadline is not None and now - self.created > self.owner_deadline.seconds:
            return Outcome(DEADLINE_EXIT, self.owner_deadline.message)
        for job in self.jobs.values():
            deadline = job.spec.get("activeDeadlineSeconds")
            if not job.finished and deadline is not None and now - job.created > float(deadline):
                self.job_failed(run, job, "DeadlineExceeded", f"{DEADLINE_MESSAGE} ({deadline}s)", DEADLINE_EXIT, None)
        decision = self.failure_decision()
        if decision is not None:
            return decision
        if any(job.finished == "Complete" for job in self.jobs.values()) and self.succeeded():
            return Outcome(0, "succeeded (successPolicy met)")
        for when, hostname in [p for p in self.pending if p[0] <= now]:
            self.pending.remove((when, hostname))
            run.launch(run.last[hostname], fresh=False)  # the same container again: the same pod
            self.watch(hostname)
        self.probe(run, now)
        if len(self.launched) < len(self.rjobs):
            self.create_ready_jobs(run)
        return self.stuck(run)


def parse_eviction(text: str) -> Fault:
    """POD@SECONDS or POD@/REGEX/ (POD is a hostname such as cassava-multiworker-worker-0-1): the
    pod's node is preempted then, or when the pod prints a matching line."""
    return parse_fault(text, EVICTION, "--preempt", POD_NAME, "myjob-worker-0-1@40")


def check(manifest: dict, faults=()) -> None:
    """Raises RehearsalError, one line, for a manifest or a fault the rehearsal cannot run."""
    hostnames = [pod.hostname for pod in pods_of(manifest)]
    for fault in faults:
        if fault.replica not in hostnames:
            raise RehearsalError(f"--preempt {fault.replica}: the JobSet has no such pod ({', '.join(sorted(hostnames))})")


def run(session: Session, manifest: dict, run_id: str, faults=(), bucket_directory=None,
        owner_deadline: OwnerDeadline | None = None) -> int:
    """Runs the JobSet; returns the rehearsal's exit code."""
    check(manifest, faults)
    network = f"{PREFIX}{run_id}"
    rules = JobSetRules(manifest, session.output, network=network, bucket_directory=bucket_directory,
                        owner_deadline=owner_deadline)
    session.output.note(f"JobSet {rules.name}: {len(rules.pods)} pods on this machine")
    session.output.note(not_emulated(manifest))
    job = Run(session, network, hosts=rules.hosts(), structured_logs=True)  # GKE's logging agent
    outcome = drive(job, rules, faults)
    for line in job.summary(rules.hostnames):
        session.output.note(line)
    session.output.note(f"JobSet {rules.name}: {outcome.message}", "INFO" if outcome.code == 0 else "ERROR")
    return outcome.code
