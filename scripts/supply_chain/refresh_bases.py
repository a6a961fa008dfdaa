#!/usr/bin/env python3
"""Moves the images' pins forward: the base images' digests, then the lock files; prints what changed.

    python3 scripts/supply_chain/refresh_bases.py            # both steps; commit the result after a CI run
    python3 scripts/supply_chain/refresh_bases.py --locks-only

Step 1, the bases (needs a container registry: run it on a workstation or in Cloud Build). Each
`ARG BASE_IMAGE=` / `ARG PYTHON_IMAGE=` pin in the Dockerfiles is `name:tag@sha256:digest`. A
python.org image's tag names a patch release (python:3.11.15-slim-trixie), and such a tag is
frozen once the next patch ships, so it is resolved through its minor's moving tag
(python:3.11-slim-trixie) and rewritten with the patch that tag now holds (the image's
PYTHON_VERSION). Any other tag (nvidia/cuda:12.9.1-base-ubuntu24.04) keeps its name and gets the
digest it points to now. Digests are those of the multi-platform index, as `docker pull` resolves
them. The new pin replaces the old one wherever it appears (the Dockerfiles and cloudbuild.yaml,
whose steps run on the CPU image's base). The registry is asked with the first of skopeo, crane
or `docker buildx imagetools` found on PATH, or the one REFRESH_TOOL names.

Step 2, the locks (needs PyPI): scripts/supply_chain/lock.sh, then each lock's added, removed and moved packages.

When step 1 cannot reach a registry, it says so in one line, leaves the bases as they are, runs
step 2 and exits 1: the refresh is then incomplete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from trainer import cli  # noqa: E402  (one-line flag errors, as every command of the project)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILES = ("Dockerfile.cpu", "Dockerfile.gpu", "images/serving/Dockerfile")
# Where pins are declared: the Dockerfiles' bases and Cloud Build's own step images.
DECLARING_FILES = DOCKERFILES + ("cloudbuild.yaml",)
# Where a pin may be repeated: every occurrence moves with it.
PINNED_FILES = DECLARING_FILES + ("images/triggers/refresh-bases.cloudbuild.yaml",)
LOCKS = ("images/cpu/requirements.lock", "images/gpu/requirements.lock", "images/serving/requirements.lock",
         "images/cassava/requirements.lock", "images/pip.lock", "images/cloudbuild-tools.lock",
         "images/sbom/requirements.lock", "requirements/dev.lock", "requirements/serving-runtime.lock",
         "requirements/uv.lock")
PIN_LINE = re.compile(r"^(?:ARG (?:BASE_IMAGE|PYTHON_IMAGE)=|  _\w+_IMAGE: )(\S+)$", re.M)
PIN = re.compile(r"^(?P<name>[^:@\s]+):(?P<tag>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
PATCH_TAG = re.compile(r"^(?P<minor>\d+\.\d+)\.\d+(?P<variant>-.+)?$")


class RefreshError(RuntimeError):
    """str() is one line."""


@dataclass(frozen=True)
class Resolved:
    digest: str
    python_version: str | None  # the PYTHON_VERSION of a python.org image, else None


def is_python_image(name: str) -> bool:
    return name in ("python", "library/python", "docker.io/library/python")


def moving_tag(name: str, tag: str) -> str:
    """The tag to resolve: a python.org image's minor-level tag, any other tag as it is."""
    match = PATCH_TAG.match(tag)
    if is_python_image(name) and match:
        return match.group("minor") + (match.group("variant") or "")
    return tag


def refreshed_pin(pin: str, resolve: Callable[[str], Resolved]) -> str:
    match = PIN.match(pin)
    if not match:
        raise RefreshError(f"{pin}: a pin must be name:tag@sha256:digest")
    name, tag = match.group("name"), match.group("tag")
    resolved = resolve(f"{name}:{moving_tag(name, tag)}")
    if is_python_image(name) and PATCH_TAG.match(tag):
        if not resolved.python_version:
            raise RefreshError(f"{name}:{moving_tag(name, tag)} has no PYTHON_VERSION in its configuration")
        tag = resolved.python_version + (PATCH_TAG.match(tag).group("variant") or "")
    return f"{name}:{tag}@{resolved.digest}"


def refresh_bases(repo: str, resolve: Callable[[str], Resolved]) -> list[str]:
    """Rewrites every pin in PINNED_FILES; returns one line per pin that moved."""
    pins = []
    for path in DECLARING_FILES:
        full = os.path.join(repo, path)
        if os.path.exists(full):
            with open(full) as text:
                pins += [p for p in PIN_LINE.findall(text.read()) if p not in pins]
    if not pins:
        raise RefreshError("no ARG BASE_IMAGE= or ARG PYTHON_IMAGE= pin in the Dockerfiles")
    moves = {pin: refreshed_pin(pin, resolve) for pin in pins}
    changed = []
    for path in PINNED_FILES:
        full = os.path.join(repo, path)
        if not os.path.exists(full):
            continue
        with open(full) as text:
            before = text.read()
        after = before
        for old, new in moves.items():
            after = after.replace(old, new)
        if after != before:
            with open(full, "w") as text:
                text.write(after)
    for old, new in moves.items():
        changed.append(f"base {old} -> {new}" if old != new else f"base {old} unchanged")
    return changed


def _run(command: list[str]) -> bytes:
    try:
        result = subprocess.run(command, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise RefreshError(f"{' '.join(command)}: no answer in 120 s") from None
    if result.returncode != 0:
        detail = (result.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise RefreshError(f"{' '.join(command)}: {detail}")
    return result.stdout


def _python_version(config: dict) -> str | None:
    for entry in (config.get("config") or config.get("Config") or {}).get("Env") or []:
        if entry.startswith("PYTHON_VERSION="):
            return entry.split("=", 1)[1]
    return None


def qualified_reference(reference: str) -> str:
    """docker.io's implicit host and library/ namespace made explicit, as skopeo needs them."""
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if slash else f"docker.io/library/{reference}"


def registry_resolver(tool: str) -> Callable[[str], Resolved]:
    """Asks the registry through `tool` (skopeo, crane or docker) for a reference's index digest
    and, for linux/amd64, its configuration."""
    def resolve(reference: str) -> Resolved:
        if tool == "skopeo":
            qualified = qualified_reference(reference)
            raw = _run(["skopeo", "inspect", "--raw", f"docker://{qualified}"])
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            config = json.loads(_run(["skopeo", "--override-os", "linux", "--override-arch", "amd64",
                                      "inspect", "--config", f"docker://{qualified}@{digest}"]))
        elif tool == "crane":
            digest = _run(["crane", "digest", reference]).decode().strip()
            config = json.loads(_run(["crane", "config", "--platform", "linux/amd64", f"{reference}@{digest}"]))
        else:
            manifest = json.loads(_run(["docker", "buildx", "imagetools", "inspect", reference,
                                        "--format", "{{json .Manifest}}"]))
            digest = manifest["digest"]
            config = json.loads(_run(["docker", "buildx", "imagetools", "inspect", f"{reference}@{digest}",
                                      "--format", "{{json .Image}}"]))
            config = config.get("linux/amd64", config)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RefreshError(f"{tool} answered {digest!r} for the digest of {reference}")
        return Resolved(digest, _python_version(config))
    return resolve


def choose_tool() -> str:
    wanted = os.environ.get("REFRESH_TOOL")
    for tool in ([wanted] if wanted else ["skopeo", "crane", "docker"]):
        if shutil.which(tool):
            return tool
    raise RefreshError(f"none of {wanted or 'skopeo, crane, docker'} is on PATH")


def locked_versions(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M)}


def lock_changes(path: str, before: str, after: str) -> str:
    old, new = locked_versions(before), locked_versions(after)
    moves = [f"{n} {old[n]} -> {new[n]}" for n in sorted(old.keys() & new.keys()) if old[n] != new[n]]
    moves += [f"+{n} {new[n]}" for n in sorted(new.keys() - old.keys())]
    moves += [f"-{n} {old[n]}" for n in sorted(old.keys() - new.keys())]
    return f"lock {path}: " + (", ".join(moves) if moves else "unchanged")


def refresh_locks(repo: str, run_lock: Callable[[], None]) -> list[str]:
    def read(path):
        full = os.path.join(repo, path)
        return open(full).read() if os.path.exists(full) else ""
    before = {path: read(path) for path in LOCKS}
    run_lock()
    return [lock_changes(path, before[path], read(path)) for path in LOCKS]


def run_lock_script() -> None:
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "supply_chain", "lock.sh")], cwd=REPO,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RefreshError("scripts/supply_chain/lock.sh failed: " + ((result.stderr.strip().splitlines() or ["no message"])[-1]))


def main(argv: list[str] | None = None, repo: str = REPO, resolver: Callable[[str], Resolved] | None = None,
         run_lock: Callable[[], None] = run_lock_script) -> int:
    parser = cli.OneLineParser(prog="refresh_bases.py", description=__doc__.split("\n")[0])
    parser.add_argument("--locks-only", action="store_true", help="skip step 1 (the bases' digests)")
    args = parser.parse_args(argv)
    incomplete = False
    if not args.locks_only:
        try:
            for line in refresh_bases(repo, resolver or registry_resolver(choose_tool())):
                print(line)
        except RefreshError as error:
            incomplete = True
            print(f"refresh_bases.py: step 1 (base digests) needs a container registry and could not run here: "
                  f"{error}. Bases left as they are; run it on a workstation or in Cloud Build "
                  "(docs/images.md#refreshing-the-pins).", file=sys.stderr)
    try:
        for line in refresh_locks(repo, run_lock):
            print(line)
    except RefreshError as error:
        print(f"refresh_bases.py: step 2 (locks) failed: {error}", file=sys.stderr)
        return 1
    if incomplete:
        print("refresh_bases.py: incomplete: the locks are refreshed, the base digests are not", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
