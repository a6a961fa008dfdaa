"""`submit_build.py local`: cloudbuild.yaml and the triggers' builds run on this machine as Cloud
Build runs them (scripts/rehearsal/cloudbuild/), each step a container, the images pushed to the
local registry that stands in for Artifact Registry.

The full builds reuse the images the tier's session fixtures build: their Dockerfiles' layers come
from the engine's cache (same store, same build args), so a build here rebuilds only what its own
labels change. One registry storage serves the module (`--keep`), so each big layer is pushed once.
Each command runs in a user's shell, without the engine's settings, as a user would run it.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from containers import leftovers, user_env
from helpers import BUDGETS, REPO

# A work unit of its own (tests/parallel.py), on one worker while the other rehearsals run on
# another: nothing here retags the tier's images or touches another rehearsal's things, and each
# side's leftover check counts only its own kind (tests/containers.py).
pytestmark = pytest.mark.xdist_group("cloud-build")

PYTHON = str(REPO / ".venv" / "bin" / "python")
IMAGES = ("tf-runtime-cpu", "tf-runtime-gpu", "cassava-trainer-cpu", "cassava-trainer-gpu", "tf-predictor-cpu")
PROJECT = "local-project"
# What an interrupted build may take to stop its steps (their 10 s grace) and remove what it made.
STOP_WAIT_SECONDS = 180
# A step that only waits to be stopped, and stops on SIGTERM. (A plain `sleep` as a container's first
# process ignores SIGTERM, so each stop waited out the 10 s grace.)
WAITS = "trap 'exit 143' TERM; sleep 600 & wait"
# Where podman keeps its temporary files when TMPDIR is not set.
ENGINE_TMPDIR = Path("/var/tmp")


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    """The registry's storage and the stand-in's records, shared by the module's builds."""
    return tmp_path_factory.mktemp("cloudbuild")


@pytest.fixture(scope="module")
def built_images(runtime_cpu_image, runtime_gpu_image, cpu_image, gpu_image, serving_image):
    """The five images as the tier builds them: their layers are what the rehearsed builds reuse."""
    return (runtime_cpu_image, runtime_gpu_image, cpu_image, gpu_image, serving_image)


def start(*args: str, cwd=REPO, command: list[str] | None = None) -> subprocess.Popen:
    script = "scripts/submit_build.py" if cwd == REPO else str(REPO / "scripts" / "submit_build.py")
    return subprocess.Popen(command or [PYTHON, script, "local", *args], cwd=cwd, env=user_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_in_order(process: subprocess.Popen) -> None:
    """SIGTERM, the rehearsal's orderly stop (its steps removed, its services closed), and SIGKILL
    only if that never ends: a SIGKILL first, as subprocess.run's timeout sends, leaves the build's
    containers, network, volume and scratch directory behind for every later rehearsal test."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=STOP_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def submit(*args: str, cwd=REPO, timeout: float = 3000, command: list[str] | None = None
           ) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    process = start(*args, cwd=cwd, command=command)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # its own timeout, pytest-timeout's, a Ctrl-C of the test run
        stop_in_order(process)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), time.monotonic() - started


def step_lines(output: str, step_id: str) -> list[str]:
    """What a step printed, as Cloud Build's log prefixes it."""
    return [m.group(1) for m in re.finditer(rf'^Step #\d+ - "{re.escape(step_id)}": (.*)$', output, re.M)]


def step_index(config: dict, step_id: str) -> int:
    return next(i for i, step in enumerate(config["steps"]) if step.get("id") == step_id)


def registry_tags(kept: Path, repository: str) -> dict[str, str]:
    """tag -> manifest digest, read from docker-registry's own storage layout."""
    tags = kept / "registry" / "storage" / "docker" / "registry" / "v2" / "repositories" / repository / "_manifests" / "tags"
    if not tags.is_dir():
        return {}
    return {tag.name: (tag / "current" / "link").read_text().strip() for tag in tags.iterdir()}


def sbom_loads(kept: Path) -> list[dict]:
    path = kept / "standin" / "sbom-loads.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def readme_cloud_build() -> tuple[str, str]:
    """The README's two Cloud Build lines: `gcloud builds submit ...`, and the rehearsal of it."""
    lines = (REPO / "README.md").read_text().splitlines()
    gcloud = next(line for line in lines if line.startswith("gcloud builds submit "))
    rehearsal = next(line for line in lines if re.match(r"\S*python3? scripts/submit_build\.py local ", line))
    return gcloud, rehearsal


def assert_pushed_with_sboms(kept: Path, repository: str, tag: str) -> None:
    loads = sbom_loads(kept)
    for image in IMAGES:
        tags = registry_tags(kept, f"{PROJECT}/{repository}/{image}")
        assert tag in tags and "latest" in tags, (image, sorted(tags))
        assert tags["latest"] == tags[tag], (image, tags)  # the moving tag is this build's image
        uri = f"us-central1-docker.pkg.dev/{PROJECT}/{repository}/{image}@{tags[tag]}"
        assert sorted(load["format"] for load in loads if load["uri"] == uri) == ["cyclonedx", "spdx"], (image, loads)


def test_the_readmes_submit_command_as_written_pushes_the_five_images_under_the_builds_tag(built_images, kept, engine):
    """The README's rehearsal line, run as written in a user's shell, plus --keep to read the registry
    after; its flags are the README's `gcloud builds submit` line's, word for word: every image under
    build-BUILD_ID and latest, each pushed digest with both its SBOMs."""
    gcloud, rehearsal = readme_cloud_build()
    assert shlex.split(rehearsal)[3:] == shlex.split(gcloud)[3:], (gcloud, rehearsal)
    engine_files = set(ENGINE_TMPDIR.glob("digest.txt*"))
    result, seconds = submit(command=["bash", "-euo", "pipefail", "-c", f"{rehearsal} --keep {shlex.quote(str(kept))}"])
    BUDGETS.append(f"the README's Cloud Build, rehearsed on the fixtures' layers: {seconds:.0f}s")
    output = result.stdout
    assert result.returncode == 0, output[-4000:] + result.stderr[-2000:]
    assert output.rstrip().endswith("DONE")
    stand_ins = next(line for line in output.splitlines() if line.startswith("rehearsal: stand-ins: "))
    assert "gcr.io/cloud-builders/docker:latest -> the docker CLI" in stand_ins and "not emulated: provenance" in stand_ins
    build_id = re.search(r"^rehearsal: build ([0-9a-f-]{36}): ", output, re.M).group(1)
    config = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
    assert f'Starting Step #{step_index(config, "push")} - "push"' in output
    assert any("no finding at or above HIGH outside the allowlist" in line
               for line in step_lines(output, "scan-gate-tf-runtime-gpu"))
    assert any("builds FROM CI's stand-in base" in line for line in step_lines(output, "build-tf-runtime-cpu"))
    assert_pushed_with_sboms(kept, "trainers", f"build-{build_id}")
    tool, env = engine
    names = subprocess.run([tool, "images", "--format", "{{.Repository}}"], env=env, capture_output=True, text=True).stdout
    assert "docker.pkg.dev" not in names  # the build's own tags are gone with it
    assert leftovers(engine, cloud_build=True) == []
    assert set(ENGINE_TMPDIR.glob("digest.txt*")) == engine_files  # nor a file of each push (EngineService)


def test_a_fixable_high_in_one_image_fails_the_build_at_its_gate_and_nothing_is_pushed(built_images, kept, tmp_path,
                                                                                      engine):
    from unit.test_scan_gate import occurrence

    finding = occurrence("CVE-2026-4242", cvss=7.5, distribution="HIGH", provider="HIGH", package="openssl",
                         installed=("3.0.17", "1~deb12u2"), fixed=("3.0.17", "1~deb12u3"))
    finding["resourceUri"] = f"us-central1-docker.pkg.dev/{PROJECT}/gated/tf-predictor-cpu@sha256:" + "1" * 64
    vulnerabilities = tmp_path / "vulnerabilities.json"
    vulnerabilities.write_text(json.dumps([finding]))
    result, _ = submit("--config", "cloudbuild.yaml", "--substitutions=_REGION=us-central1,_REPOSITORY=gated",
                       "--vulnerabilities", str(vulnerabilities), "--keep", str(kept), ".")
    output = result.stdout
    assert result.returncode == 1, output[-4000:]
    config = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
    index = step_index(config, "scan-gate-tf-predictor-cpu")
    assert re.search(rf'^ERROR: build step {index} "python:3\.11[^"]*" failed: step exited with non-zero status: 1$',
                     output, re.M), output[-3000:]
    assert "HIGH CVE-2026-4242 openssl 3.0.17-1~deb12u2 -> fixed in 3.0.17-1~deb12u3 (distribution HIGH, note HIGH, " \
           "CVSS 7.5)" in step_lines(output, "scan-gate-tf-predictor-cpu")
    for image in IMAGES[:-1]:  # the finding is the predictor's alone
        assert not any("CVE-2026-4242" in line for line in step_lines(output, f"scan-gate-{image}")), image
    assert f'Starting Step #{step_index(config, "push")} - "push"' not in output and "PUSH" not in output.split()
    assert not (kept / "registry" / "storage" / "docker" / "registry" / "v2" / "repositories" / PROJECT / "gated").exists()
    # The gate stopped the structure tests still running: their containers go with the build.
    assert leftovers(engine, cloud_build=True) == []


def test_the_weekly_trigger_builds_its_commit_and_tags_every_image_with_it(built_images, kept, engine):
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    result, seconds = submit("--trigger", "images/triggers/weekly-rebuild.yaml", "--keep", str(kept))
    BUDGETS.append(f"the weekly trigger's build, rehearsed: {seconds:.0f}s")
    output = result.stdout
    assert result.returncode == 0, output[-4000:] + result.stderr[-2000:]
    assert f"(commit {commit})" in output
    assert any("policy weekly at HIGH" in line for line in step_lines(output, "gate-policy"))
    assert_pushed_with_sboms(kept, "trainers", commit[:7])
    assert leftovers(engine, cloud_build=True) == []


def test_the_refresh_trigger_runs_its_step_and_fails_where_no_registry_answers(kept):
    """Its step resolves the bases (no registry here: one line, exit 1, as refresh_bases.py says)
    after refreshing the locks from PyPI in a venv of its own."""
    result, seconds = submit("--trigger", "images/triggers/refresh-bases.yaml")
    BUDGETS.append(f"the refresh trigger's build, rehearsed: {seconds:.0f}s")
    output = result.stdout
    assert result.returncode == 1, output[-4000:] + result.stderr[-2000:]
    said = "\n".join(step_lines(output, "refresh"))
    assert "step 1 (base digests) needs a container registry" in said, output[-4000:]
    assert "lock images/cpu/requirements.lock: " in said  # step 2 ran: the locks, from PyPI
    assert re.search(r'^ERROR: build step 0 "gcr\.io/cloud-builders/docker[^"]*" failed: step exited with non-zero '
                     r"status: 1$", output, re.M)


def test_steps_share_the_workspace_and_the_engine_run_concurrently_and_the_first_failure_stops_the_build(
        base_image, tmp_path, engine):
    """A config of its own: two steps that start at once and each wait for the other's file (only
    concurrent steps finish), the engine's socket answering and making a container for a step (as
    container-structure-test does, named at random) that goes with the build, a failing step whose
    code ends the build while a long step still runs, and a step after it that never starts."""
    python = "python:3.11.17-slim-trixie"
    ping = ("import http.client, json, socket\n"
            "def call(method, path, body=None):\n"
            "    c = http.client.HTTPConnection('x'); c.sock = socket.socket(socket.AF_UNIX)\n"
            "    c.sock.connect('/var/run/docker.sock')\n"
            "    c.request(method, path, body and json.dumps(body), {'Content-Type': 'application/json'})\n"
            "    return c.getresponse().read().decode()\n"
            "print('engine', call('GET', '/_ping'))\n"
            f"made = call('POST', '/containers/create', {{'Image': '{base_image}', 'Cmd': ['true']}})\n"
            "print('made', json.loads(made)['Id'])\n")
    wait_for = "for i in $$(seq 600); do [ -e {0} ] && exit 0; sleep 0.1; done; exit 9"
    config = {"steps": [
        {"id": "left", "name": python, "entrypoint": "bash", "waitFor": ["-"],
         "args": ["-c", "touch left && " + wait_for.format("right")]},
        {"id": "right", "name": python, "entrypoint": "bash", "waitFor": ["-"],
         "args": ["-c", "touch right && " + wait_for.format("left")]},
        {"id": "engine", "name": python, "entrypoint": "python3", "args": ["-c", ping]},
        {"id": "slow", "name": python, "entrypoint": "bash", "args": ["-c", WAITS], "waitFor": ["engine"]},
        {"id": "fail", "name": python, "entrypoint": "bash", "waitFor": ["engine"], "dir": "sub",
         "args": ["-c", "pwd; echo home=$$HOME; exit 3"]},
        {"id": "never", "name": python, "entrypoint": "true", "waitFor": ["fail"]},
    ]}
    (tmp_path / "cloudbuild.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "sub").mkdir()
    result, _ = submit("--config", "cloudbuild.yaml", ".", cwd=tmp_path, timeout=900)
    output = result.stdout
    assert result.returncode == 3, output[-3000:] + result.stderr[-2000:]
    said = step_lines(output, "engine")
    assert said[0] == "engine OK" and re.fullmatch(r"made [0-9a-f]{64}", said[1]), said
    tool, env = engine
    assert subprocess.run([tool, "container", "exists", said[1].split()[1]], env=env).returncode == 1  # gone with it
    assert step_lines(output, "fail") == ["/workspace/sub", "home=/builder/home"]
    assert re.search(r'^ERROR: build step 4 "python:3\.11\.17-slim-trixie" failed: step exited with non-zero status: 3$',
                     output, re.M)
    assert 'Starting Step #5 - "never"' not in output and "DONE" not in output
    assert 'Finished Step #3 - "slow"' in output  # stopped, not waited for
    assert leftovers(engine, cloud_build=True) == []


def test_a_step_past_its_timeout_ends_the_build_with_124(base_image, tmp_path):
    config = {"steps": [{"id": "sleepy", "name": "python:3.11.17-slim-trixie", "entrypoint": "bash", "args": ["-c", WAITS],
                         "timeout": "3s"}], "timeout": "600s"}
    (tmp_path / "cloudbuild.yaml").write_text(yaml.safe_dump(config))
    result, _ = submit(".", cwd=tmp_path, timeout=600)
    assert result.returncode == 124, result.stdout[-3000:] + result.stderr[-2000:]
    assert 'ERROR: build step 0 "python:3.11.17-slim-trixie" failed: context deadline exceeded' in result.stdout


class Lines:
    """A running build's output, read as it comes."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(process.stdout), daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((m for m in map(re.compile(pattern).search, list(self.lines)) if m), None)
            if found:
                return found
            if not self.reader.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matches {pattern!r}:\n" + "".join(self.lines[-60:]))


def made_by_the_build(engine, network: str, pid: int) -> dict[str, list[str]]:
    """What one build has on this machine: its steps' containers, its network, its volumes, the
    processes it started (the registry, the engine's API service) and its scratch directory."""
    tool, env = engine

    def names(*listing: str) -> list[str]:
        out = subprocess.run([tool, *listing], env=env, capture_output=True, text=True, timeout=120).stdout
        return sorted(name for name in out.split() if name.startswith(network))

    children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    services = [line.split() for line in children.splitlines() if "/rehearsal-cloudbuild-" in line]
    return {"containers": names("ps", "-a", "--format", "{{.Names}}"),
            "networks": names("network", "ls", "--format", "{{.Name}}"),
            "volumes": names("volume", "ls", "--format", "{{.Name}}"),
            "processes": sorted(f"{words[0]} {words[1].rsplit('/', 1)[-1]}" for words in services),
            "directories": sorted(set(re.findall(r"/tmp/rehearsal-cloudbuild-[^/\s]+", children)))}


def alive(pid: str) -> bool:
    try:
        return (Path("/proc") / pid / "stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT", "SIGINT")], ids=["sigterm", "sigint-then-sigint-while-stopping"])
def test_a_build_stopped_by_a_signal_gives_its_step_its_grace_and_leaves_nothing_behind(base_image, tmp_path, engine,
                                                                                          signals):
    """SIGTERM (a CI runner's cancel) or Ctrl-C, once its step runs: the step gets SIGTERM and its
    grace, and the build's container, network, `-home` volume, registry, engine API service and
    scratch directory are all gone when it ends, 130. A second Ctrl-C while the step is stopping
    does not cut that short."""
    step = "trap 'echo stopping; exit 143' TERM; echo up; sleep 600 & wait"
    config = {"steps": [{"id": "sleepy", "name": "python:3.11.17-slim-trixie", "entrypoint": "bash", "args": ["-c", step]}]}
    (tmp_path / "cloudbuild.yaml").write_text(yaml.safe_dump(config))
    process = start(".", cwd=tmp_path)
    try:
        output = Lines(process)
        build_id = output.wait_for(r"^rehearsal: build ([0-9a-f-]{36}): ", timeout=900).group(1)
        output.wait_for(r'^Step #0 - "sleepy": up$', timeout=600)
        network = f"rehearsal-cloudbuild-{build_id[:8]}"
        made = made_by_the_build(engine, network, process.pid)
        assert made["containers"] == [f"{network}-step-0"] and made["networks"] == [network], made
        assert made["volumes"] == [f"{network}-home"], made
        assert sorted(p.split()[1] for p in made["processes"]) == ["docker-registry", "podman"], made
        assert len(made["directories"]) == 1 and Path(made["directories"][0]).is_dir(), made

        process.send_signal(getattr(signal, signals[0]))
        for again in signals[1:]:
            output.wait_for(r'^Step #0 - "sleepy": stopping$', timeout=300)
            process.send_signal(getattr(signal, again))
        assert process.wait(timeout=STOP_WAIT_SECONDS) == 130, "".join(output.lines[-40:]) + process.stderr.read()
        output.reader.join(timeout=30)
    finally:
        stop_in_order(process)
    said = "".join(output.lines)
    assert re.search(r'^Step #0 - "sleepy": stopping$', said, re.M), said[-3000:]  # SIGTERM, not SIGKILL
    assert "rehearsal: interrupted: stopping and removing the build's steps" in said
    assert "DONE" not in said.split()
    gone = made_by_the_build(engine, network, process.pid)
    assert (gone["containers"], gone["networks"], gone["volumes"]) == ([], [], []), gone
    assert [p for p in made["processes"] if alive(p.split()[0])] == []
    assert [d for d in made["directories"] if Path(d).exists()] == []
    assert leftovers(engine, cloud_build=True) == []
