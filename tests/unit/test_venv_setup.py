"""scripts/setup_venv.sh: uv, pinned by hash in a lock of its own, puts each venv together from its
hash-pinned lock, bytecode compiled; lock.sh compiles the locks with the same uv, by the same hashes."""

import importlib.metadata
import re

from helpers import REPO


def uv_pin() -> str:
    return re.search(r"^uv==(\S+)$", (REPO / "requirements" / "uv.in").read_text(), re.M).group(1)


def test_the_uv_lock_pins_uv_in_by_hash_and_nothing_else():
    text = (REPO / "requirements" / "uv.lock").read_text()
    assert re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M) == [("uv", uv_pin())]
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", text)) >= 1


def test_setup_venv_installs_uv_from_its_lock_and_the_venv_with_hashes_and_bytecode():
    script = (REPO / "scripts" / "setup_venv.sh").read_text()
    pip = re.search(r'"\$venv/bin/python" -m pip install .*?-r (\S+)', script, re.S)
    assert pip and "--require-hashes" in pip.group(0) and pip.group(1) == "requirements/uv.lock", pip
    uv = re.search(r'"\$venv/bin/uv" pip install .*?-r "\$lock"', script, re.S)
    assert uv and all(flag in uv.group(0) for flag in ("--require-hashes", "--no-deps", "--compile-bytecode")), uv
    # A venv made before, or by another installer, is not taken as this one.
    assert 'cat "$lock" requirements/uv.lock | sha256sum' in script


def test_lock_sh_compiles_with_the_uv_its_lock_pins_and_compiles_that_lock():
    """lock.sh puts pinned_uv.sh's uv first on PATH before its first `uv pip compile`
    (tests/integration/test_pinned_uv.py runs pinned_uv.sh)."""
    script = (REPO / "scripts" / "supply_chain" / "lock.sh").read_text()
    pinned = script.index('uv=$(bash scripts/supply_chain/pinned_uv.sh "$tools/uv")\nPATH="$(dirname "$uv"):$PATH"')
    assert pinned < script.index("uv pip compile")
    assert not re.search(r"pip install[^\n]*uv==", script)  # no uv fetched by name alone
    assert "standalone requirements/uv.in requirements/uv.lock" in script


def test_the_venv_running_these_tests_has_the_pinned_uv():
    assert importlib.metadata.version("uv") == uv_pin()
