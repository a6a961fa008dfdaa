"""What a security team checks in each built image: the SBOM against what is really on disk (every
Python distribution wherever it lies, every wheel file, the interpreter, every dpkg package), no
packaging tool in a version with a known advisory, the locks installed as locked, the interpreter's
minor, a non-root user and no setuid or setgid file; and that CI's stand-in base lays Python out as
the production bases do, so that these tests see what production ships."""

from __future__ import annotations

import json
import re

import pytest
from packaging.version import Version

from containers import sh
from helpers import REPO

# They only read the images: beside the rehearsals, on any worker (tests/parallel.py).
pytestmark = pytest.mark.no_rehearsal

FIXTURES = {"tf-runtime-cpu": "runtime_cpu_image", "tf-runtime-gpu": "runtime_gpu_image",
            "cassava-trainer-cpu": "cpu_image", "tf-predictor-cpu": "serving_image"}
LOCKS = {"tf-runtime-cpu": ["images/pip.lock", "images/cpu/requirements.lock"],
         "tf-runtime-gpu": ["images/pip.lock", "images/gpu/requirements.lock"],
         "cassava-trainer-cpu": ["images/pip.lock", "images/cpu/requirements.lock", "images/cassava/requirements.lock"],
         "tf-predictor-cpu": ["images/pip.lock", "images/serving/requirements.lock"]}
# Locked, installed, then deleted whole by the dependency layer (TensorFlow's build-time bindings
# generator, which training never loads): rightly on no SBOM.
DELETED_AFTER_INSTALL = {"libclang"}
# The lowest release of each packaging tool that no advisory names (docs/images.md lists them):
# pip 26.2 fixed CVE-2026-13346 (PYSEC-2026-3721, after CVE-2026-8643 in 26.1.2); setuptools 78.1.1
# CVE-2025-47273; wheel 0.46.2 CVE-2026-24049, also when vendored inside setuptools.
NEWEST_ADVISORY_FIXED_IN = {"pip": "26.2", "setuptools": "78.1.1", "wheel": "0.46.2"}

# What is on the image's disk, found independently of the SBOM's generator: `find` for every
# distribution's metadata, wheel file and interpreter binary; importlib.metadata for versions.
ON_DISK = r"""
import email.parser, json, os, platform, subprocess
from importlib.metadata import PathDistribution
from pathlib import Path
listed = subprocess.run(["find", "/", "-xdev", "(", "-name", "*.dist-info", "-o", "-name", "*.egg-info", "-o",
                         "-name", "*.whl", "-o", "-regex", ".*/bin/python[0-9]+\\.[0-9]+", ")", "-print"],
                        capture_output=True, text=True, check=True).stdout.split()
found = []
for path in listed:
    if path.endswith(".whl"):
        name, version = os.path.basename(path).split("-")[:2]
    elif path.endswith((".dist-info", ".egg-info")):
        if os.path.isdir(path):
            distribution = PathDistribution(Path(path))
            name, version = distribution.metadata["Name"], distribution.version
        else:
            headers = email.parser.HeaderParser().parse(open(path))
            name, version = headers["Name"], headers["Version"]
    elif os.path.islink(path) or not os.access(path, os.X_OK):
        continue
    else:
        version = subprocess.run([path, "-I", "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        name = "cpython"
    found.append([name, version, path])
print(json.dumps(found))
"""


def pep503(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run_in(engine, image: str, *command: str, user: str = "0") -> str:
    tool, env = engine
    return sh(tool, "run", "--rm", "--user", user, "--entrypoint", command[0], image, *command[1:], env=env).stdout


def sbom_components(engine, image: str) -> list[dict]:
    document = json.loads(run_in(engine, image, "cat", "/opt/sbom/python.cdx.json"))
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.5"
    return document["components"]


def location(component: dict) -> str:
    return next(p["value"] for p in component["properties"] if p["name"] == "location")


@pytest.mark.parametrize("image", list(FIXTURES))
def test_the_python_sbom_lists_exactly_what_is_on_disk(image, request, engine):
    """Every distribution's metadata, wheel file and interpreter on the image's disk, in the venv,
    in /usr/local or vendored inside another package, is in the SBOM at its version and place, and
    the SBOM lists nothing that is not there."""
    built = request.getfixturevalue(FIXTURES[image])
    on_disk = {(pep503(n), v, p) for n, v, p in json.loads(run_in(engine, built, "/usr/local/bin/python3", "-I", "-c",
                                                                 ON_DISK))}
    listed = {(pep503(c["name"]), c["version"], location(c)) for c in sbom_components(engine, built)}
    assert len(on_disk) > 30
    assert {"not in the SBOM": on_disk - listed, "not on disk": listed - on_disk} == {
        "not in the SBOM": set(), "not on disk": set()}
    # what a scanner would report beyond the venv: the interpreter, by its CPE
    interpreters = {(v, p) for n, v, p in listed if n == "cpython"}
    minor = re.search(r"^ARG PYTHON_MINOR=(\S+)$", (REPO / "Dockerfile.cpu").read_text(), re.M).group(1)
    assert {p for _, p in interpreters} == {f"/usr/local/bin/python{minor}"}, interpreters


@pytest.mark.parametrize("image", list(FIXTURES))
def test_no_packaging_tool_in_a_version_with_a_known_advisory_and_no_wheel_file(image, request, engine):
    components = sbom_components(engine, request.getfixturevalue(FIXTURES[image]))
    old = [(c["name"], c["version"], location(c)) for c in components
           if pep503(c["name"]) in NEWEST_ADVISORY_FIXED_IN
           and Version(c["version"]) < Version(NEWEST_ADVISORY_FIXED_IN[pep503(c["name"])])]
    assert old == []
    assert [location(c) for c in components if location(c).endswith(".whl")] == []  # ensurepip's are gone
    assert not [location(c) for c in components if location(c).startswith("/usr/local/lib/")]  # base's tools gone
    pips = [(c["version"], location(c)) for c in components if c["name"] == "pip"]
    locked = re.search(r"^pip==(\S+)", (REPO / "images" / "pip.lock").read_text(), re.M).group(1)
    assert [v for v, _ in pips] == [locked] and pips[0][1].startswith("/opt/venv/"), pips


@pytest.mark.parametrize("image", list(FIXTURES))
def test_the_venv_holds_every_locked_package_at_its_locked_version(image, request, engine):
    components = sbom_components(engine, request.getfixturevalue(FIXTURES[image]))
    in_venv = {pep503(c["name"]): c["version"] for c in components
               if re.match(r"/opt/venv/lib/python[\d.]+/site-packages/[^/]+$", location(c))}
    locked = {}
    for lock in LOCKS[image]:
        locked.update({pep503(n): v for n, v in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", (REPO / lock).read_text(), re.M)})
    for name in DELETED_AFTER_INSTALL & set(locked):
        del locked[name]
    assert len(locked) > 30
    assert {n: (v, in_venv.get(n)) for n, v in locked.items() if in_venv.get(n) != v} == {}
    assert set(in_venv) - set(locked) == set()


@pytest.mark.parametrize("image", list(FIXTURES))
def test_the_os_sbom_lists_every_dpkg_package_at_its_version(image, request, engine):
    built = request.getfixturevalue(FIXTURES[image])
    os_sbom = json.loads(run_in(engine, built, "cat", "/opt/sbom/os.spdx.json"))
    assert os_sbom["spdxVersion"] == "SPDX-2.3"
    os_listed = {p["name"]: p.get("versionInfo") for p in os_sbom["packages"]}
    installed = dict(line.split(None, 2)[1:] for line in run_in(
        engine, built, "dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\n").splitlines()
        if line.startswith("ii "))
    assert len(installed) > 50
    assert {p: v for p, v in installed.items() if os_listed.get(p) != v} == {}
    assert run_in(engine, built, "bash", "-c", "ls /tmp; command -v distro2sbom || true").strip() == ""


@pytest.mark.parametrize("image", list(FIXTURES))
def test_a_non_root_user_by_default_and_no_setuid_or_setgid_file(image, request, engine):
    tool, env = engine
    built = request.getfixturevalue(FIXTURES[image])
    user = sh(tool, "image", "inspect", "--format", "{{.Config.User}}", built, env=env).stdout.strip()
    assert user == "1000"  # numeric, so Kubernetes' runAsNonRoot can check it
    assert sh(tool, "run", "--rm", "--entrypoint", "id", built, "-u", env=env).stdout.strip() == "1000"
    # as root, to see every file
    assert run_in(engine, built, "find", "/", "-xdev", "-type", "f", "-perm", "/6000").strip() == ""


@pytest.mark.parametrize("image", list(FIXTURES))
def test_the_interpreter_is_the_python_minor_the_dockerfiles_name(image, request, engine):
    """CI builds on a stand-in base: its interpreter must be production's minor, the one ARG
    PYTHON_MINOR names (the locks are compiled for it)."""
    built = request.getfixturevalue(FIXTURES[image])
    minor = re.search(r"^ARG PYTHON_MINOR=(\S+)$", (REPO / "Dockerfile.cpu").read_text(), re.M).group(1)
    running = run_in(engine, built, "python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])").strip()
    assert running == minor


def test_the_stand_in_base_lays_python_out_as_the_production_bases_do(engine, base_image):
    """docker-library's python images: python.org's interpreter in /usr/local, pip and setuptools in
    its site-packages, ensurepip's wheels beside it, no distribution python3. What the Dockerfiles
    strip from the production bases is in the stand-in too, so the tests above see it go."""
    script = ("import importlib.util as u, glob, shutil, sys; "
              "print(sys.executable, sys.prefix, *[m for m in ('pip', 'setuptools') if u.find_spec(m)], "
              "len(glob.glob(sys.prefix + '/lib/python3.*/ensurepip/_bundled/*.whl')), shutil.which('python3'))")
    printed = run_in(engine, base_image, "/usr/local/bin/python3", "-I", "-c", script).split()
    assert printed[:4] == ["/usr/local/bin/python3", "/usr/local", "pip", "setuptools"], printed
    assert int(printed[4]) >= 2 and printed[5] == "/usr/local/bin/python3", printed
    assert run_in(engine, base_image, "bash", "-c", "ls /usr/bin/python3* 2>/dev/null; dpkg -l 'python3*' 2>/dev/null "
                  "| grep ^ii || true").strip() == ""
