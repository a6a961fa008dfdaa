"""Runs a JobSet's pods on this machine, one container per pod, as Kubernetes and JobSet would.

What each pod gets comes from `jobspec.jobset_pods` (the manifest alone, generated or written by
hand): its hostname `{jobset}-{replicatedJob}-{jobIndex}-{completionIndex}`, reachable from the
other pods as that name and as `HOSTNAME.SUBDOMAIN` (JobSet's headless Service), and its
environment with the downward API's labels resolved and JOB_COMPLETION_INDEX set. Nothing here
tells the trainer its cluster: it finds it as it would in the cluster.

The rules are Kubernetes' and JobSet's (v0.12), read from the manifest:
* A pod's non-zero exit goes through its Job's `podFailurePolicy` (first matching rule): FailJob
  fails the Job at once (reason PodFailurePolicy); Ignore recreates the pod uncounted; Count (also
  when no rule matches) recreates it until `backoffLimit` failures, then fails the Job (reason
  BackoffLimitExceeded). A pod evicted by `--preempt` carries the DisruptionTarget condition.
* A failed Job goes through the JobSet's `failurePolicy.rules` (first rule whose reasons and
  replicatedJobs match): FailJobSet ends the JobSet; RestartJobSet (also the default) recreates
  every Job, while fewer than `maxRestarts` restarts were made, else the JobSet fails;
  RestartJobSetAndIgnoreMaxRestarts recreates them without counting.
* The JobSet succeeds by its `successPolicy` (All or Any of the target replicatedJobs' Jobs
  complete; by default every Job), and the pods still running are then stopped.
* Stopping a pod is SIGTERM, then SIGKILL after its terminationGracePeriodSeconds (default 30).

Not emulated: scheduling, node selectors, tolerations, resources and Kueue (every pod runs here
at once); Cloud Storage (pods get no credentials: give the trainer local paths, or a
persistentVolumeClaim, which becomes one engine volume every pod naming it shares); other volume
kinds; a pod's second container. The command ends 0 when the JobSet succeeds, with the exit code of the pod whose
failure ended it otherwise, 125 when the engine could not run a pod, 130 when interrupted.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import signal
import subprocess
import threading
import time

if __package__:  # python -m scripts.submit_job, or imported from the repo root
    from . import jobspec, local_job
else:  # python scripts/submit_job.py puts scripts/ itself first on sys.path
    import jobspec
    import local_job

DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes' default for a Job
DEFAULT_GRACE_SECONDS = 30  # a pod's default terminationGracePeriodSeconds
ENGINE_FAILURE_EXIT = local_job.ENGINE_FAILURE_EXIT


@dataclasses.dataclass
class Pod:
    hostname: str
    subdomain: str | None
    job: str  # the Job's name: {jobset}-{replicatedJob}-{jobIndex}
    replicated_job: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    # (claim or None, mount path, read only): a persistentVolumeClaim is one volume every pod
    # that names it shares (ReadWriteMany storage such as Filestore); an emptyDir is the pod's own.
    mounts: list[tuple[str | None, str, bool]] = dataclasses.field(default_factory=list)


def volume_mounts(pod_spec: dict, container: dict, where: str) -> list[tuple[str | None, str, bool]]:
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes") or []}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise jobspec.SpecError(f"{where}: volumeMount {mount['name']} names no volume of the pod")
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
        elif "emptyDir" in volume:
            claim = None
        else:
            kind = next((key for key in volume if key != "name"), "?")
            raise jobspec.SpecError(f"{where}: volume {mount['name']} is a {kind}; the rehearsal runs "
                                    "persistentVolumeClaim and emptyDir volumes")
        mounts.append((claim, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts


def pods_of(manifest: dict) -> list[Pod]:
    """The manifest's pods, ready to run as containers. Raises SpecError for what this machine
    cannot run."""
    templates = {rjob["name"]: rjob["template"]["spec"]["template"]["spec"] for rjob in manifest["spec"]["replicatedJobs"]}
    pods = []
    for pod in jobspec.jobset_pods(manifest):
        if len(pod["containers"]) != 1:
            raise jobspec.SpecError(f"pod {pod['hostname']}: {len(pod['containers'])} containers; the rehearsal runs one per pod")
        container = pod["containers"][0]
        if not container.get("image"):
            raise jobspec.SpecError(f"pod {pod['hostname']}: its container has no image")
        pod_spec = templates[pod["replicated_job"]]
        mounts = volume_mounts(pod_spec, pod_spec["containers"][0], f"pod {pod['hostname']}")
        pods.append(Pod(pod["hostname"], pod["subdomain"], f"{pod['labels']['job-name']}", pod["replicated_job"],
                        container["image"], list(container.get("command") or []), list(container.get("args") or []),
                        dict(container["env"]), mounts))
    return pods


def parse_eviction(text: str) -> local_job.Preemption:
    """POD@SECONDS or POD@/REGEX/ (POD is a hostname such as cassava-multiworker-worker-0-1): the
    pod's node is preempted then, or when the pod prints a matching line."""
    name, _, when = text.partition("@")
    if re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        if re.fullmatch(r"\d+(\.\d+)?", when):
            return local_job.Preemption(name, seconds=float(when))
        if len(when) > 2 and when.startswith("/") and when.endswith("/"):
            try:
                return local_job.Preemption(name, pattern=re.compile(when[1:-1]))
            except re.error:
                pass
    raise jobspec.SpecError(f"--preempt takes POD@SECONDS or POD@/REGEX/, like myjob-worker-0-1@40; got {text!r}")


def pod_failure_action(job_spec: dict, exit_code: int, disrupted: bool) -> str:
    """FailJob, Ignore or Count: the first of the Job's podFailurePolicy rules that matches."""
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if on_codes:
            values = set(on_codes.get("values", []))
            if (exit_code in values) == (on_codes.get("operator") == "In"):
                return rule["action"]
        elif on_conditions:
            if disrupted and any(c.get("type") == "DisruptionTarget" and c.get("status", "True") == "True"
                                 for c in on_conditions):
                return rule["action"]
    return "Count"


def jobset_failure_action(failure_policy: dict, replicated_job: str, reason: str) -> str:
    """FailJobSet, RestartJobSet or RestartJobSetAndIgnoreMaxRestarts for a failed Job."""
    for rule in failure_policy.get("rules", []):
        reasons, targets = rule.get("onJobFailureReasons") or [], rule.get("targetReplicatedJobs") or []
        if (not reasons or reason in reasons) and (not targets or replicated_job in targets):
            return rule["action"]
    return "RestartJobSet"


class Outcome(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class JobSetRun:
    def __init__(self, manifest: dict, engine: local_job.Engine, output: local_job.Output, run_id: str,
                 preemptions=()):
        self.manifest, self.engine, self.output = manifest, engine, output
        self.pods = pods_of(manifest)
        spec = manifest["spec"]
        self.name = manifest["metadata"]["name"]
        self.job_specs = {rjob["name"]: rjob["template"]["spec"] for rjob in spec["replicatedJobs"]}
        self.failure_policy = spec.get("failurePolicy") or {}
        success = spec.get("successPolicy") or {}
        self.success_operator = success.get("operator", "All")
        self.success_targets = success.get("targetReplicatedJobs") or list(self.job_specs)
        self.network = f"jobset-local-{run_id}"
        self.preemptions = list(preemptions)
        names = {pod.hostname for pod in self.pods}
        for preemption in self.preemptions:
            if preemption.replica not in names:
                raise jobspec.SpecError(f"--preempt {preemption.replica}: the JobSet has no such pod ({', '.join(sorted(names))})")
        self.processes: dict[str, subprocess.Popen] = {}
        self.readers: dict[str, list[threading.Thread]] = {}
        self.created: set[str] = set()
        self.exits = collections.defaultdict(list)
        self.matched: set[str] = set()
        self.lock = threading.Lock()
        self.cancelled = threading.Event()

    def container(self, pod: Pod) -> str:
        return f"{self.network}-{pod.hostname}"

    def grace(self, pod: Pod) -> int:
        template = self.job_specs[pod.replicated_job]["template"]["spec"]
        return int(template.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))

    def launch(self, pod: Pod, restart_attempt: int) -> None:
        """A new container for the pod: Kubernetes never restarts a pod's container under
        restartPolicy Never, it makes a new pod with the same hostname."""
        name = self.container(pod)
        env = dict(pod.env)
        arguments = ["--name", name, "--hostname", pod.hostname, "--network", self.network, "--network-alias", pod.hostname]
        if pod.subdomain:
            arguments += ["--network-alias", f"{pod.hostname}.{pod.subdomain}"]
        for key, value in env.items():
            arguments += ["-e", f"{key}={value}"]
        for claim, path, read_only in pod.mounts:
            source = f"{self.network}-{claim}:" if claim else ""  # no source: a volume of this container alone
            arguments += ["-v", f"{source}{path}{':ro' if read_only else ''}"]
        arguments += ["--label", f"jobset.sigs.k8s.io/restart-attempt={restart_attempt}"]
        if pod.command:
            arguments += ["--entrypoint", pod.command[0], pod.image, *pod.command[1:], *pod.args]
        else:
            arguments += [pod.image, *pod.args]
        with self.lock:
            if self.cancelled.is_set():
                raise KeyboardInterrupt
            self.engine.run("rm", "-f", name)
            self.created.add(name)
            created = self.engine.run("create", *arguments)
            if created.returncode != 0:
                raise Outcome(ENGINE_FAILURE_EXIT, f"{pod.hostname}: the engine could not run {pod.image}: "
                              f"{local_job.last_line(created.stderr) or created.returncode}")
            process = self.engine.popen("start", "--attach", name)
            self.processes[pod.hostname] = process
        patterns = [p.pattern for p in self.preemptions if p.replica == pod.hostname and p.pattern]
        self.readers[pod.hostname] = [
            threading.Thread(target=self.relay, args=(pod, process.stdout, "INFO", patterns), daemon=True),
            threading.Thread(target=self.relay, args=(pod, process.stderr, "ERROR", patterns), daemon=True)]
        for reader in self.readers[pod.hostname]:
            reader.start()

    def relay(self, pod: Pod, stream, severity: str, patterns) -> None:
        for line in stream:
            self.output.line(pod.hostname, severity, line)
            if any(pattern.search(line) for pattern in patterns):
                self.matched.add(pod.hostname)

    def reap(self, pod: Pod) -> int:
        code = self.processes.pop(pod.hostname).wait()
        for reader in self.readers.pop(pod.hostname, []):
            reader.join(timeout=10)
        self.exits[pod.hostname].append(code)
        if code != 0 and not self.engine.has_started(self.container(pod)):
            raise Outcome(ENGINE_FAILURE_EXIT, f"{pod.hostname}: the engine could not start {pod.image} "
                          f"(exit {code}); its command or entrypoint does not exist in the image")
        return code

    def stop_all(self) -> None:
        running = [pod for pod in self.pods if pod.hostname in self.processes]
        if not running:
            return
        grace = max(self.grace(pod) for pod in running)
        self.engine("stop", "-t", str(grace), *(self.container(pod) for pod in running), check=False)
        for pod in running:
            self.reap(pod)

    def halt(self) -> None:
        """From any thread: every pod gets SIGTERM and its grace, as in a deleted JobSet."""
        self.cancelled.set()
        with self.lock:
            names = sorted(self.created)
        if names:
            self.engine("stop", "-t", str(DEFAULT_GRACE_SECONDS), *names, check=False)

    def claims(self) -> list[str]:
        return sorted({f"{self.network}-{claim}" for pod in self.pods for claim, _, _ in pod.mounts if claim})

    def remove(self) -> None:
        with self.lock:
            names = sorted(self.created)
        if names:
            self.engine("rm", "-f", "-v", *names, check=False)  # -v: each pod's emptyDir goes with it
        for volume in self.claims():
            self.engine("volume", "rm", "-f", volume, check=False)
        self.engine("network", "rm", "-f", self.network, check=False)

    def succeeded(self, done_jobs: set[str]) -> bool:
        jobs = {pod.job: pod.replicated_job for pod in self.pods}
        targets = [job for job, rjob in jobs.items() if rjob in self.success_targets]
        complete = [job for job in targets if job in done_jobs]
        return bool(targets) and (len(complete) == len(targets) if self.success_operator == "All" else bool(complete))

    def run(self) -> int:
        restarts = 0
        try:
            self.engine("network", "create", self.network)
            for volume in self.claims():
                self.engine("volume", "create", volume)
            first = True
            while True:
                outcome = self.attempt(restarts, first)
                first = False
                if outcome is not None:
                    raise outcome
                restarts += 1
        except Outcome as outcome:
            self.stop_all()
            self.output.note(f"JobSet {self.name}: {outcome}", "INFO" if outcome.code == 0 else "ERROR")
            return outcome.code
        except BaseException:
            self.halt()  # interrupted: the pods get their grace before they are removed
            raise
        finally:
            self.remove()

    def attempt(self, restart_attempt: int, first: bool) -> Outcome | None:
        """One run of every Job. Returns the JobSet's outcome, or None when JobSet recreates them."""
        by_name = {pod.hostname: pod for pod in self.pods}
        due = list(self.preemptions) if first else []
        evicted: dict[str, float] = {}  # pod -> when SIGKILL follows its SIGTERM
        disrupted: set[str] = set()
        failures = collections.Counter()  # counted pod failures per Job
        succeeded_pods: set[str] = set()
        started = time.monotonic()
        for pod in self.pods:
            self.launch(pod, restart_attempt)
        while True:
            if self.cancelled.is_set():
                raise KeyboardInterrupt
            now = time.monotonic() - started
            for event in [p for p in due if (p.seconds is not None and p.seconds <= now) or p.replica in self.matched]:
                due.remove(event)
                if event.replica in self.processes:
                    pod = by_name[event.replica]
                    self.output.note(f"evicting {pod.hostname} (node preempted): SIGTERM now, SIGKILL in {self.grace(pod)}s",
                                     "WARNING")
                    self.engine("kill", "--signal", "TERM", self.container(pod), check=False)
                    evicted[pod.hostname] = time.monotonic() + self.grace(pod)
                    disrupted.add(pod.hostname)
            for name, kill_at in list(evicted.items()):
                if name in self.processes and time.monotonic() > kill_at:
                    self.engine("kill", "--signal", "KILL", self.container(by_name[name]), check=False)
            for pod in self.pods:
                process = self.processes.get(pod.hostname)
                if process is None or process.poll() is None:
                    continue
                code = self.reap(pod)
                evicted.pop(pod.hostname, None)
                if code == 0:
                    succeeded_pods.add(pod.hostname)
                    done = {job for job in {p.job for p in self.pods}
                            if all(p.hostname in succeeded_pods for p in self.pods if p.job == job)}
                    if self.succeeded(done):
                        return Outcome(0, "succeeded (successPolicy met)")
                    continue
                job_spec = self.job_specs[pod.replicated_job]
                action = pod_failure_action(job_spec, code, pod.hostname in disrupted)
                disrupted.discard(pod.hostname)
                reason = None
                if action == "FailJob":
                    reason = "PodFailurePolicy"
                elif action == "Count":
                    failures[pod.job] += 1
                    if failures[pod.job] > int(job_spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)):
                        reason = "BackoffLimitExceeded"
                if reason is None:
                    self.output.note(f"{pod.hostname} exited {code}: Job {pod.job} recreates it ({action})", "WARNING")
                    self.launch(pod, restart_attempt)
                    continue
                failed = f"Job {pod.job} failed ({reason}): pod {pod.hostname} exited {code}"
                jobset_action = jobset_failure_action(self.failure_policy, pod.replicated_job, reason)
                limit = int(self.failure_policy.get("maxRestarts", 0))
                if jobset_action == "FailJobSet" or (jobset_action == "RestartJobSet" and restart_attempt >= limit):
                    why = "failurePolicy: FailJobSet" if jobset_action == "FailJobSet" else f"maxRestarts {limit} reached"
                    return Outcome(code, f"failed: {failed} ({why})")
                self.output.note(f"{failed}: JobSet recreates every Job ({jobset_action}, restart "
                                 f"{restart_attempt + 1}{'' if jobset_action != 'RestartJobSet' else f' of {limit}'})",
                                 "WARNING")
                self.stop_all()
                return None
            time.sleep(0.2)

    def summary(self) -> list[str]:
        return [f"{pod.hostname}: exit codes {','.join(map(str, self.exits[pod.hostname])) or '-'}" for pod in self.pods]


def run(manifest: dict, *, engine: str | None = None, preemptions=(), output: local_job.Output | None = None) -> int:
    output = output or local_job.Output()
    chosen = local_job.Engine.detect(engine)
    job = JobSetRun(manifest, chosen, output, str(int(time.time() * 1000)),
                    [p if isinstance(p, local_job.Preemption) else parse_eviction(p) for p in preemptions])
    output.note(f"JobSet {job.name}: {len(job.pods)} pods on this machine; scheduling, resources and Kueue are not emulated")
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = job.run()
        for line in job.summary():
            output.note(line)
        return code
    except KeyboardInterrupt:
        output.note("interrupted: the JobSet's containers and network were stopped and removed", "WARNING")
        return 130
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: every pod stopped and removed


def load(path: str) -> dict:
    """A JobSet manifest from YAML or JSON ('-' for stdin); the first JobSet in a multi-document file."""
    import sys

    import yaml

    try:
        text = sys.stdin.read() if path == "-" else open(path).read()
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except (OSError, yaml.YAMLError) as error:
        raise jobspec.SpecError(f"{path}: {str(error).splitlines()[0]}") from None
    jobsets = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "JobSet"]
    if not jobsets:
        raise jobspec.SpecError(f"{path}: no JobSet in it (kind: JobSet)")
    if not re.fullmatch(r"jobset\.x-k8s\.io/v1alpha2", str(jobsets[0].get("apiVersion", ""))):
        raise jobspec.SpecError(f"{path}: apiVersion {jobsets[0].get('apiVersion')!r}; the rehearsal reads jobset.x-k8s.io/v1alpha2")
    return jobsets[0]
