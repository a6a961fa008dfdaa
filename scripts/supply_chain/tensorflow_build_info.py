#!/usr/bin/env python3
"""Writes images/gpu/tensorflow-build-info.json: the build info of the TensorFlow wheel the GPU
image installs, read from the wheel itself.

    python scripts/supply_chain/tensorflow_build_info.py            # download the locked wheel, write the file
    python scripts/supply_chain/tensorflow_build_info.py --check    # exit 1 if the file differs from the wheel
    python scripts/supply_chain/tensorflow_build_info.py --wheel tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl

The wheel's tensorflow/python/platform/build_info.py is what `tf.sysconfig.get_build_info()`
returns inside the image: above all `cuda_compute_capabilities`, the GPU architectures its kernels
were compiled for (sm_XY: machine code; compute_XY: PTX the driver compiles at start). The
development environment has tensorflow-cpu, whose build info has no such list, so this file
carries it for scripts/jobspec/accelerators.py. Run it after changing the tensorflow pin in
images/gpu/requirements.lock (tests/unit/test_accelerators.py fails until then); the container
tier checks the file against the built GPU image.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from trainer import cli  # noqa: E402  (one-line flag errors, as every command of the project)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCK = os.path.join(REPO, "images", "gpu", "requirements.lock")
OUTPUT = os.path.join(REPO, "images", "gpu", "tensorflow-build-info.json")
BUILD_INFO_MEMBER = "tensorflow/python/platform/build_info.py"
# The image's interpreter (Dockerfile.gpu's PYTHON) and every manylinux tag its glibc (2.39,
# Ubuntu 24.04) accepts, so pip picks the wheel the image build picks.
PYTHON_VERSION = "3.11"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)]


class BuildInfoError(RuntimeError):
    """str() is one line."""


def locked_tensorflow(lock_text: str) -> tuple[str, set[str]]:
    """(version, sha256 hashes) of `tensorflow==` in a hash-pinned requirements lock."""
    match = re.search(r"^tensorflow==(\S+)((?:\s*\\\n\s*--hash=sha256:[0-9a-f]{64})+)", lock_text, re.M)
    if not match:
        raise BuildInfoError("the lock pins no tensorflow== with hashes")
    return match.group(1), set(re.findall(r"sha256:([0-9a-f]{64})", match.group(2)))


def wheel_build_info(wheel_path: str) -> dict:
    """The `build_info` dict a TensorFlow wheel's build_info.py defines, read without importing it."""
    with zipfile.ZipFile(wheel_path) as wheel:
        try:
            source = wheel.read(BUILD_INFO_MEMBER).decode()
        except KeyError:
            raise BuildInfoError(f"{os.path.basename(wheel_path)} has no {BUILD_INFO_MEMBER}") from None
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "build_info" for t in node.targets)
                and isinstance(node.value, ast.Call) and node.value.args):
            return dict(ast.literal_eval(node.value.args[0]))
    raise BuildInfoError(f"{BUILD_INFO_MEMBER} defines no build_info = OrderedDict([...])")


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(wheel_path: str, version: str, hashes: set[str]) -> dict:
    """The file's content for a wheel that must be the locked one."""
    digest = sha256_of(wheel_path)
    if digest not in hashes:
        raise BuildInfoError(f"{os.path.basename(wheel_path)} (sha256 {digest}) is not a wheel the lock allows")
    info = wheel_build_info(wheel_path)
    if not info.get("is_cuda_build"):
        raise BuildInfoError(f"{os.path.basename(wheel_path)} is not a CUDA build")
    return {"tensorflow": version, "wheel": os.path.basename(wheel_path), "sha256": digest, "build_info": info}


def download(version: str, directory: str) -> str:
    command = [sys.executable, "-m", "pip", "download", f"tensorflow=={version}", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp", "--dest", directory, "--quiet"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildInfoError(f"pip download tensorflow=={version} failed: {last}")
    [wheel] = [name for name in os.listdir(directory) if name.endswith(".whl")]
    return os.path.join(directory, wheel)


def render(content: dict) -> str:
    return json.dumps(content, indent=2, sort_keys=True) + "\n"


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="scripts/supply_chain/tensorflow_build_info.py", description=__doc__.split("\n")[0])
    parser.add_argument("--lock", default=LOCK, help="the GPU image's hash-pinned lock")
    parser.add_argument("--wheel", default=None, help="a downloaded tensorflow wheel (default: pip download the locked one)")
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="compare with --output instead of writing it")
    args = parser.parse_args(argv)
    try:
        with open(args.lock) as handle:
            version, hashes = locked_tensorflow(handle.read())
        with tempfile.TemporaryDirectory() as directory:
            content = render(describe(args.wheel or download(version, directory), version, hashes))
    except (BuildInfoError, OSError, zipfile.BadZipFile) as error:
        print(f"tensorflow_build_info: error: {error}", file=sys.stderr)
        return 1
    if args.check:
        with open(args.output) as handle:
            if handle.read() != content:
                print(f"tensorflow_build_info: error: {args.output} differs from the locked wheel's build info; "
                      "run scripts/supply_chain/tensorflow_build_info.py", file=sys.stderr)
                return 1
        print(f"{args.output} matches tensorflow=={version}")
        return 0
    with open(args.output, "w") as handle:
        handle.write(content)
    print(f"wrote {args.output} (tensorflow=={version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
