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
def test_each_build_asserts_the_minor_and_applies_security_updates_before_installing(dockerfile):
    text = (REPO / dockerfile).read_text()
    assert "assert '%d.%d' % sys.version_info[:2] == '${PYTHON_MINOR}'" in text
    upgrade = text.index("apt-get upgrade -y")
    assert text.index("ARG OS_UPDATES=") < upgrade < text.index("pip install --no-deps --require-hashes")
    last_lock = max(m.start() for m in re.finditer(r"^COPY images/(cpu|gpu|serving)/requirements\.lock", text, re.M))
    assert text.index("/opt/sbom/python.cdx.json") > last_lock  # the SBOM lists every installed package


@pytest.mark.parametrize("flavour", ["cpu", "gpu", "serving"])
def test_each_structure_test_expects_the_minor_the_dockerfiles_name(flavour):
    import yaml

    config = yaml.safe_load((REPO / "images" / flavour / "structure.yaml").read_text())
    test = next(t for t in config["commandTests"] if "PYTHON_MINOR" in t["name"])
    minor = args("Dockerfile.cpu")["PYTHON_MINOR"]
    assert test["expectedOutput"] == [f"^python {re.escape(minor)}\n$"]
