"""The Dockerfiles' bases are pinned by digest with a readable tag, and all three images name one
Python minor, which the locks are compiled for and each build asserts."""

import re

import pytest

from helpers import REPO

DOCKERFILES = ("Dockerfile.cpu", "Dockerfile.gpu", "images/serving/Dockerfile")


def args(dockerfile: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (REPO / dockerfile).read_text(), re.M))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_base_is_pinned_by_digest_beside_its_tag(dockerfile):
    text = (REPO / dockerfile).read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(re.fullmatch(r"\$\{(BASE_IMAGE|PYTHON_IMAGE)\}", f) for f in froms), froms
    for name in set(re.findall(r"^FROM \$\{(\w+)\}", text, re.M)):
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", args(dockerfile)[name]), (name, args(dockerfile)[name])


def test_one_python_minor_names_every_image_and_its_python_bases():
    minors = {dockerfile: args(dockerfile)["PYTHON_MINOR"] for dockerfile in DOCKERFILES}
    assert len(set(minors.values())) == 1, minors
    minor = minors["Dockerfile.cpu"]
    python_bases = [args(d)[name] for d in DOCKERFILES for name in ("BASE_IMAGE", "PYTHON_IMAGE")
                    if args(d).get(name, "").startswith("python:")]
    assert len(python_bases) == 3, python_bases
    assert all(re.match(rf"python:{re.escape(minor)}\.\d+-slim-\w+@", base) for base in python_bases), python_bases
    # the locks are compiled for it (scripts/supply_chain/lock.sh reads the ARG), and pyproject.toml allows it
    assert "PYTHON_MINOR=$(sed -n 's/^ARG PYTHON_MINOR=//p' Dockerfile.cpu)" in (REPO / "scripts/supply_chain/lock.sh").read_text()
    low, high = re.search(r'requires-python = ">=(\d+\.\d+),<(\d+\.\d+)"', (REPO / "pyproject.toml").read_text()).groups()
    as_tuple = lambda v: tuple(map(int, v.split(".")))  # noqa: E731
    assert as_tuple(low) <= as_tuple(minor) < as_tuple(high)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_each_build_applies_security_updates_then_makes_its_venv_with_the_shared_steps_then_its_sbom(dockerfile):
    text = (REPO / dockerfile).read_text()
    steps = (REPO / "images" / "image_steps.sh").read_text()
    assert "assert '%d.%d' % sys.version_info[:2] == '${PYTHON_MINOR:?" in steps  # each venv checks the minor
    upgrade = text.index("apt-get upgrade -y")
    venv = text.index("bash /tmp/image/image_steps.sh venv /tmp/image/requirements.lock")
    assert text.index("ARG OS_UPDATES=") < upgrade < venv
    last_lock = max(m.start() for m in re.finditer(r"^COPY images/(cpu|gpu|serving)/requirements\.lock", text, re.M))
    sbom = text.index("image_steps.sh sbom")
    assert last_lock < venv < sbom < text.index("COPY --chown=root:root ")  # the SBOM lists every package, code after
    assert pip_installs(text) == []  # every install goes through the shared steps


def pip_installs(text: str) -> list[str]:
    """Every pip install command in a Dockerfile or shell script, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines()
            if re.search(r"\bpip\b.*\binstall\b", line) and not line.lstrip().startswith("#")]


def test_every_pip_install_in_the_images_and_cloud_build_takes_wheels_only():
    files = [*DOCKERFILES, "images/cassava/Dockerfile", "images/image_steps.sh", "cloudbuild.yaml",
             "examples/fares/Dockerfile"]
    installs = {name: pip_installs((REPO / name).read_text()) for name in files}
    assert installs["images/image_steps.sh"] and installs["images/cassava/Dockerfile"] and installs["cloudbuild.yaml"]
    steps_options = re.search(r"^pip_options=\((.*)\)$", (REPO / "images/image_steps.sh").read_text(), re.M).group(1)
    assert "--only-binary=:all:" in steps_options.split() and "--require-hashes" in steps_options.split()
    for name, lines in installs.items():
        for line in lines:
            assert "--only-binary=:all:" in line or '"${pip_options[@]}"' in line, (name, line)
            assert "--no-build-isolation" not in line, (name, line)


def test_the_one_sdist_is_a_committed_wheel_pinned_by_its_hash():
    import hashlib

    wheels = sorted((REPO / "images" / "wheels").glob("*.whl"))
    assert [w.name for w in wheels] == ["promise-2.3-py3-none-any.whl"]
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    lock = (REPO / "images" / "cassava" / "requirements.lock").read_text()
    block = re.search(r"^promise==2\.3 \\\n((?:    --hash=sha256:\w+.*\n)+)", lock, re.M).group(1)
    assert re.findall(r"sha256:(\w+)", block) == [digest]
    assert "!images/wheels/*.whl" in (REPO / ".dockerignore").read_text()


@pytest.mark.parametrize("flavour", ["cpu", "gpu", "serving"])
def test_each_structure_test_expects_the_minor_the_dockerfiles_name(flavour):
    import yaml

    config = yaml.safe_load((REPO / "images" / flavour / "structure.yaml").read_text())
    test = next(t for t in config["commandTests"] if "PYTHON_MINOR" in t["name"])
    minor = args("Dockerfile.cpu")["PYTHON_MINOR"]
    assert test["expectedOutput"] == [f"^python {re.escape(minor)}\n$"]
