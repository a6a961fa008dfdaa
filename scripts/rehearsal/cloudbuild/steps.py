"""Cloud Build's rules over the runner (runner.py): each step a container of its image, started
when what it waits for has succeeded (graph.py), the first failure or time limit ending the build
and stopping the steps still running.

What each step gets, as cloud-build-local's build.go dockerRunArgs gives it (and Cloud Build's
"Build configuration overview" describes): the source at /workspace, shared by every step, as its
working directory, or `dir` under it; a volume shared by every step at /builder/home, which is
$HOME; the engine's API socket at /var/run/docker.sock, as the Docker daemon's; its `entrypoint`
(else the image's), `args` and `env` (options.env first, then the step's). Not emulated: steps run
unprivileged (Cloud Build runs them --privileged); the engine's socket is theirs all the same.

The build ends:
- when a step exits non-zero: "build step N "IMAGE" failed: step exited with non-zero status: C",
  exit code C; the other running steps are stopped (SIGTERM, SIGKILL after 10 s);
- when a step outlives its `timeout`: "build step N "IMAGE" failed: context deadline exceeded"
  (cloud-build-local's error for it), exit code 124; or the build its own: "build timed out", 124;
- when every step has succeeded.
"""

from __future__ import annotations

import time
from typing import Mapping

from scripts.rehearsal.cloudbuild import graph
from scripts.rehearsal.cloudbuild.config import Build, Step
from scripts.rehearsal.cloudbuild.log import BuildLog
from scripts.rehearsal.runner import Container, Outcome, Run

TIMEOUT_EXIT = 124
STOP_GRACE_SECONDS = 10
HOME = "/builder/home"


class StepRun(Run):
    """A run whose containers start in their step's working directory."""

    workdirs: dict[str, str]

    def create_arguments(self, container: Container) -> list[str]:
        return ["--workdir", self.workdirs.get(container.name, "/workspace"), *super().create_arguments(container)]


class BuildRules:
    """One build's steps from start to end, over the runner."""

    def __init__(self, build: Build, log: BuildLog, *, network: str, images: Mapping[str, str], workspace: str,
                 socket: str, extra_env: Mapping[str, Mapping[str, str]], extra_volumes: Mapping[str, tuple[str, ...]]):
        self.build, self.log, self.network = build, log, network
        self.images = images  # step image -> the local image that runs it
        self.workspace, self.socket = workspace, socket
        self.extra_env, self.extra_volumes = extra_env, extra_volumes  # by local image: what its stand-in needs
        self.needed = graph.prerequisites(build.steps)
        self.started: dict[int, float] = {}
        self.succeeded: set[int] = set()
        self.finished: set[int] = set()
        self.begun: float | None = None

    def container(self, run: Run, step: Step) -> Container:
        local = self.images[step.name]
        env = {"HOME": HOME, **self.extra_env.get(local, {})}
        for entry in step.env:
            key, _, value = entry.partition("=")
            env[key] = value
        volumes = (f"{self.workspace}:/workspace", f"{run.volume('home')}:{HOME}", f"{self.socket}:/var/run/docker.sock",
                   *self.extra_volumes.get(local, ()))
        name = f"{self.network}-step-{step.index}"
        run.workdirs[name] = step.workdir
        return Container(key=str(step.index), name=name, hostname=f"step-{step.index}", image=local,
                         command=(step.entrypoint,) if step.entrypoint else (), args=step.args, env=env,
                         volumes=volumes, grace=STOP_GRACE_SECONDS, source=step.shown)

    def finish(self, index: int) -> None:
        self.finished.add(index)
        self.log.entry(f"Finished {self.build.steps[index].shown}")

    def finish_stopped(self) -> None:
        """The steps the build's end stopped: finished too, as Cloud Build's log says of a cancelled step."""
        for index in sorted(set(self.started) - self.finished):
            self.finish(index)

    def start_ready(self, run: Run) -> None:
        for index in graph.ready(self.needed, self.succeeded, self.started):
            step = self.build.steps[index]
            self.log.entry(f"Starting {step.shown}")
            self.started[index] = time.monotonic()
            run.launch(self.container(run, step))

    # the runner's Rules

    def begin(self, run: Run, attempt: int) -> None:
        self.begun = time.monotonic()
        run.workdirs = {}
        self.start_ready(run)

    def disrupt(self, run: Run, container: Container, fault) -> float:  # no faults in a build
        return STOP_GRACE_SECONDS

    def exited(self, run: Run, container: Container, code: int, fault) -> Outcome | None:
        step = self.build.steps[int(container.key)]
        self.finish(step.index)
        if code != 0:
            return Outcome(code, f'build step {step.index} "{step.name}" failed: step exited with non-zero status: {code}')
        self.succeeded.add(step.index)
        if len(self.succeeded) == len(self.build.steps):
            return Outcome(0, "every step succeeded")
        self.start_ready(run)
        return None

    def tick(self, run: Run, now: float) -> Outcome | None:
        for index, started in self.started.items():
            step = self.build.steps[index]
            if index not in self.succeeded and step.timeout is not None and now - started > step.timeout \
                    and run.current(str(index)) is not None:
                self.log.entry(f"{step.shown}: TIMEOUT after {step.timeout:g}s")
                return Outcome(TIMEOUT_EXIT, f'build step {index} "{step.name}" failed: context deadline exceeded')
        if self.begun is not None and now - self.begun > self.build.timeout:
            return Outcome(TIMEOUT_EXIT, f"build timed out after {self.build.timeout:g}s")
        if not run.running() and len(self.succeeded) < len(self.build.steps) and not graph.ready(
                self.needed, self.succeeded, self.started):
            return Outcome(1, "no step can start: what they wait for will never succeed")
        return None
