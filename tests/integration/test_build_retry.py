"""Builds that start again when buildah's cache lookup met an image removed under it (buildah
before 1.43: containers/buildah#5674), and only then: scripts/rehearsal/engine.py's `build`, which the
tests and the Cloud Build rehearsal's stand-ins build through, and scripts/supply_chain/images.sh's
own builds, and the Cloud Build rehearsal's stand-in `docker` (a step's `docker build` on the
engine's API socket). A `buildah` on PATH that fails as 1.28 does stands in for the race, which no test can
bring about on demand; every other part (the shell script, its engine settings, the processes) is
the real one. Integration tier: they start processes (tests/unit/test_timeouts.py)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO
from scripts.rehearsal import engine


RACE = ("Error: checking if cached image exists from a previous build: getting top layer info: "
        "layer not known")


def fake_buildah(folder, failures: int, message: str, name: str = "buildah", code: int = 125):
    """A `buildah` that fails its first `failures` calls with `message` on stderr (exit 125, as
    buildah does), then succeeds; every call's arguments are appended to folder/calls."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f"""#!/bin/bash
echo "$*" >> {folder}/calls
echo "STEP 1/2: FROM base"
if [ $(wc -l < {folder}/calls) -le {failures} ]; then echo {message!r} >&2; exit {code}; fi
echo built
""")
    script.chmod(0o755)
    return folder / "calls"


@pytest.fixture
def pauses(monkeypatch) -> list:
    """engine.build's pauses between attempts, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(engine.time, "sleep", slept.append)
    return slept


def test_a_build_that_raced_an_image_removal_is_started_again_after_a_pause(tmp_path, pauses):
    calls = fake_buildah(tmp_path / "bin", failures=2, message=RACE)
    notes = []
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    result = engine.build("buildah", ["-t", "localhost/x:test", "."], env, note=notes.append)
    assert result.returncode == 0 and "built" in result.stdout
    assert calls.read_text().splitlines() == ["bud --format docker --isolation chroot --layers -t localhost/x:test ."] * 3
    assert len(notes) == 2 and "containers/buildah#5674" in notes[0] and "attempt 3 of 4" in notes[1]
    assert pauses == [engine.BUILD_RETRY_PAUSE_SECONDS] * 2 and engine.BUILD_RETRY_PAUSE_SECONDS > 0


def test_a_build_stops_at_its_first_other_failure_and_after_its_last_attempt(tmp_path, pauses):
    calls = fake_buildah(tmp_path / "other", failures=5, message="Error: building at STEP 2: exit status 1")
    result = engine.build("buildah", ["."], {"PATH": f"{tmp_path / 'other'}:/usr/bin:/bin"})
    assert result.returncode == 125 and len(calls.read_text().splitlines()) == 1
    calls = fake_buildah(tmp_path / "race", failures=5, message=RACE)
    result = engine.build("buildah", ["."], {"PATH": f"{tmp_path / 'race'}:/usr/bin:/bin"})
    assert result.returncode == 125 and RACE in result.stderr
    assert len(calls.read_text().splitlines()) == engine.BUILD_ATTEMPTS


@pytest.mark.parametrize("failures, message, attempts, code", [
    (1, RACE, 2, 0),  # raced once: built on the second attempt
    (9, RACE, 4, 125),  # raced every time: the fourth attempt's failure is the build's
    (9, "Error: building at STEP 2: exit status 1", 1, 125),  # any other failure: no second attempt
])
def test_images_sh_starts_a_raced_build_again_and_no_other(tmp_path, failures, message, attempts, code):
    """scripts/supply_chain/images.sh's own builds, by the same rule as engine.build, with a
    buildah that fails as 1.28's does (and a podman, so that the engine is podman's)."""
    bin_dir = tmp_path / "bin"
    calls = fake_buildah(bin_dir, failures, message)
    (bin_dir / "podman").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "podman").chmod(0o755)
    result = subprocess.run(["bash", "scripts/supply_chain/images.sh", "build", "tf-runtime-cpu"], cwd=REPO,
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
                                 "IMAGES_WORK": str(tmp_path / "work"), "TAG": "test", "TMPDIR": str(tmp_path),
                                 "BUILD_RETRY_PAUSE_SECONDS": "0"})
    assert result.returncode == code, result.stderr
    assert len(calls.read_text().splitlines()) == attempts
    assert result.stderr.count("building again in 0 s") == (attempts - 1)  # the pause it was given
    assert "STEP 1/2: FROM base" in result.stdout  # the build's output still streams to stdout
    assert not list(tmp_path.glob("images-build-*"))  # its kept stderr goes with it


STANDIN_DOCKER = REPO / "scripts/rehearsal/cloudbuild/standins/docker/docker"


@pytest.mark.parametrize("failures, message, attempts, code", [
    (2, RACE, 3, 0),  # raced twice: built on the third attempt
    (9, RACE, 4, 1),  # raced every time: the fourth attempt's failure is the step's
    (9, "Error: building at STEP 2: exit status 1", 1, 1),  # any other failure: no second attempt
])
def test_the_cloud_build_standin_docker_starts_a_raced_build_again_and_no_other(tmp_path, failures, message,
                                                                                 attempts, code):
    """The stand-in for gcr.io/cloud-builders/docker, the script itself, in front of a docker CLI
    that fails as one on podman 4.3's API socket does (the message, exit 1). The build's own stdout
    stays on stdout and its stderr on stderr."""
    calls = fake_buildah(tmp_path / "cli", failures, message, name="docker", code=1)
    result = subprocess.run(["bash", str(STANDIN_DOCKER), "build", "-t", "r/x:1", "."], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "BUILD_RETRY_PAUSE_SECONDS": "0",
                                 "REHEARSAL_DOCKER_CLI": str(tmp_path / "cli" / "docker")})
    assert result.returncode == code, result.stderr
    assert calls.read_text().splitlines() == ["build -t r/x:1 ."] * attempts
    assert result.stderr.count("building again in 0 s") == attempts - 1  # the pause it was given
    assert result.stdout.count("STEP 1/2: FROM base") == attempts and "layer not known" not in result.stdout
    assert ("built" in result.stdout) == (code == 0)
    assert not [path for path in tmp_path.iterdir() if path.name not in ("cli",)]  # its kept copy goes with it


def test_the_cloud_build_standin_docker_gives_a_build_from_stdin_one_attempt(tmp_path):
    """`docker build -` reads its context from stdin, which a second attempt could not read again."""
    calls = fake_buildah(tmp_path / "cli", 1, RACE, name="docker", code=1)
    result = subprocess.run(["bash", str(STANDIN_DOCKER), "build", "-t", "r/x:1", "-"], cwd=tmp_path, input="FROM x\n",
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "REHEARSAL_DOCKER_CLI": str(tmp_path / "cli" / "docker")})
    assert result.returncode == 1 and RACE in result.stderr
    assert len(calls.read_text().splitlines()) == 1
