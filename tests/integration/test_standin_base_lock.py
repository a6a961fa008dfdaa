"""scripts/supply_chain/standin_base.sh builds one stand-in base at a time: scripts/test.sh's
background builds, the container tier's fixture and a Cloud Build rehearsal's stand-ins all ask for
it, and a build removes and refills the one $IMAGES_WORK/standin-rootfs. A caller that waited for
another's build takes the image that build made.

The engine, builder and debootstrap are stand-ins on PATH (no image is built): the script's own
lock and what it does after waiting are what is checked."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time

from helpers import REPO

FAKE_PODMAN = """#!/bin/sh
# `image exists` / `image inspect` answer from a marker file: the image "is there" once it exists.
echo "$*" >> "$CALLS"
case "$1 $2" in
  "image exists"|"image inspect") [ -e "$MADE" ] ;;
  *) exit 0 ;;
esac
"""
RECORDS = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
exit 1
"""


def fake_tools(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"podman": FAKE_PODMAN, "buildah": "#!/bin/sh\nexit 0\n", "docker": "#!/bin/sh\nexit 1\n",
                       "debootstrap": RECORDS}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IMAGES_WORK": str(work),
           "CALLS": str(tmp_path / "calls"), "MADE": str(tmp_path / "made")}
    return work, env


def test_a_caller_waits_for_the_build_under_way_and_takes_its_image(tmp_path):
    work, env = fake_tools(tmp_path)
    with open(work / "standin-base.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another caller's build is under way
        waiting = subprocess.Popen(["bash", "scripts/supply_chain/standin_base.sh"], cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Until it asks for the lock: its first `image exists` is answered before it.
        deadline = time.monotonic() + 60
        while not (tmp_path / "calls").exists() and waiting.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert waiting.poll() is None, waiting.communicate()  # it waits; it did not start a build of its own
        (tmp_path / "made").touch()  # the other build made the image, and lets go of the lock
    stdout, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, stderr
    assert stdout.strip().startswith("localhost/standin-python:"), stdout
    calls = (tmp_path / "calls").read_text()
    assert "debootstrap" not in calls and "import" not in calls, calls  # nothing built twice


def test_with_no_build_under_way_it_builds(tmp_path):
    """The lock is not held: the script goes on to build (here, to the stand-in debootstrap, which fails)."""
    work, env = fake_tools(tmp_path)
    result = subprocess.run(["bash", "scripts/supply_chain/standin_base.sh"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    calls = (tmp_path / "calls").read_text()
    assert result.returncode != 0 and "debootstrap --variant=minbase" in calls, (result.stderr, calls)
