"""The one container runner of the rehearsal: every Vertex replica and every JobSet pod runs here.

A `Run` is the containers of one job on a private network of the engine's: it creates and starts
them, relays every line they print with its source and severity (on Kubernetes, a line holding one
JSON object as GKE's logging agent records it: `structured_entry`), sends them signals, stops them
(SIGTERM, SIGKILL after each one's own grace) and removes them with their network and volumes.
`drive` is the loop over a run: it starts the platform's containers, delivers the faults a user
asked for (`--preempt`, `--maintenance`), and asks the platform's `Rules` what each exit means and
whether time has run out. The rules answer None (carry on), a `Restart` (every container again),
or an `Outcome` (the job's end); what a platform does between (launching a replica again, a
pod's replacement) they do through the run. The rules are the only difference between Vertex AI
(vertex.py) and JobSet (jobset/); this module knows neither.

What the runner decides for both, where the platforms leave nothing to decide:
- the engine failing to run a container (an image it cannot find or pull, a container it cannot
  create, a command that cannot start) ends the job at once with ENGINE_FAILURE_EXIT and one line;
  the engine's own complaint is never shown as the container's output;
- an interrupted rehearsal (Ctrl-C, SIGTERM) gives every container its grace, then removes it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping, Protocol

from scripts.jobspec import SpecError
from scripts.rehearsal.engine import ENGINE_FAILURE_EXIT, Engine, last_line

POLL_SECONDS = 0.2
# What one Popen of `start --attach` may take to end after the container itself stopped.
REAP_SLACK_SECONDS = 30
# Every container, network and volume a rehearsal creates is named with this prefix, and so is its
# scratch directory: leftovers() finds what a run failed to remove by it.
PREFIX = "rehearsal-"


class RehearsalError(SpecError):
    """A spec or an option the rehearsal cannot run; str() is one line, and the command exits 2."""


class Cancelled(Exception):
    """The rehearsal was interrupted while this run was running."""


class EngineFailure(Exception):
    """The engine could not run a container: its image could not be found or pulled, its
    container could not be created, or its command could not start. The platforms report these
    once, as the job's error, and restart nothing."""

    def __init__(self, key: str, image: str, message: str):
        super().__init__(f"{key}: the engine could not run {image}: {message}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job ended: the rehearsal's exit code and one line that says why."""

    code: int
    message: str
    cancelled: bool = False


@dataclasses.dataclass(frozen=True)
class Restart:
    """Every container of the job again, as a new attempt. `blocking`: the new containers start
    only once every old one has stopped (else they start while the old ones take their grace)."""

    blocking: bool = True


@dataclasses.dataclass(frozen=True)
class Container:
    """One container to run, as plain values."""

    key: str  # what the rules and the user call it: workerpool1-0, or a pod's hostname
    name: str  # the engine's name for it, unique in the run
    hostname: str
    image: str
    command: tuple[str, ...] = ()  # replaces the image's entrypoint when given
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # names the other containers reach it by
    volumes: tuple[str, ...] = ()  # -v arguments of its own, besides the storage's
    ports: tuple[str, ...] = ()  # -p arguments: HOST_ADDRESS:HOST_PORT:CONTAINER_PORT
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    gpus: bool = False
    grace: float = 10  # seconds between SIGTERM and SIGKILL when it is stopped
    source: str = ""  # the first column of its lines; default `key`

    @property
    def shown_as(self) -> str:
        return self.source or self.key


@dataclasses.dataclass(frozen=True)
class Fault:
    """Something that takes a container's machine away, once, in the job's first attempt: at
    `seconds` after the start, or when the container prints a line `pattern` matches. `kind`
    is the platform's: a Spot preemption, VM maintenance, a node's eviction of a pod."""

    replica: str  # a Vertex replica's name, or a JobSet pod's hostname
    kind: str
    seconds: float | None = None
    pattern: re.Pattern | None = None


def parse_fault(text: str, kind: str, option: str, target: str, example: str) -> Fault:
    """TARGET@SECONDS or TARGET@/REGEX/, where TARGET matches the regular expression `target`;
    `option` and `example` (such as workerpool1-0@40) are what the one-line refusal shows."""
    name, _, when = text.partition("@")
    if re.fullmatch(target, name):
        if re.fullmatch(r"\d+(\.\d+)?", when):
            return Fault(name, kind, seconds=float(when))
        if len(when) > 2 and when.startswith("/") and when.endswith("/"):
            try:
                return Fault(name, kind, pattern=re.compile(when[1:-1]))
            except re.error:
                pass
    what = "REPLICA" if example.startswith("workerpool") else "POD"
    raise RehearsalError(f"{option} takes {what}@SECONDS or {what}@/REGEX/, like {example}; got {text!r}")


class Output:
    """Every line of the rehearsal, with its source and severity (Cloud Logging's: stdout INFO,
    stderr ERROR), one writer at a time."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.lock = threading.Lock()

    def line(self, source: str, severity: str, text: str) -> None:
        with self.lock:
            self.stream.write(f"{source:<15} {severity:<7} {text.rstrip()}\n")
            self.stream.flush()

    def note(self, text: str, severity: str = "NOTICE") -> None:
        self.line("local-run", severity, text)


# Cloud Logging's severities (LogSeverity), which a structured entry's `severity` may name.
LOG_SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY")


def structured_entry(stream_severity: str, line: str) -> tuple[str, list[str]]:
    """A line as GKE's logging agent records it (cloud.google.com/logging/docs/structured-logging):
    a line holding one JSON object is a structured entry, whose `severity` field, when it names a
    LogSeverity (in any case), is the entry's, and whose `message` is its text; any other line,
    or a field of another kind, keeps the stream's severity and its text. Returns the severity and
    the text's lines (a traceback's entry holds several)."""
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        return stream_severity, [line]
    named = entry.get("severity")
    severity = named.upper() if isinstance(named, str) and named.upper() in LOG_SEVERITIES else stream_severity
    message = entry.get("message")
    return severity, (message.splitlines() or [""]) if isinstance(message, str) else [line.rstrip("\n")]


class Session:
    """What every run of one rehearsal shares: the engine, the output, the storage's variables and
    volumes for each network, and the cancellation that stops them all."""

    def __init__(self, engine: Engine, output: Output, network_storage=None):
        self.engine, self.output = engine, output
        # (subnet, gateway) -> (variables, -v arguments) for every container on that network.
        self.network_storage: Callable[[str, str], tuple[dict, list]] = network_storage or (lambda s, g: ({}, []))
        self.cancelled = threading.Event()
        self.runs: list[Run] = []
        self.lock = threading.Lock()

    def cancel(self) -> None:
        """No container starts any more; every running one gets its stop signal now (each run's
        own thread then sees them exit). A no-op once every run has ended."""
        self.cancelled.set()
        with self.lock:
            runs = list(self.runs)
        for run in runs:
            run.halt()

    def remove_all(self) -> None:
        with self.lock:
            runs = list(self.runs)
        for run in runs:
            run.remove()


class Run:
    """The containers of one job (or one tuning trial) on a network of their own."""

    def __init__(self, session: Session, network: str, hosts: tuple[str, ...] = (), structured_logs: bool = False):
        self.session, self.engine, self.output = session, session.engine, session.output
        self.network = network
        self.hosts = hosts  # every name the job's containers reach each other by: never through the proxy
        # Whether the platform's logging agent reads a line of one JSON object as a structured
        # entry (GKE's does; Vertex AI's keeps it as text: trainer/process/severity.py).
        self.structured_logs = structured_logs
        self.env: dict[str, str] = {}
        self.volumes: list[str] = []
        self.processes: dict[str, tuple[Container, subprocess.Popen]] = {}
        self.readers: dict[str, list[threading.Thread]] = {}
        self.created: set[str] = set()  # engine names of containers that exist
        self.named_volumes: set[str] = set()
        self.exits: dict[str, list[int]] = collections.defaultdict(list)
        self.launches = collections.Counter()
        self.last: dict[str, Container] = {}  # the last container launched under each key
        self.last_errors: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=3))
        self.engine_errors: dict[str, list[str]] = {}
        self.patterns: dict[str, list[re.Pattern]] = collections.defaultdict(list)
        self.matched: set[str] = set()  # keys that printed their fault's pattern
        self.stopping: list[threading.Thread] = []  # old containers a non-blocking restart still stops
        self.lock = threading.Lock()  # launches against removal, which may come from another thread
        with session.lock:
            session.runs.append(self)

    # the network, and what every container on it gets

    def open(self) -> None:
        subnet, gateway = self.engine.create_network(self.network)
        env, volumes = self.session.network_storage(subnet, gateway)
        self.env, self.volumes = dict(env), list(volumes)
        if "https_proxy" in self.env:
            # gRPC honours the proxy too: the job's own traffic between its containers must not go through it.
            bypass = ",".join(["localhost", "127.0.0.1", "::1", *self.hosts])
            self.env["no_proxy"] = self.env["NO_PROXY"] = bypass

    def volume(self, name: str) -> str:
        """An engine volume of this run (a JobSet's persistentVolumeClaim), made once."""
        full = f"{self.network}-{name}"
        with self.lock:
            if full not in self.named_volumes:
                self.named_volumes.add(full)  # before create: an interrupted create is still removed
                self.engine("volume", "create", full)
        return full

    # one container

    def create_arguments(self, container: Container) -> list[str]:
        arguments = ["--name", container.name, "--hostname", container.hostname, "--network", self.network]
        for alias in container.aliases:
            arguments += ["--network-alias", alias]
        for key, value in {**container.env, **self.env}.items():
            arguments += ["-e", f"{key}={value}"]
        for volume in (*self.volumes, *container.volumes):
            arguments += ["-v", volume]
        for port in container.ports:
            arguments += ["-p", port]
        for key, value in container.labels.items():
            arguments += ["--label", f"{key}={value}"]
        if container.gpus:
            arguments += self.engine.gpu_flags()
        if container.command:
            arguments += ["--entrypoint", container.command[0], container.image, *container.command[1:]]
        else:
            arguments += [container.image]
        return arguments + list(container.args)

    def launch(self, container: Container, fresh: bool = True) -> None:
        """Starts the container: a new one (`fresh`: a new machine, a new pod), else the stopped
        one again, with what it wrote (the same machine, a restart in place). Raises
        EngineFailure when the engine cannot create it, Cancelled once the rehearsal is interrupted."""
        with self.lock:
            if self.session.cancelled.is_set():
                raise Cancelled()
            if fresh or container.name not in self.created:
                self.engine.run("rm", "-f", container.name)
                self.created.add(container.name)  # before create: an interrupted create is still removed
                created = self.engine.run("create", *self.create_arguments(container))
                if created.returncode != 0:
                    raise EngineFailure(container.key, container.image, last_line(created.stderr)
                                        or f"{self.engine.tool} create exited {created.returncode}")
            self.launches[container.key] += 1
            self.last[container.key] = container
            process = self.engine.popen("start", "--attach", container.name)
            self.processes[container.key] = (container, process)
        self.engine_errors.pop(container.key, None)
        self.readers[container.key] = [
            threading.Thread(target=self._relay, args=(container, process.stdout, "INFO"), daemon=True),
            threading.Thread(target=self._relay, args=(container, process.stderr, "ERROR"), daemon=True)]
        for reader in self.readers[container.key]:
            reader.start()

    def _relay(self, container: Container, stream, severity: str) -> None:
        # The engine's own complaint when the command cannot start (`start --attach` prints it on
        # stderr) is not the container's: stderr is held back until the container is seen running.
        held: list[str] | None = [] if severity == "ERROR" else None
        for line in stream:
            if held is not None:
                if not self.engine.has_started(container.name):
                    held.append(line)
                    continue
                for early in held:
                    self._line(container, severity, early)
                held = None
            self._line(container, severity, line)
        if held:
            if self.engine.has_started(container.name):
                for early in held:
                    self._line(container, severity, early)
            else:
                self.engine_errors[container.key] = [line.strip() for line in held if line.strip()]

    def _line(self, container: Container, severity: str, line: str) -> None:
        severity, texts = structured_entry(severity, line) if self.structured_logs else (severity, [line])
        for text in texts:
            self.output.line(container.shown_as, severity, text)
            if any(pattern.search(text) for pattern in self.patterns.get(container.key, ())):
                self.matched.add(container.key)
            if severity == "ERROR" and text.strip():
                self.last_errors[container.key].append(text.strip())

    def running(self) -> list[Container]:
        return [container for container, _ in self.processes.values()]

    def started(self, key: str) -> bool:
        """Whether the container of `key` is running: launched, not exited, its command started."""
        container = self.current(key)
        return container is not None and self.engine.state(container.name, "Running") == "true"

    def current(self, key: str) -> Container | None:
        entry = self.processes.get(key)
        return entry[0] if entry else None

    def send(self, container: Container, signal_name: str) -> None:
        self.engine("kill", "--signal", signal_name, container.name, check=False)

    def exited(self) -> list[tuple[Container, int]]:
        """The containers that have exited since the last call, reaped: (container, exit code).
        Raises EngineFailure for one whose command never started."""
        done = []
        for key, (container, process) in list(self.processes.items()):
            if process.poll() is None:
                continue
            self._reap(key, process.returncode)
            said = self.engine_errors.get(key)
            if process.returncode != 0 and said is not None and not self.engine.has_started(container.name):
                raise EngineFailure(key, container.image, said[-1] if said else
                                    f"{self.engine.tool} start exited {process.returncode}")
            done.append((container, process.returncode))
        return done

    def _reap(self, key: str, code: int) -> None:
        for reader in self.readers.pop(key, []):
            reader.join(timeout=10)
        del self.processes[key]
        self.exits[key].append(code)

    def stop(self, containers: list[Container] | None = None, wait: bool = True) -> None:
        """Stops these containers (default: every running one): SIGTERM, then SIGKILL after each
        one's grace. Without `wait`, they are stopped and reaped in the background and are no
        longer this run's: a new attempt may start beside them."""
        chosen = [(c, p) for c, p in self.processes.values() if containers is None or c in containers]
        for container, _ in chosen:
            del self.processes[container.key]  # their exits are no rule's concern any more
        if not chosen:
            return

        def stop_all():
            by_grace = collections.defaultdict(list)
            for container, _ in chosen:
                by_grace[container.grace].append(container.name)
            stoppers = [threading.Thread(target=self.engine, args=("stop", "-t", f"{grace:g}", *names),
                                         kwargs={"check": False}, daemon=True) for grace, names in by_grace.items()]
            for stopper in stoppers:
                stopper.start()
            for container, process in chosen:
                try:
                    code = process.wait(timeout=container.grace + REAP_SLACK_SECONDS)
                except subprocess.TimeoutExpired:
                    self.send(container, "KILL")
                    code = process.wait()
                for reader in self.readers.pop(container.key, []):
                    reader.join(timeout=10)
                self.exits[container.key].append(code)
            for stopper in stoppers:
                stopper.join()

        if wait:
            stop_all()
        else:
            stopper = threading.Thread(target=stop_all, daemon=True)
            stopper.start()
            self.stopping.append(stopper)

    def settle(self) -> None:
        """Waits for the containers a non-blocking restart is still stopping."""
        for stopper in self.stopping:
            stopper.join()
        self.stopping.clear()

    def halt(self) -> None:
        """From any thread: every container of the run gets SIGTERM and its grace, as in a deleted
        job. The run's own thread then sees them exit, and ends."""
        with self.lock:
            names = sorted(self.created)
        if names:
            grace = max((c.grace for c in self.running()), default=10)
            self.engine("stop", "-t", f"{grace:g}", *names, check=False)

    def remove(self) -> None:
        """Removes every container it made, whatever its state, its volumes and its network. Safe to
        call again, and from any thread."""
        self.settle()
        with self.lock:
            names, volumes = sorted(self.created), sorted(self.named_volumes)
        if names:
            self.engine("rm", "-f", "-v", *names, check=False)  # -v: anonymous volumes (emptyDir) go with them
        for volume in volumes:
            self.engine("volume", "rm", "-f", volume, check=False)
        self.engine("network", "rm", "-f", self.network, check=False)

    def summary(self, keys) -> list[str]:
        return [f"{key}: exit codes {','.join(map(str, self.exits[key])) or '-'}; "
                f"restarts {max(self.launches[key] - 1, 0)}" for key in keys]


class Rules(Protocol):
    """A platform: what to run, and what each event means."""

    def begin(self, run: Run, attempt: int) -> None:
        """Launches the containers an attempt starts with (attempt 0 is the first)."""

    def disrupt(self, run: Run, container: Container, fault: Fault) -> float:
        """Says what the fault is; returns the seconds between its SIGTERM and SIGKILL."""

    def exited(self, run: Run, container: Container, code: int, fault: Fault | None) -> Outcome | Restart | None:
        """What a container's exit means. `fault`: the fault that took its machine, if one did."""

    def tick(self, run: Run, now: float) -> Outcome | Restart | None:
        """What time and the whole poll decide (a deadline, a dependency now met, nothing left to run),
        asked after every exit of the poll; `now` is time.monotonic()."""


def drive(run: Run, rules: Rules, faults=()) -> Outcome:
    """Runs the job to its end under `rules`; the run is removed whatever happens."""
    try:
        run.open()
        started, attempt = time.monotonic(), 0
        while True:
            ended = _attempt(run, rules, list(faults) if attempt == 0 else [], started, attempt)
            if isinstance(ended, Outcome):
                run.stop()
                return ended
            run.stop(wait=ended.blocking)
            if ended.blocking:
                run.settle()
            attempt += 1
    except EngineFailure as failure:
        run.stop()
        return Outcome(ENGINE_FAILURE_EXIT, str(failure))
    except Cancelled:
        return Outcome(130, "interrupted", cancelled=True)
    except BaseException:
        run.stop()  # interrupted in this thread: the containers get their grace, as on the platform
        raise
    finally:
        run.remove()


def _attempt(run: Run, rules: Rules, due: list[Fault], started: float, attempt: int) -> Outcome | Restart:
    for fault in due:
        if fault.pattern is not None:
            run.patterns[fault.replica].append(fault.pattern)
    rules.begin(run, attempt)
    kill_at: dict[str, float] = {}  # key -> when SIGKILL follows the fault's SIGTERM
    disrupted: dict[str, Fault] = {}
    try:
        while True:
            if run.session.cancelled.is_set():
                raise Cancelled()
            now = time.monotonic()
            for fault in [f for f in due if (f.seconds is not None and f.seconds <= now - started) or f.replica in run.matched]:
                due.remove(fault)
                container = run.current(fault.replica)
                if container is not None:
                    grace = rules.disrupt(run, container, fault)
                    run.send(container, "TERM")
                    kill_at[container.key], disrupted[container.key] = time.monotonic() + grace, fault
            for key, at in list(kill_at.items()):
                if run.current(key) is not None and time.monotonic() > at:
                    run.send(run.current(key), "KILL")
                    del kill_at[key]
            for container, code in run.exited():
                kill_at.pop(container.key, None)
                decision = rules.exited(run, container, code, disrupted.pop(container.key, None))
                if decision is not None:
                    return decision
            decision = rules.tick(run, time.monotonic())
            if decision is not None:
                return decision
            time.sleep(POLL_SECONDS)
    finally:
        run.patterns.clear()
        run.matched.clear()
