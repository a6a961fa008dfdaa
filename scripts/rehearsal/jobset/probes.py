"""Readiness and startup probes as the kubelet runs them, as plain values and a state machine:
what a container's probe asks (`Probe`, with Kubernetes' defaults and validation), and each probe
worker's state (`ProbeWorker`), read from kubernetes/kubernetes pkg/kubelet/prober (worker.go:
run, doProbe; prober_manager.go: UpdatePodStatus) and pkg/apis/core (v1 defaults, validation).

What they do there, and here:
- each probe of a container has its own worker, ticking every periodSeconds from when it starts
  (with the pod), and probing at once on its first tick;
- a tick probes nothing while the container has run for fewer than initialDelaySeconds (whole
  seconds, truncated), nor while the container is not running;
- the startup probe runs until it has succeeded; the readiness probe only after (a container with
  no startup probe has started as soon as it runs);
- a result changes the probe's state only after successThreshold successes, or failureThreshold
  failures, in a row; until its first state the readiness probe counts as failed and the startup
  probe as unknown;
- a container is Ready once started, running, and its readiness probe succeeded (or it has none);
  the pod status update that first sees it started runs its readiness probe at once rather than
  waiting for the next tick (the kubelet triggers it on every status update until Ready; how
  often those come is the kubelet's, so here once);
- a startup probe that fails failureThreshold times kills the container, which then restarts as
  the pod's restartPolicy says; its worker waits for the new container;
- a restarted container (a new container ID) starts every worker from its initial state.
Running one probe (exec, httpGet, tcpSocket) is prober.py's.
"""

from __future__ import annotations

import dataclasses

from scripts.rehearsal.runner import RehearsalError

READINESS, STARTUP = "readinessProbe", "startupProbe"
HANDLERS = ("exec", "httpGet", "tcpSocket")
# Kubernetes' defaults of a probe (SetDefaults_Probe, pkg/apis/core/v1/defaults.go).
DEFAULTS = {"initialDelaySeconds": 0, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
            "failureThreshold": 3}


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe of a container, its defaults applied and its port resolved to a number."""

    kind: str  # READINESS or STARTUP
    handler: str  # exec, httpGet or tcpSocket
    command: tuple[str, ...] = ()  # exec: run in the container as written (no $(VAR) expansion)
    port: int = 0  # httpGet, tcpSocket
    host: str = ""  # httpGet, tcpSocket: empty for the pod's own address
    path: str = "/"  # httpGet
    scheme: str = "HTTP"  # httpGet
    headers: tuple[tuple[str, str], ...] = ()  # httpGet
    initial_delay: int = 0
    timeout: int = 1
    period: int = 10
    success_threshold: int = 1
    failure_threshold: int = 3


def parse(kind: str, spec: dict, container: dict, where: str) -> Probe:
    """The probe `spec` (a container's readinessProbe or startupProbe) of `container`. Raises
    RehearsalError for what Kubernetes' validation refuses (ValidateProbe) and for a grpc probe,
    which the rehearsal does not run."""
    where = f"{where} {kind}"
    handlers = [name for name in (*HANDLERS, "grpc") if spec.get(name) is not None]
    if len(handlers) != 1:
        raise RehearsalError(f"{where}: must have exactly one of exec, httpGet, tcpSocket, grpc; it has "
                             f"{', '.join(handlers) or 'none'} (Kubernetes refuses the pod)")
    handler = handlers[0]
    if handler == "grpc":
        raise RehearsalError(f"{where}: grpc probes are not emulated; exec, httpGet and tcpSocket are")
    values = {}
    for field, default in DEFAULTS.items():
        value = spec.get(field, default)
        least = 0 if field == "initialDelaySeconds" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise RehearsalError(f"{where}: {field} {value!r} must be an integer of at least {least}")
        values[field] = value
    if kind == STARTUP and values["successThreshold"] != 1:
        raise RehearsalError(f"{where}: successThreshold must be 1 for a startup probe (Kubernetes refuses the pod)")
    timing = dict(initial_delay=values["initialDelaySeconds"], timeout=values["timeoutSeconds"],
                  period=values["periodSeconds"], success_threshold=values["successThreshold"],
                  failure_threshold=values["failureThreshold"])
    action = spec[handler]
    if handler == "exec":
        command = action.get("command") or []
        if not command:
            raise RehearsalError(f"{where}: exec.command is empty")
        return Probe(kind, handler, command=tuple(str(part) for part in command), **timing)
    port = _port(action.get("port"), container, f"{where}.{handler}.port")
    if handler == "tcpSocket":
        return Probe(kind, handler, port=port, host=action.get("host") or "", **timing)
    scheme = action.get("scheme", "HTTP")
    if scheme not in ("HTTP", "HTTPS"):
        raise RehearsalError(f"{where}: httpGet.scheme {scheme!r} is not HTTP or HTTPS")
    path = action.get("path") or "/"
    headers = tuple((header["name"], header.get("value", "")) for header in action.get("httpHeaders") or [])
    return Probe(kind, handler, port=port, host=action.get("host") or "", path=path if path.startswith("/") else f"/{path}",
                 scheme=scheme, headers=headers, **timing)


def _port(port, container: dict, where: str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, str) and not port.isdigit():
        named = {entry.get("name"): entry.get("containerPort") for entry in container.get("ports") or []}
        if port not in named:
            raise RehearsalError(f"{where}: {port!r} names no port of the container")
        port = named[port]
    if port is None or not 0 < int(port) < 65536:
        raise RehearsalError(f"{where}: {port!r} is not a port number")
    return int(port)


def container_probes(container: dict, where: str) -> tuple[Probe, ...]:
    """The startup and readiness probes of a pod template's container (livenessProbe is another
    concern: it is named among the fields not emulated)."""
    return tuple(parse(kind, container[kind], container, where) for kind in (STARTUP, READINESS) if container.get(kind))


@dataclasses.dataclass
class ProbeWorker:
    """One probe worker of one container (worker.go), driven by the controller's clock."""

    probe: Probe
    started_at: float  # when its container started: the initial delay counts from it
    next_tick: float = 0.0  # when the worker's ticker fires next; the first probe is at once
    state: bool | None = None  # the probe's result: True success, False failure, None unknown
    last: bool | None = None  # the last result, and how many in a row (resultRun)
    run_length: int = 0
    on_hold: bool = False  # a failed startup probe waits for a new container
    triggered: bool = False  # a manual run is due (prober_manager's manualTriggerCh)
    in_flight: bool = False  # a probe of this worker is running (doProbe is synchronous)

    def __post_init__(self):
        self.next_tick = self.next_tick or self.started_at
        if self.probe.kind == READINESS:
            self.state = False  # initialValue: results.Failure

    def due(self, now: float, container_started: bool) -> bool:
        """Whether to probe now: the ticker (or a manual trigger) fired, and doProbe would probe."""
        if self.in_flight or (now < self.next_tick and not self.triggered):
            return False
        self.triggered = False
        while self.next_tick <= now:
            self.next_tick += self.probe.period
        if self.on_hold or int(now - self.started_at) < self.probe.initial_delay:
            return False
        return container_started != (self.probe.kind == STARTUP)

    def record(self, success: bool) -> bool:
        """A probe's result; returns whether the probe's state was set (a threshold reached)."""
        if success == self.last:
            self.run_length += 1
        else:
            self.last, self.run_length = success, 1
        threshold = self.probe.success_threshold if success else self.probe.failure_threshold
        if self.run_length < threshold:
            return False
        self.state = success
        if self.probe.kind == STARTUP and not success:
            self.on_hold, self.run_length = True, 0
        return True


@dataclasses.dataclass
class ContainerProbes:
    """The probe workers of one container, and what they make of it (UpdatePodStatus)."""

    workers: dict[str, ProbeWorker]  # kind -> its worker
    seen_started: bool = False  # the kubelet has seen the container started

    @classmethod
    def start(cls, probes: tuple[Probe, ...], started_at: float) -> "ContainerProbes":
        return cls({probe.kind: ProbeWorker(probe, started_at) for probe in probes})

    @property
    def started(self) -> bool:
        """The startup probe succeeded, or there is none."""
        worker = self.workers.get(STARTUP)
        return worker is None or worker.state is True

    @property
    def ready(self) -> bool:
        """Started, and the readiness probe succeeded (or there is none); the container is running."""
        worker = self.workers.get(READINESS)
        return self.started and (worker is None or worker.state is True)

    def due(self, now: float) -> list[Probe]:
        """The probes to run now, the startup probe first."""
        started = self.started
        readiness = self.workers.get(READINESS)
        if started and not self.seen_started and readiness is not None:
            readiness.triggered = True  # the status update that first sees it started runs it at once
        self.seen_started = started
        return [worker.probe for worker in self.workers.values() if worker.due(now, started)]
