"""Writes the CycloneDX 1.5 SBOM of every Python component on an image's disk, to stdout.

    python3 python_sbom.py / > /opt/sbom/python.cdx.json

What a scanner finds by walking the filesystem, not what one environment's importlib shows:
Trivy's and Grype's Python catalogers read every `*.dist-info/METADATA` and `*.egg-info/PKG-INFO`
wherever it lies, so this lists the venv's distributions, /usr/local's, those vendored inside other
packages (setuptools/_vendor/*.dist-info), every wheel file lying on disk (ensurepip's bundled
wheels, for one) and each CPython interpreter binary, with its version (scanners match it by its
CPE). Each component says where it was found (property `location`). Standard library only: every
image's build runs it on the image's own interpreter, after its last package is installed.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import subprocess
import sys

SKIPPED = ("/proc", "/sys", "/dev", "/run")
INTERPRETER = re.compile(r"^python\d+\.\d+$")
# A wheel's file name: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl (PEP 427).
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def metadata(path: str) -> tuple[str, str] | None:
    """(Name, Version) from a dist-info's METADATA or an egg-info's PKG-INFO (a folder or a file)."""
    for candidate in (os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO"), path):
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8", errors="replace") as text:
                headers = email.parser.HeaderParser().parse(text)
            if headers.get("Name") and headers.get("Version"):
                return headers["Name"], headers["Version"]
    return None


def library(name: str, version: str, location: str) -> dict:
    purl = f"pkg:pypi/{normalized(name)}@{version}"
    return {"type": "library", "bom-ref": f"{purl}?location={location}", "name": name, "version": version,
            "purl": purl, "properties": [{"name": "location", "value": location}]}


def interpreter(path: str) -> dict | None:
    try:
        version = subprocess.run([path, "-I", "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"type": "application", "bom-ref": f"pkg:generic/cpython@{version}?location={path}", "name": "cpython",
            "version": version, "purl": f"pkg:generic/cpython@{version}",
            "cpe": f"cpe:2.3:a:python:python:{version}:*:*:*:*:*:*:*",
            "properties": [{"name": "location", "value": path}]}


def components(root: str) -> list[dict]:
    found = []
    for directory, subdirectories, files in os.walk(root):
        if directory in SKIPPED:
            subdirectories[:] = []
            continue
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            if name.endswith((".dist-info", ".egg-info")):
                named = metadata(path)
                if named:
                    found.append(library(*named, path))
            elif name.endswith(".whl") and WHEEL.match(name) and os.path.isfile(path):
                match = WHEEL.match(name)
                found.append(library(match.group("name"), match.group("version"), path))
            elif (INTERPRETER.match(name) and os.path.basename(directory) == "bin" and os.path.isfile(path)
                  and not os.path.islink(path) and os.access(path, os.X_OK)):
                found.append(interpreter(path))
        subdirectories[:] = [d for d in subdirectories if not os.path.islink(os.path.join(directory, d))]
    return sorted((c for c in found if c), key=lambda c: (normalized(c["name"]), c["version"], c["bom-ref"]))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("python_sbom.py: usage: python_sbom.py ROOT (a directory)", file=sys.stderr)
        return 2
    document = {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
                "metadata": {"tools": {"components": [{"type": "application", "name": "python_sbom.py"}]}},
                "components": components(argv[0])}
    json.dump(document, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
