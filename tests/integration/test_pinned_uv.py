"""scripts/supply_chain/pinned_uv.sh, the uv lock.sh compiles every lock with: the uv on PATH when
it is requirements/uv.lock's version, else that version installed by the lock's hashes, and a
lock whose hashes the download does not match is one line and exit 1 with no uv installed."""

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SCRIPT = REPO / "scripts" / "supply_chain" / "pinned_uv.sh"
LOCK = REPO / "requirements" / "uv.lock"
PIN = re.search(r"^uv==(\S+) ", LOCK.read_text(), re.M).group(1)


def run(tmp_path: Path, *args: str, uv_on_path: str | None) -> subprocess.CompletedProcess:
    """The script with PATH holding only python3 (this venv's, which has pip) and, where given,
    a `uv` whose --version prints `uv_on_path`."""
    bin_dir = tmp_path / "path"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").unlink(missing_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    if uv_on_path is not None:
        (bin_dir / "uv").write_text(f"#!/bin/sh\necho '{uv_on_path}'\n")
        (bin_dir / "uv").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_a_uv_of_another_version_on_path_is_passed_over_for_the_pinned_one_installed_by_hash(tmp_path):
    result = run(tmp_path, str(tmp_path / "tools"), uv_on_path="uv 0.1.0")
    assert result.returncode == 0, result.stderr
    uv = Path(result.stdout.strip())
    assert uv == tmp_path / "tools" / "bin" / "uv"
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert version.split()[:2] == ["uv", PIN]


def test_the_pinned_uv_on_path_is_taken_as_it_is(tmp_path):
    result = run(tmp_path, str(tmp_path / "tools"), uv_on_path=f"uv {PIN} (x86_64-unknown-linux-gnu)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "path" / "uv")
    assert not (tmp_path / "tools").exists()  # nothing installed


def test_a_lock_whose_hashes_the_wheel_does_not_match_installs_nothing_and_says_so(tmp_path):
    lock = tmp_path / "uv.lock"
    lock.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, LOCK.read_text()))
    result = run(tmp_path, str(tmp_path / "tools"), str(lock), uv_on_path=None)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pinned_uv.sh: pip could not install uv {PIN} by the hashes"), lines
    assert not (tmp_path / "tools" / "bin" / "uv").exists()


def test_without_a_folder_it_shows_its_usage_and_exits_2(tmp_path):
    result = run(tmp_path, uv_on_path=None)
    assert result.returncode == 2 and "pinned_uv.sh DIR [LOCK]" in result.stderr and not result.stdout
