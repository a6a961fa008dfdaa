"""scripts/supply_chain/refresh_bases.py on a copy of the repo's pinned files, with the registry's answers canned
(no registry is reachable here) and the lock step replaced by one that edits a lock."""

import re
import shutil

import pytest

from helpers import REPO
from scripts.supply_chain import refresh_bases
from scripts.supply_chain.refresh_bases import RefreshError, Resolved

NEW_PYTHON = "sha256:" + "a" * 64
NEW_BOOKWORM = "sha256:" + "b" * 64
NEW_CUDA = "sha256:" + "c" * 64
NEW_DOCKER = "sha256:" + "d" * 64
NEW_GCLOUD = "sha256:" + "e" * 64


@pytest.fixture
def repo(tmp_path):
    for path in refresh_bases.PINNED_FILES + refresh_bases.LOCKS:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, tmp_path / path)
    return tmp_path


def canned_registry(asked):
    def resolve(reference):
        asked.append(reference)
        answers = {"python:3.11-slim-trixie": Resolved(NEW_PYTHON, "3.11.16"),
                   "python:3.11-slim-bookworm": Resolved(NEW_BOOKWORM, "3.11.16"),
                   "nvidia/cuda:12.9.1-base-ubuntu24.04": Resolved(NEW_CUDA, None),
                   "gcr.io/cloud-builders/docker:latest": Resolved(NEW_DOCKER, None),
                   "gcr.io/google.com/cloudsdktool/google-cloud-cli:562.0.0-slim": Resolved(NEW_GCLOUD, None)}
        return answers[reference]
    return resolve


def pin(path, arg="BASE_IMAGE"):
    return re.search(rf"^ARG {arg}=(\S+)$", path.read_text(), re.M).group(1)


def test_python_pins_move_to_the_newest_patch_and_other_pins_to_their_tags_digest(repo, capsys):
    asked = []
    exit_code = refresh_bases.main([], repo=str(repo), resolver=canned_registry(asked), run_lock=lambda: None)
    assert exit_code == 0
    # patch tags are resolved through their minor's moving tag; other tags as they are
    assert sorted(asked) == ["gcr.io/cloud-builders/docker:latest", "gcr.io/google.com/cloudsdktool/google-cloud-cli:562.0.0-slim",
                             "nvidia/cuda:12.9.1-base-ubuntu24.04", "python:3.11-slim-bookworm", "python:3.11-slim-trixie"]
    assert pin(repo / "Dockerfile.cpu") == f"python:3.11.16-slim-trixie@{NEW_PYTHON}"
    assert pin(repo / "images/serving/Dockerfile") == f"python:3.11.16-slim-trixie@{NEW_PYTHON}"
    assert f"_PYTHON_IMAGE: python:3.11.16-slim-trixie@{NEW_PYTHON}" in (repo / "cloudbuild.yaml").read_text()
    assert pin(repo / "Dockerfile.gpu") == f"nvidia/cuda:12.9.1-base-ubuntu24.04@{NEW_CUDA}"
    # Cloud Build's step images move too, wherever they are repeated
    assert f"_DOCKER_IMAGE: gcr.io/cloud-builders/docker:latest@{NEW_DOCKER}" in (repo / "cloudbuild.yaml").read_text()
    assert f"_GCLOUD_IMAGE: gcr.io/google.com/cloudsdktool/google-cloud-cli:562.0.0-slim@{NEW_GCLOUD}" in (
        repo / "cloudbuild.yaml").read_text()
    assert (f"gcr.io/cloud-builders/docker:latest@{NEW_DOCKER}"
            in (repo / "images/triggers/refresh-bases.cloudbuild.yaml").read_text())
    assert pin(repo / "Dockerfile.gpu", "PYTHON_IMAGE") == f"python:3.11.16-slim-bookworm@{NEW_BOOKWORM}"
    printed = capsys.readouterr().out.splitlines()
    old_cpu = pin(REPO / "Dockerfile.cpu")
    assert f"base {old_cpu} -> python:3.11.16-slim-trixie@{NEW_PYTHON}" in printed
    assert "lock images/cpu/requirements.lock: unchanged" in printed


def test_without_a_registry_the_locks_still_refresh_and_the_missing_step_is_named(repo, capsys):
    def no_registry(reference):
        raise RefreshError(f"skopeo inspect --raw docker://docker.io/library/{reference}: no such host")

    def lock_moves_numpy():
        lock = repo / "images/cpu/requirements.lock"
        lock.write_text(re.sub(r"^numpy==\S+", "numpy==9.9.9", lock.read_text(), flags=re.M))

    before = {path: (repo / path).read_text() for path in refresh_bases.PINNED_FILES}
    exit_code = refresh_bases.main([], repo=str(repo), resolver=no_registry, run_lock=lock_moves_numpy)
    assert exit_code == 1
    assert {path: (repo / path).read_text() for path in refresh_bases.PINNED_FILES} == before
    out, err = capsys.readouterr()
    old_numpy = re.search(r"^numpy==(\S+)", (REPO / "images/cpu/requirements.lock").read_text(), re.M).group(1)
    assert f"lock images/cpu/requirements.lock: numpy {old_numpy} -> 9.9.9" in out.splitlines()
    assert "step 1 (base digests) needs a container registry" in err and "no such host" in err
    assert err.strip().splitlines()[-1] == ("refresh_bases.py: incomplete: the locks are refreshed, "
                                            "the base digests are not")


def test_lock_changes_name_moved_added_and_removed_packages():
    before = "a==1.0 \\\n    --hash=sha256:00\nb==2.0 \\\n    --hash=sha256:11\n"
    after = "a==1.1 \\\n    --hash=sha256:22\nc==3.0 \\\n    --hash=sha256:33\n"
    assert refresh_bases.lock_changes("x.lock", before, after) == "lock x.lock: a 1.0 -> 1.1, +c 3.0, -b 2.0"


@pytest.mark.parametrize("reference, qualified", [
    ("python:3.11-slim-trixie", "docker.io/library/python:3.11-slim-trixie"),
    ("nvidia/cuda:12.9.1-base-ubuntu24.04", "docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04"),
    ("gcr.io/google.com/cloudsdktool/google-cloud-cli:587.0.0", "gcr.io/google.com/cloudsdktool/google-cloud-cli:587.0.0"),
    ("localhost:5000/python:3.11", "localhost:5000/python:3.11"),
])
def test_references_are_qualified_as_skopeo_needs(reference, qualified):
    assert refresh_bases.qualified_reference(reference) == qualified


def test_a_pin_without_a_digest_is_refused():
    with pytest.raises(RefreshError, match="a pin must be name:tag@sha256:digest"):
        refresh_bases.refreshed_pin("python:3.11.15-slim-trixie", canned_registry([]))
