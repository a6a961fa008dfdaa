"""`ai-platform` is the format of a retired service (AI Platform Training, shut down on 2025-04-07):
its --help and the file it prints say so, and what it still gives the trainer is why it stays."""

from __future__ import annotations

import yaml

from helpers import run_main
from scripts import jobspec, submit_job
from trainer.cluster import resolve

REQUEST = ["--strategy", "mwms", "--workers", "2", "--image-uri", "us-docker.pkg.dev/p/r/cassava-trainer-cpu:1"]


def printed(*args):
    result = run_main(submit_job.main, "ai-platform", *REQUEST, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_printed_config_says_the_service_is_retired_and_why_the_format_is_kept():
    text = printed()
    header, body = text.split("trainingInput:", 1)
    assert header == jobspec.AI_PLATFORM_HEADER
    assert all(line.startswith("# ") for line in header.splitlines())
    assert "retired service, shut down on\n# 2025-04-07 (Vertex AI's deprecations page)" in header
    assert "`master`" in header and "`submit_job.py vertex`" in header
    # The header is YAML comments only: the file still loads as the same config.
    assert "trainingInput" in yaml.safe_load(text)


def test_the_dry_run_prints_the_same_labelled_file():
    assert printed("--dry-run").startswith(jobspec.AI_PLATFORM_HEADER)


def test_help_labels_ai_platform_as_the_retired_services_format():
    help_text = " ".join(run_main(submit_job.main, "--help").stdout.split())
    assert ("ai-platform: the format of AI Platform Training, a retired service (shut down on 2025-04-07, "
            "Vertex AI's deprecations page), kept because its CLUSTER_SPEC and `master` chief still reach the "
            "trainer") in help_text


def test_other_yaml_targets_carry_their_own_header_not_the_retired_one():
    result = run_main(submit_job.main, "tfjob", *REQUEST)
    assert result.returncode == 0, result.stderr
    assert "AI Platform" not in result.stdout.split("apiVersion:")[0]


def test_the_shape_it_is_kept_for_still_resolves_master_as_the_chief():
    config = yaml.safe_load(printed())
    # The service's own default (useChiefInTfConfig unset): `master` in both variables.
    config["trainingInput"].pop("useChiefInTfConfig")
    environments = jobspec.cluster_environments("ai-platform", config)
    chiefs = [resolve(env) for env in environments if '"type": "master"' in env["CLUSTER_SPEC"]]
    assert len(chiefs) == 1 and chiefs[0].is_chief and chiefs[0].task_type == "chief"
    assert "master" not in chiefs[0].tf_config["cluster"]  # TensorFlow is given `chief`
