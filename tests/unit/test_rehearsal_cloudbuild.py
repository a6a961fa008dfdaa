"""The Cloud Build rehearsal's rules, as pure functions (scripts/rehearsal/cloudbuild/): the config
against Cloud Build's schema and checks, substitutions as Cloud Build applies them (built-ins,
trigger-only ones, `_KEY` defaults and overrides, `$$`, dynamic substitutions' expansions, its own
refusals), the waitFor graph, a trigger's build."""

import json

import pytest
import yaml

from helpers import REPO
from scripts.rehearsal.cloudbuild import config, graph, substitutions as subst, trigger as triggers

BUILD_ID = "0b6d9a4e-3f1c-4a55-9d57-2f1f0a3c9e11"


def built(trigger_values=None):
    return subst.built_ins(project_id="my-project", build_id=BUILD_ID, project_number="000000000000",
                           location="global", trigger=trigger_values)


def build_of(document, given=None, trigger_values=None):
    return config.build_of(document, given or {}, built(trigger_values), trigger=trigger_values is not None)


def echo_config(*args, substitutions=None, options=None, **step):
    document = {"steps": [{"name": "ubuntu", "args": ["echo", *args], **step}]}
    if substitutions is not None:
        document["substitutions"] = substitutions
    if options is not None:
        document["options"] = options
    return document


@pytest.mark.parametrize("flag, parsed", [
    ("_REGION=us-central1,_REPOSITORY=trainers", {"_REGION": "us-central1", "_REPOSITORY": "trainers"}),
    ("^:^_LIST=a,b:_X=1", {"_LIST": "a,b", "_X": "1"}),
    ("_EMPTY=", {"_EMPTY": ""}),
])
def test_the_substitutions_flag_is_read_as_gcloud_reads_it(flag, parsed):
    assert subst.parse_flag(flag) == parsed


def test_every_build_gets_its_built_ins_and_a_manual_build_has_the_trigger_ones_empty():
    build = build_of(echo_config("$PROJECT_ID", "$BUILD_ID", "$PROJECT_NUMBER", "$LOCATION", "[$SHORT_SHA]",
                                 "[${COMMIT_SHA}]", "[$BRANCH_NAME]"))
    assert build.steps[0].args == ("echo", "my-project", BUILD_ID, "000000000000", "global", "[]", "[]", "[]")


def test_a_trigger_only_value_given_by_hand_is_used_and_short_sha_follows_commit_sha():
    document = echo_config("$COMMIT_SHA", "$SHORT_SHA")
    assert build_of(document, {"COMMIT_SHA": "a" * 40}).steps[0].args[1:] == ("a" * 40, "aaaaaaa")
    assert build_of(document, {"COMMIT_SHA": "a" * 40, "SHORT_SHA": "b"}).steps[0].args[1:] == ("a" * 40, "b")


def test_user_defaults_are_overridden_and_dollar_dollar_is_a_literal_dollar():
    document = echo_config("${_A}", "$_A-x", "$$HOME", "$${_A}", substitutions={"_A": "default"})
    assert build_of(document).steps[0].args[1:] == ("default", "default-x", "$HOME", "${_A}")
    assert build_of(document, {"_A": "given"}).steps[0].args[1:] == ("given", "given-x", "$HOME", "${_A}")


@pytest.mark.parametrize("value, expected", [
    ("${SHORT_SHA:-build-${BUILD_ID}}", f"build-{BUILD_ID}"),
    ("${BUILD_ID:0:8}", BUILD_ID[:8]),
    ("${BUILD_ID:9}", BUILD_ID[9:]),
    ("${BUILD_ID:-4}", BUILD_ID),  # `:-` is the default operator, not a negative offset
    ("${BUILD_ID: -4}", BUILD_ID[-4:]),
    ("${_V#v}", "1.2.3"), ("${_V%.*}", "v1.2"), ("${_V%%.*}", "v1"), ("${_V##*.}", "3"),
    ("${_V//./-}", "v1-2-3"), ("${_V/./-}", "v1-2.3"),
    ("${_REGION}-docker.pkg.dev/${PROJECT_ID}", "us-central1-docker.pkg.dev/my-project"),
])
def test_dynamic_substitutions_take_bash_expansions(value, expected):
    document = echo_config("${_OUT}", "${_V}", "${_REGION}",
                           substitutions={"_OUT": value, "_V": "v1.2.3", "_REGION": "us-central1"},
                           options={"dynamicSubstitutions": True})
    assert build_of(document).steps[0].args[1] == expected


def test_without_dynamic_substitutions_a_value_is_taken_as_written():
    document = echo_config("${_OUT}", substitutions={"_OUT": "${PROJECT_ID}"})
    assert build_of(document).steps[0].args[1] == "${PROJECT_ID}"


def test_an_expansion_the_rehearsal_does_not_know_is_one_line():
    document = echo_config("${_OUT}", substitutions={"_OUT": "${BUILD_ID^^}"}, options={"dynamicSubstitutions": True})
    with pytest.raises(subst.SubstitutionError, match=r"\$\{BUILD_ID\^\^\}: not a bash expansion"):
        build_of(document)


def test_a_substitution_that_refers_to_itself_is_refused():
    document = echo_config("${_A}", substitutions={"_A": "${_B}", "_B": "x${_A}"}, options={"dynamicSubstitutions": True})
    with pytest.raises(subst.SubstitutionError, match="refers to itself"):
        build_of(document)


@pytest.mark.parametrize("given, message", [
    ({"_TYPO": "x"}, "key '_TYPO' in the substitution data is not matched in the template"),
    ({"REGION": "x"}, "substitution key 'REGION' does not respect format '^_[A-Z0-9_]+$' and is not an overridable"),
    ({"BUILD_ID": "x"}, "substitution key 'BUILD_ID' does not respect format"),
])
def test_cloud_builds_own_refusals_of_a_given_key(given, message):
    document = echo_config("${_A}", substitutions={"_A": "a"})
    with pytest.raises(subst.SubstitutionError) as refused:
        build_of(document, given)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_key_the_template_uses_but_nobody_defines_fails_unless_allow_loose():
    with pytest.raises(subst.SubstitutionError, match="key in the template '_MISSING' is not matched in the substitution data"):
        build_of(echo_config("[$_MISSING]"))
    loose = build_of(echo_config("[$_MISSING]", options={"substitutionOption": "ALLOW_LOOSE"}), {"_TYPO": "x"})
    assert loose.steps[0].args[1] == "[]" and len(loose.warnings) == 2


def test_a_key_without_underscore_in_the_template_is_not_a_built_in_even_with_allow_loose():
    with pytest.raises(subst.SubstitutionError, match="key in the template 'HOME' is not a valid built-in substitution"):
        build_of(echo_config("$HOME", options={"substitutionOption": "ALLOW_LOOSE"}))


def test_only_a_plain_reference_counts_as_a_use():
    """datacommonsorg/website#6392: keys used only as ${_KEY:-default} were refused as unused."""
    document = echo_config("${_A:-x}", substitutions={"_A": "a"}, options={"dynamicSubstitutions": True})
    with pytest.raises(subst.SubstitutionError, match="key '_A' in the substitution data is not matched"):
        build_of(document)


def test_a_trigger_build_is_dynamic_and_loose():
    document = echo_config("${_A}", "[$_UNDEFINED]", substitutions={"_A": "${SHORT_SHA}"})
    build = build_of(document, {"_EXTRA": "x"}, {"COMMIT_SHA": "c" * 40, "SHORT_SHA": "ccccccc"})
    assert build.steps[0].args[1:] == ("ccccccc", "[]") and build.dynamic and build.loose


@pytest.mark.parametrize("break_it, message", [
    (lambda d: d.update(steps=[]), "no build steps are specified"),
    (lambda d: d["steps"][0].pop("name"), "build step 0 must specify name"),
    (lambda d: d["steps"][0].update(waitFor=["later"]), "depends on 'later', which has not been defined"),
    (lambda d: d["steps"].append({"name": "x", "id": "a"}) or d["steps"][0].update(id="a"), "the ID is not unique"),
    (lambda d: d["steps"][0].update(id="-"), "the ID cannot be '-'"),
    (lambda d: d["steps"][0].update(env=["NOVALUE"]), "must be of the form \"KEY=VALUE\""),
    (lambda d: d["steps"][0].update(timeout="700s"), "build step timeout 700s must be <= build timeout 600s"),
    (lambda d: d.update(timeout="90000s"), "exceeds the timeout limit"),
    (lambda d: d.update(images=["registry/x:${_EMPTY}"], substitutions={"_EMPTY": ""}),
     "invalid image name 'registry/x:': could not parse reference"),
])
def test_what_cloud_build_refuses_before_running_a_step(break_it, message):
    document = echo_config("hello")
    break_it(document)
    with pytest.raises((config.ConfigError, subst.SubstitutionError), match=message.replace("(", r"\(").replace("$", r"\$")):
        build_of(document)


def test_an_unknown_field_is_refused_by_cloud_builds_own_message(tmp_path):
    path = tmp_path / "cloudbuild.yaml"
    path.write_text(yaml.safe_dump(echo_config("x", waitForIt=True)))
    with pytest.raises(config.ConfigError, match="not a Cloud Build config: .*waitForIt"):
        config.load(path)


def test_the_timeouts_and_the_steps_workdir():
    document = echo_config("x", timeout="30s", dir="sub/dir")
    document["timeout"] = "60s"
    build = build_of(document)
    assert build.timeout == 60 and build.steps[0].timeout == 30 and build.steps[0].workdir == "/workspace/sub/dir"
    assert build_of(echo_config("x")).timeout == config.DEFAULT_TIMEOUT_SECONDS


def test_wait_for_starts_at_once_waits_for_named_steps_or_for_every_earlier_one():
    document = {"steps": [{"name": "a", "id": "first"}, {"name": "a", "id": "second", "waitFor": ["-"]},
                          {"name": "a", "id": "third", "waitFor": ["first"]}, {"name": "a", "id": "fourth"}]}
    needed = graph.prerequisites(build_of(document).steps)
    assert needed == {0: set(), 1: set(), 2: {0}, 3: {0, 1, 2}}
    assert graph.ready(needed, succeeded=[], started=[]) == [0, 1]
    assert graph.ready(needed, succeeded=[0], started=[0, 1]) == [2]
    assert graph.ready(needed, succeeded=[0, 2], started=[0, 1, 2]) == []  # fourth waits for second too
    assert graph.ready(needed, succeeded=[0, 1, 2], started=[0, 1, 2]) == [3]


def test_the_not_emulated_fields_are_named():
    document = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
    named = config.not_emulated(document)
    assert "options.machineType=E2_HIGHCPU_8" in named and "options.requestedVerifyOption=VERIFIED" in named
    assert not [line for line in named if line.startswith(("steps", "images", "substitutions"))]


def test_a_trigger_gives_its_config_its_substitutions_and_the_commits_built_ins():
    weekly = triggers.load(REPO / "images" / "triggers" / "weekly-rebuild.yaml")
    assert weekly.config_path == "cloudbuild.yaml" and weekly.substitutions["_GATE_POLICY"] == "weekly"
    values = triggers.built_ins(weekly, "0123456789abcdef0123456789abcdef01234567")
    assert values["SHORT_SHA"] == "0123456" and values["BRANCH_NAME"] == "main" and values["REF_NAME"] == "main"
    assert values["TRIGGER_NAME"] == "tf-runtime-weekly-rebuild" and values["REPO_NAME"] == "REPO"
    assert values["SERVICE_ACCOUNT_EMAIL"] == "SERVICE_ACCOUNT" and values["TAG_NAME"] == ""
    refresh = triggers.load(REPO / "images" / "triggers" / "refresh-bases.yaml")
    assert refresh.config_path == "images/triggers/refresh-bases.cloudbuild.yaml"


def documented_submit_build_commands() -> list[list[str]]:
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            words = line.split()
            if words[:3] in (["python", "scripts/submit_build.py", "local"],
                             [".venv/bin/python", "scripts/submit_build.py", "local"]):
                found.append(words[2:])
    return found


@pytest.mark.parametrize("argv", documented_submit_build_commands(), ids=" ".join)
def test_every_documented_build_command_parses_and_a_submitted_build_is_accepted(argv, tmp_path):
    """Each `submit_build.py local` line the pages show parses; without --trigger, Cloud Build's
    checks and substitutions accept the build it submits (nothing runs: no engine here)."""
    from scripts import submit_build
    from scripts.rehearsal.cloudbuild import build as builds

    assert argv[0] == "local"
    args = submit_build.build_parser().parse_args(argv[1:])
    if args.trigger:
        assert (REPO / args.trigger).is_file()
        return
    submitted = builds.submission(builds.Options(config=args.config, source=str(REPO),
                                                 substitutions=tuple(args.substitutions.items())))
    assert all(image.endswith((f":build-{submitted.build_id}", ":latest")) for image in submitted.build.images)


def test_the_readmes_cloud_build_command_is_the_rehearsals_with_the_same_flags():
    lines = (REPO / "README.md").read_text().splitlines()
    submit = next(line for line in lines if line.startswith("gcloud builds submit "))
    rehearse = next(line for line in lines if "scripts/submit_build.py local" in line and line.startswith(".venv"))
    assert rehearse.split("scripts/submit_build.py local ", 1)[1] == submit[len("gcloud builds submit "):]


def test_each_step_image_of_the_configs_has_its_stand_in_and_an_unknown_one_is_refused():
    from scripts.rehearsal.cloudbuild import standins

    document = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
    names = {step.name for step in build_of(document).steps}
    chosen = standins.plan(names, available=lambda image: False)
    assert {standin.kind for standin in chosen.values()} == {"docker", "gcloud", "python"}
    line = standins.line(chosen, "localhost/standin-python:3.11-bookworm-x")
    assert line.startswith("stand-ins: ") and "\n" not in line and "not emulated: provenance (SLSA), IAM" in line
    with pytest.raises(standins.StandInError, match="no stand-in for it and the engine does not have it"):
        standins.plan(["registry.example/builder:1"], available=lambda image: False)
    assert standins.plan(["registry.example/builder:1"], available=lambda image: True) == {"registry.example/builder:1": None}


def gcloud_standin(state, monkeypatch):
    import importlib.util

    path = REPO / "scripts" / "rehearsal" / "cloudbuild" / "standins" / "gcloud" / "gcloud.py"
    spec = importlib.util.spec_from_file_location("gcloud_standin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "STATE", state)
    return module


def test_the_gcloud_stand_in_answers_a_scan_with_the_occurrences_for_that_image_only(tmp_path, monkeypatch, capsys):
    from unit.test_scan_gate import occurrence

    gcloud = gcloud_standin(tmp_path, monkeypatch)
    mine = occurrence("CVE-2026-0100")
    mine["resourceUri"] = "us-central1-docker.pkg.dev/p/r/tf-predictor-cpu@sha256:" + "2" * 64
    other = occurrence("CVE-2026-0101")
    other["resourceUri"] = "us-central1-docker.pkg.dev/p/r/tf-runtime-cpu@sha256:" + "2" * 64
    (tmp_path / "vulnerabilities.json").write_text(json.dumps([mine, other]))
    (tmp_path / "scans").mkdir()
    (tmp_path / "scans" / "abc.json").write_text(json.dumps({"image": "x-docker.pkg.dev/q/s/tf-predictor-cpu:build-1"}))
    assert gcloud.main(["artifacts", "docker", "images", "list-vulnerabilities",
                        "projects/q/locations/us/scans/abc", "--location=us", "--format=json"]) == 0
    answered = json.loads(capsys.readouterr().out)
    assert [o["noteName"].rsplit("/", 1)[-1] for o in answered] == ["CVE-2026-0100"]
    assert answered[0]["resourceUri"] == "x-docker.pkg.dev/q/s/tf-predictor-cpu:build-1"
    assert gcloud.main(["artifacts", "docker", "images", "list-vulnerabilities", "projects/q/locations/us/scans/nope"]) == 1
    assert gcloud.main(["builds", "submit"]) == 2 and "answers `artifacts docker images scan`" in capsys.readouterr().err


def test_the_gcloud_stand_in_records_an_sbom_load_and_refuses_what_gcloud_would(tmp_path, monkeypatch, capsys):
    import hashlib

    gcloud = gcloud_standin(tmp_path / "state", monkeypatch)
    spdx = tmp_path / "os.spdx.json"
    spdx.write_text(json.dumps({"spdxVersion": "SPDX-2.3", "packages": []}))
    uri = "us-central1-docker.pkg.dev/p/r/tf-runtime-cpu@sha256:" + "3" * 64
    assert gcloud.main(["artifacts", "sbom", "load", f"--source={spdx}", f"--uri={uri}"]) == 0
    record, = [json.loads(line) for line in (tmp_path / "state" / "sbom-loads.jsonl").read_text().splitlines()]
    assert record == {"uri": uri, "source": str(spdx), "format": "spdx",
                      "sha256": hashlib.sha256(spdx.read_bytes()).hexdigest()}
    assert gcloud.main(["artifacts", "sbom", "load", f"--source={spdx}", "--uri=registry/x:latest"]) == 1
    (tmp_path / "notes.json").write_text("{}")
    assert gcloud.main(["artifacts", "sbom", "load", f"--source={tmp_path / 'notes.json'}", f"--uri={uri}"]) == 1
    assert "neither an SPDX nor a CycloneDX document" in capsys.readouterr().err


def test_a_build_takes_away_only_the_artifact_registry_tags_never_another_processs_new_tag():
    """The build untags what registry_names() keeps of the names listed new after it; a test's
    `localhost/...:test`, tagged by another process while the build ran, once vanished that way
    under a test that needed it."""
    from scripts.rehearsal.cloudbuild.build import registry_names

    listing = ("us-central1-docker.pkg.dev/local-project/trainers/tf-runtime-cpu:build-1\n"
               "europe-docker.pkg.dev/p/r/i:v1\ngcr.io/p/i:v1\neu.gcr.io/p/i:v1\n"
               "localhost/tf-runtime-cpu:test\n127.0.0.1:5000/trainers/tf-runtime-cpu:x\n<none>:<none>\n"
               "docker.io/library/python:3.11\n")
    assert registry_names(listing.split()) == {
        "us-central1-docker.pkg.dev/local-project/trainers/tf-runtime-cpu:build-1", "europe-docker.pkg.dev/p/r/i:v1",
        "gcr.io/p/i:v1", "eu.gcr.io/p/i:v1"}


@pytest.mark.parametrize("tool, buildah, buildah_exit, listed_by", [
    ("podman", "/usr/bin/buildah", 0, "buildah"),
    ("podman", "/usr/bin/buildah", 125, "podman"),  # buildah could not read the store: podman's own listing
    ("podman", None, 0, "podman"),
    ("docker", "/usr/bin/buildah", 0, "docker"),  # docker's store is not buildah's
])
def test_the_engines_image_names_come_from_buildah_for_podman_else_from_the_engine(monkeypatch, tool, buildah,
                                                                                    buildah_exit, listed_by):
    """Where podman's store record cannot be found: `podman images` works out every image's size
    and children before it prints a name (seconds on a big store; a build lists twice, every
    leftover check once); buildah lists the same store's names at once. Both in the engine's
    environment, both as REPOSITORY:TAG."""
    import subprocess

    from scripts.rehearsal import engine as engines

    calls = []

    def run(command, **kwargs):
        if command[1] == "info":  # no store record to read: the command's listing
            return subprocess.CompletedProcess(command, 125, "", "Error: no store\n")
        calls.append((command, kwargs["env"]["CONTAINERS_CONF"]))
        if command[0] == "buildah":
            assert command[1:] == ["images", "--format", "{{.Name}}:{{.Tag}}"]
            return subprocess.CompletedProcess(command, buildah_exit, "gcr.io/p/i:v1\n<none>:<none>\n", "")
        assert command[1:] == ["images", "--format", "{{.Repository}}:{{.Tag}}"]
        return subprocess.CompletedProcess(command, 0, f"localhost/{command[0]}:listed\n", "")

    monkeypatch.setattr(engines.shutil, "which", lambda name: buildah if name == "buildah" else None)
    monkeypatch.setattr(engines.subprocess, "run", run)
    names = engines.Engine(tool, {"CONTAINERS_CONF": "/conf"}).image_names()
    assert calls[-1] == ([listed_by, *calls[-1][0][1:]], "/conf")
    assert names == (["gcr.io/p/i:v1", "<none>:<none>"] if listed_by == "buildah" else [f"localhost/{listed_by}:listed"])


GONE = 'Error: reading image "5fe6": locating image with ID "5fe6": image not known\n'


@pytest.mark.parametrize("failures, seconds, expected", [
    (5, 120, ["gcr.io/p/i:v1"]),  # failed five times as images went under it: the sixth listing is read
    (5, 0, None),  # still failing when its time is up: one line, not an empty store
])
def test_a_listing_that_met_a_removed_image_is_listed_again_until_its_time_is_up(monkeypatch, failures, seconds,
                                                                                  expected):
    """A listing fails when another process removes an image between the listing's reading of the
    store's list and of that image; a build through the API service removes its intermediate images
    for seconds on end. A build compares its listings before and after it to find its own tags, and
    a leftover check must see every image, so a failed listing is listed again, never read as empty."""
    import subprocess

    from scripts.rehearsal import engine as engines

    calls, pauses = [], []

    def run(command, **kwargs):
        if command[1] == "info":
            return subprocess.CompletedProcess(command, 125, "", "Error: no store\n")
        calls.append(command[0])
        if len(calls) <= failures:
            return subprocess.CompletedProcess(command, 125, "", GONE)
        return subprocess.CompletedProcess(command, 0, "gcr.io/p/i:v1\n", "")

    monkeypatch.setattr(engines.shutil, "which", lambda name: "/usr/bin/buildah" if name == "buildah" else None)
    monkeypatch.setattr(engines.subprocess, "run", run)
    monkeypatch.setattr(engines.time, "sleep", pauses.append)
    monkeypatch.setattr(engines, "LISTING_SECONDS", seconds)
    engine = engines.Engine("podman", {})
    if expected is None:
        with pytest.raises(engines.EngineError, match=r'^podman images: Error: reading image "5fe6": .*image not known$'):
            engine.image_names()
    else:
        assert engine.image_names() == expected
        # buildah lists each time (podman's own listing, seconds on a big store, would meet the same)
        assert calls == ["buildah"] * (failures + 1) and pauses == [engines.LISTING_PAUSE_SECONDS] * failures


def test_a_listing_that_fails_for_another_reason_is_one_line_at_once(monkeypatch):
    import subprocess

    from scripts.rehearsal import engine as engines

    calls = []

    def run(command, **kwargs):
        if command[1] == "info":
            return subprocess.CompletedProcess(command, 125, "", "Error: no store\n")
        calls.append(command[0])
        return subprocess.CompletedProcess(command, 125, "", "Error: database is locked\n")

    monkeypatch.setattr(engines.shutil, "which", lambda name: "/usr/bin/buildah" if name == "buildah" else None)
    monkeypatch.setattr(engines.subprocess, "run", run)
    with pytest.raises(engines.EngineError, match=r"^podman images: Error: database is locked$"):
        engines.Engine("podman", {}).image_names()
    assert calls == ["buildah", "podman"]  # buildah could not: podman's own listing, once


def test_a_build_removes_the_containers_its_steps_made_through_its_service_and_no_other():
    """container-structure-test makes its containers through the build's engine service, named at
    random; a build stopped mid-step (a gate failing beside the structure tests) left them. Each
    carries the build's id (MADE_BY_A_STEP); another build's and other processes' stay."""
    from scripts.rehearsal.cloudbuild.build import MADE_BY_A_STEP, remove_made_by_steps

    removed = []

    class Engine:
        def annotated_containers(self, key):
            assert key == MADE_BY_A_STEP
            return {"elated_rhodes": "build-1", "fervent_gagarin": "build-2", "quirky_hopper": "build-1"}

        def __call__(self, *args, check=True):
            removed.append(args)
            return ""

    assert remove_made_by_steps(Engine(), "build-1") == ["elated_rhodes", "quirky_hopper"]
    assert removed == [("rm", "-f", "elated_rhodes"), ("rm", "-f", "quirky_hopper")]


def test_the_engine_reads_each_containers_annotation_and_passes_over_those_without_it(monkeypatch):
    import subprocess

    from scripts.rehearsal import engine as engines

    def run(command, **kwargs):
        if command[1] == "ps":
            return subprocess.CompletedProcess(command, 0, "a1\nb2\nc3\n", "")
        assert command[1:3] == ["container", "inspect"] and command[-3:] == ["a1", "b2", "c3"]
        assert '{{index .Config.Annotations "k"}}' in command[4]
        # c3 was removed between the listing and the inspection: podman prints the others and fails.
        return subprocess.CompletedProcess(command, 125, "one\tbuild-1\ntwo\t\nthree\t<no value>\n", "no such container c3")

    monkeypatch.setattr(engines.subprocess, "run", run)
    assert engines.Engine("podman", {}).annotated_containers("k") == {"one": "build-1"}
    assert engines.Engine("docker", {}).annotated_containers("k") == {}


STORED = [
    {"id": "a1", "names": ["localhost/tf-runtime-cpu:test", "us-central1-docker.pkg.dev/local-project/trainers/tf-runtime-cpu:build-1"]},
    {"id": "b2"},  # an intermediate build image: no name
    {"id": "c3", "names": ["127.0.0.1:5000/trainers/tf-runtime-cpu@sha256:" + "0" * 64]},  # pulled by digest
    {"id": "d4", "names": ["localhost/no-tag"]},
]


def test_podmans_image_names_are_read_from_its_store_record_in_one_read_without_a_listing_command(monkeypatch, tmp_path):
    """podman's store replaces its images.json whole on every change: one read sees every image
    with no image removed under it halfway, which failed `buildah images` for up to a minute while
    container-structure-test removed its commits. `podman info` is asked once for where it is."""
    import json
    import subprocess

    from scripts.rehearsal import engine as engines

    (tmp_path / "overlay-images").mkdir()
    (tmp_path / "overlay-images" / "images.json").write_text(json.dumps(STORED))
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        assert command == ["podman", "info", "--format", "{{.Store.GraphRoot}}\t{{.Store.GraphDriverName}}"]
        return subprocess.CompletedProcess(command, 0, f"{tmp_path}\toverlay\n", "")

    monkeypatch.setattr(engines.subprocess, "run", run)
    engine = engines.Engine("podman", {})
    expected = ["localhost/tf-runtime-cpu:test", "us-central1-docker.pkg.dev/local-project/trainers/tf-runtime-cpu:build-1",
                "<none>:<none>", "127.0.0.1:5000/trainers/tf-runtime-cpu:<none>", "localhost/no-tag:<none>"]
    assert engine.image_names() == expected
    STORED.append({"id": "e5", "names": ["gcr.io/p/i:v1"]})
    (tmp_path / "overlay-images" / "images.json").write_text(json.dumps(STORED))
    assert engine.image_names() == [*expected, "gcr.io/p/i:v1"]  # read afresh each time
    STORED.pop()
    assert len(calls) == 1


@pytest.mark.parametrize("record, expected", [
    (None, None),  # podman named no store
    ("missing-folder/images.json", None),  # a store laid out otherwise
    ("overlay-images/images.json", []),  # the folder, no record yet: no image was ever stored
    ("bad/images.json", None),  # not a record: the listing command instead
])
def test_a_store_record_that_cannot_be_read_says_so_and_an_empty_store_is_empty(tmp_path, record, expected):
    from scripts.rehearsal.engine import stored_image_names

    (tmp_path / "overlay-images").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "images.json").write_text('{"truncated": ')
    assert stored_image_names(None if record is None else str(tmp_path / record)) == expected
