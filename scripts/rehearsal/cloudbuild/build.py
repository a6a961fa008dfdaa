"""One build from submission to its end, as `gcloud builds submit` (or a trigger) starts it and
Cloud Build runs it: the config checked and substituted before anything starts, the source copied
to the workspace, the stand-ins named and made, the engine's API service and the Artifact Registry
stand-in started, the steps run under Cloud Build's rules (steps.py over the runner), the `images:`
pushed only when every step has succeeded, and everything removed at the end, also when interrupted.

The source, as gcloud uploads it: a .gcloudignore is not read (the project has none); in a git
checkout, the files git does not ignore (tracked, and untracked ones outside .gitignore), which is
what gcloud's default .gcloudignore (`.git`, `.gitignore`, `#!include:.gitignore`) uploads. A
trigger's build gets its commit instead, fetched shallow with its own .git (the rehearsal's choice:
Cloud Build's pages do not say whether .git is there), and says when the working tree differs.

Exit codes: 0 the build succeeded; the failing step's exit code; 124 a step's or the build's
timeout; 125 the engine could not run a step; 130 interrupted; 2 a config, a substitution or an
option Cloud Build or the rehearsal refuses (one line).
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

from scripts.rehearsal import engine as engines, engine_front
from scripts.rehearsal.cloudbuild import config as configs, standins, substitutions as subst, trigger as triggers
from scripts.rehearsal.cloudbuild.log import BuildLog
from scripts.rehearsal.cloudbuild.registry import REGISTRY_HOST, ArtifactRegistry, RegistryError
from scripts.rehearsal.cloudbuild.steps import BuildRules, StepRun
from scripts.rehearsal.runner import PREFIX, RehearsalError, Session, drive
from scripts.rehearsal.session import stop_on_signals

LOCAL_PROJECT = "local-project"  # PROJECT_ID when none is given
LOCAL_PROJECT_NUMBER = "000000000000"
STATE_IN_STEP = "/var/lib/cloudbuild-standin"
# The annotation, valued with the build's id, on every container a step makes through the build's
# engine service (its containers.conf's `annotations`).
MADE_BY_A_STEP = "rehearsal.cloudbuild.build"


@dataclasses.dataclass(frozen=True)
class Options:
    config: str = "cloudbuild.yaml"  # relative to the source, as gcloud reads it
    source: str = "."
    substitutions: tuple[tuple[str, str], ...] = ()
    trigger: str | None = None  # a BuildTrigger file: run the build it starts
    branch: str | None = None
    sha: str | None = None
    project: str = LOCAL_PROJECT
    region: str = "global"
    vulnerabilities: str | None = None
    keep: str | None = None  # DIR/registry (the registry's storage, reused) and DIR/standin (scans, SBOM loads)
    engine: str | None = None


@dataclasses.dataclass(frozen=True)
class Submission:
    """What the build is, decided before anything runs."""

    build: configs.Build
    document: dict
    build_id: str
    commit: str | None  # a trigger's commit, checked out as the workspace
    source: Path


def git(source: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RehearsalError(f"git {' '.join(args)} in {source}: {(result.stderr.strip().splitlines() or ['failed'])[-1]}")
    return result.stdout.strip()


def submission(options: Options) -> Submission:
    """The build the options submit, checked and substituted; RehearsalError (one line) if refused."""
    source = Path(options.source).resolve()
    if not source.is_dir():
        raise RehearsalError(f"SOURCE {options.source}: not a directory")
    given = dict(options.substitutions)
    build_id = str(uuid.uuid4())
    commit = None
    trigger_values = None
    try:
        config_path = options.config
        if options.trigger:
            trigger = triggers.load(options.trigger)
            config_path = trigger.config_path
            commit = git(source, "rev-parse", options.sha or "HEAD")
            ref = f"refs/heads/{options.branch}" if options.branch else None
            trigger_values = triggers.built_ins(trigger, commit, ref)
            given = {**trigger.substitutions, **given}
            document = configs.load_text(git(source, "show", f"{commit}:{config_path}"), config_path)
        else:
            document = configs.load(source / config_path)
        values = subst.built_ins(project_id=options.project, build_id=build_id, project_number=LOCAL_PROJECT_NUMBER,
                                 location=options.region, trigger=trigger_values)
        build = configs.build_of(document, given, values, trigger=trigger_values is not None)
    except (configs.ConfigError, subst.SubstitutionError) as error:
        raise RehearsalError(f"INVALID_ARGUMENT: {error}") from None
    return Submission(build, document, build_id, commit, source)


def copy_workspace(submitted: Submission, workspace: Path, log: BuildLog) -> int:
    """The source as the build sees it; returns the number of files."""
    source = submitted.source
    if submitted.commit:
        # A shallow fetch of that commit alone: its .git holds every object it needs, inside the workspace.
        subprocess.run(["git", "init", "--quiet", str(workspace)], check=True)
        git(workspace, "fetch", "--quiet", "--depth", "1", f"file://{source}", submitted.commit)
        git(workspace, "checkout", "--quiet", "FETCH_HEAD")
        if git(source, "status", "--porcelain", "--untracked-files=no"):
            log.note(f"the trigger builds commit {submitted.commit[:12]}; this checkout's uncommitted changes are not in it")
        return int(git(workspace, "ls-files", "-z").count("\0"))
    workspace.mkdir(parents=True)
    if (source / ".git").exists():
        names = git(source, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    else:
        names = [str(p.relative_to(source)) for p in source.rglob("*") if ".git" not in p.relative_to(source).parts]
    count = 0
    for name in filter(None, names):
        origin = source / name
        if origin.is_file() or origin.is_symlink():
            (workspace / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, workspace / name, follow_symlinks=False)
            count += 1
    return count


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 3600):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def api(socket_path: str, method: str, path: str, timeout: float = 30) -> tuple[int, bytes]:
    connection = UnixConnection(socket_path, timeout)
    try:
        connection.request(method, path, headers={"X-Registry-Auth": base64.b64encode(b"{}").decode()})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class EngineService:
    """The engine's Docker API on a socket of the build's, which every step gets as the daemon's:
    `podman system service`, with the variables that send Artifact Registry's names to the stand-in
    and a containers.conf that keeps those variables out of the containers it runs and marks each
    of them as this build's (MADE_BY_A_STEP: a step's own client, container-structure-test say,
    names them at random, and a build stopped mid-step leaves them; `remove_made_by_steps`).
    The steps' socket is the front's (scripts/rehearsal/engine_front.py): podman 4.3's own answer
    to the Docker API's container wait spins a core until the container stops."""

    def __init__(self, directory: Path, settings: engines.Settings, extra: dict[str, str], build_id: str):
        self.socket = str(directory / "engine.sock")
        self.engine_socket = str(directory / "podman.sock")
        self.front: engine_front.Front | None = None
        conf = directory / "containers.conf"
        base = Path(settings.environ["CONTAINERS_CONF"]).read_text()
        conf.write_text(base.replace("[containers]\n", f'[containers]\nhttp_proxy = false\n'
                                     f'annotations = ["{MADE_BY_A_STEP}={build_id}"]\n', 1))
        self.log = directory / "engine-service.log"
        # TMPDIR: podman 4.3's push handler writes a `digest.txt*` file for every push into its
        # TMPDIR (/var/tmp unless set) and never removes it; in the build's directory they go with it.
        env = {**os.environ, **settings.environ, "CONTAINERS_CONF": str(conf), "TMPDIR": str(directory), **extra}
        self.process = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{self.engine_socket}"],
                                        stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env=env, cwd="/")
        try:
            self._wait_until_it_answers()
            self.front = engine_front.Front(self.socket, self.engine_socket)
            threading.Thread(target=self.front.serve_forever, daemon=True).start()
        except BaseException:  # an interrupt while it starts, too: the caller has no service to close
            self.close()
            raise

    def _wait_until_it_answers(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                if api(self.engine_socket, "GET", "/_ping", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RehearsalError(f"the engine's API service did not start; see {self.log}")
            time.sleep(0.2)

    def push(self, image: str) -> str:
        """Pushes the image through the service; its digest. RehearsalError (one line) if it fails."""
        name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        status, body = api(self.socket, "POST", f"/images/{urllib.parse.quote(name, safe='')}/push?tag={tag}", 3600)
        digest = None
        for line in body.decode(errors="replace").splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("error") or message.get("errorDetail"):
                raise RehearsalError(f"failed to push {image}: {message.get('error') or message['errorDetail']}")
            digest = (message.get("aux") or {}).get("Digest") or digest
            reported = re.search(r"digest: (sha256:[0-9a-f]{64})", message.get("status") or "")
            digest = reported.group(1) if reported else digest
        if status != 200:
            raise RehearsalError(f"failed to push {image}: the engine answered {status}: {body[:200]!r}")
        return digest or "?"

    def close(self) -> None:
        if self.front is not None:
            self.front.close()
            self.front = None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        Path(self.socket).unlink(missing_ok=True)
        Path(self.engine_socket).unlink(missing_ok=True)


def remove_made_by_steps(engine: engines.Engine, build_id: str) -> list[str]:
    """Removes the containers the build's steps made through its engine service (MADE_BY_A_STEP),
    as Cloud Build's VM goes with its build; returns their names. Another build's, or any other
    process's, carry another value or none, and stay."""
    names = sorted(name for name, value in engine.annotated_containers(MADE_BY_A_STEP).items() if value == build_id)
    for name in names:
        engine("rm", "-f", name, check=False)
    return names


def registry_names(listed) -> set[str]:
    """Of the engine's REPOSITORY:TAG names, those that name Artifact Registry (REGISTRY_HOST): the
    only tags a build here makes that it must take away again. Not the others: a tag another process
    makes while the build runs (a test's `localhost/...`, say) is not the build's, although it is new
    to the store."""
    return {name for name in listed if not name.startswith("<none>") and "/" in name
            and REGISTRY_HOST.match(name.split("/", 1)[0].lower())}


def image_names(engine: engines.Engine) -> set[str]:
    return registry_names(engine.image_names())


def run_build(options: Options, log: BuildLog | None = None) -> int:
    """Runs the build; returns its exit code. RehearsalError (one line) for what cannot run."""
    log = log or BuildLog()
    submitted = submission(options)
    build = submitted.build
    try:
        settings = engines.settings(options.engine)
    except engines.EngineError as error:
        raise RehearsalError(str(error)) from None
    if settings.engine != "podman":
        raise RehearsalError("the Cloud Build rehearsal runs on podman (its Artifact Registry stand-in is reached "
                             "through podman's API service); docker's daemon is not supported here")
    engine = engines.Engine(settings.engine, settings.environ)
    environ = {**os.environ, **settings.environ}
    if options.vulnerabilities and not Path(options.vulnerabilities).is_file():
        raise RehearsalError(f"--vulnerabilities {options.vulnerabilities}: no such file")
    for warning in build.warnings:
        log.note(f"ALLOW_LOOSE: {warning}", "WARNING")
    unknown = configs.not_emulated(submitted.document)
    log.note("not emulated: " + ("; ".join(unknown) if unknown else "nothing else the config asks"))
    # From here on, Ctrl-C and SIGTERM (a CI runner's cancel, `kill`) are an orderly stop: the steps
    # get their grace, then everything the build made is removed (as session.py does for every rehearsal).
    previous = stop_on_signals()
    scratch: Path | None = None
    registry: ArtifactRegistry | None = None
    session = Session(engine, log)
    service = None
    before: set[str] | None = None
    try:
        try:
            base = standins.standin_base(environ)
            chosen = standins.plan((step.name for step in build.steps),
                                   lambda image: engine.run("image", "exists", image).returncode == 0)
            log.note(standins.line(chosen, base))
            images = standins.ensure(chosen, base, engine, environ, log.note)
        except standins.StandInError as error:
            raise RehearsalError(str(error)) from None
        scratch = Path(tempfile.mkdtemp(prefix=f"{PREFIX}cloudbuild-"))
        kept = Path(options.keep).resolve() if options.keep else None
        state = (kept or scratch) / "standin"
        state.mkdir(parents=True, exist_ok=True)
        if options.vulnerabilities:
            shutil.copy(options.vulnerabilities, state / "vulnerabilities.json")
        else:
            (state / "vulnerabilities.json").unlink(missing_ok=True)
        # The registry's own files (its config, certificates, key) stay in the scratch directory, so
        # its process names the rehearsal's directory (leftovers() finds it by that); only its
        # storage goes to --keep.
        registry = ArtifactRegistry(scratch / "registry", log.note,
                                    storage=(kept / "registry" / "storage") if kept else None)
        files = copy_workspace(submitted, scratch / "workspace", log)
        log.note(f"build {submitted.build_id}: {files} files of {submitted.source} in /workspace"
                 + (f" (commit {submitted.commit})" if submitted.commit else ""))
        registry.start()
        service = EngineService(scratch, settings, registry.engine_environment(), submitted.build_id)
        try:
            before = image_names(engine)
        except engines.EngineError as error:
            raise RehearsalError(str(error)) from None
        extra_env = {images[name]: env for name, env in _standin_env(chosen, images, base, options).items()}
        extra_volumes = {images[name]: (f"{state}:{STATE_IN_STEP}",) for name, standin in chosen.items()
                         if standin is not None and standin.kind == "gcloud"}
        network = f"{PREFIX}cloudbuild-{submitted.build_id[:8]}"
        run = StepRun(session, network)
        rules = BuildRules(build, log, network=network, images=images, workspace=str(scratch / "workspace"),
                           socket=service.socket, extra_env=extra_env, extra_volumes=extra_volumes)
        outcome = drive(run, rules)
        rules.finish_stopped()
        if outcome.cancelled:
            return 130
        if outcome.code != 0:
            log.entry("ERROR")
            log.entry(f"ERROR: {outcome.message}")
            return outcome.code
        if build.images:
            log.entry("PUSH")
            for image in build.images:
                log.entry(f"Pushing {image}")
                try:
                    digest = service.push(image)
                except RehearsalError as error:
                    log.entry("ERROR")
                    log.entry(f"ERROR: {error}")
                    return 1
                log.entry(f"{image}: digest: {digest}")
        log.entry("DONE")
        return 0
    except KeyboardInterrupt:
        log.note("interrupted: stopping and removing the build's steps", "WARNING")
        return 130
    except RegistryError as error:
        raise RehearsalError(str(error)) from None
    finally:
        if previous is not None:  # a second Ctrl-C or SIGTERM must not cut the cleanup short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.cancel()
        session.remove_all()
        if service is not None:
            service.close()
            remove_made_by_steps(engine, submitted.build_id)
        if registry is not None:
            registry.close()
        if before is not None:  # the build's own tags (REGION-docker.pkg.dev/...) go with it
            try:
                made = sorted(image_names(engine) - before)
            except engines.EngineError as error:
                made = []
                log.note(f"the build's own tags were not taken away: {error}", "WARNING")
            for name in made:
                engine("untag", name, name, check=False)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if previous is not None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _standin_env(chosen, images, base, options) -> dict[str, dict[str, str]]:
    env = {}
    for image, standin in chosen.items():
        if standin is not None and standin.kind == "docker":
            env[image] = {"CLOUDBUILD_STANDIN_BASE": base}
        elif standin is not None and standin.kind == "gcloud":
            env[image] = {"CLOUDBUILD_STANDIN_STATE": STATE_IN_STEP, "CLOUDSDK_CORE_PROJECT": options.project}
    return env


__all__ = ["Options", "REGISTRY_HOST", "run_build", "submission"]
