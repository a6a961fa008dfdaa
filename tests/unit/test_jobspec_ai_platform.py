"""scripts/jobspec/ai_platform.py's config.yaml, validated against ml v1's TrainingInput from
google-api-python-client's discovery document."""

from __future__ import annotations

import pytest
import yaml

from helpers import run_main
from scripts import submit_job
from unit.jobspec_cases import CPU, REQUESTS, ml_v1_schemas, spec, validate_discovery


# --- AI Platform: ml v1 TrainingInput from google-api-python-client's discovery document -----

@pytest.mark.parametrize("name", REQUESTS)
@pytest.mark.parametrize("tune", [False, True])
def test_ai_platform_config_validates_against_ml_v1_training_input(name, tune):
    config = yaml.safe_load(yaml.safe_dump(spec("ai-platform", name, *(["--tune"] if tune else []))))
    validate_discovery(config, {"$ref": "GoogleCloudMlV1__Job"}, ml_v1_schemas())
    training = config["trainingInput"]
    assert training["scaleTier"] == "CUSTOM" and training["useChiefInTfConfig"] is True
    assert ("hyperparameters" in training) == tune


def test_ai_platform_unknown_field_fails_the_schema():
    config = spec("ai-platform", "pss-evaluator")
    config["trainingInput"]["evaluatorImage"] = CPU
    with pytest.raises(AssertionError, match="unknown field 'evaluatorImage'"):
        validate_discovery(config, {"$ref": "GoogleCloudMlV1__Job"}, ml_v1_schemas())


def test_ai_platform_roles_have_their_images():
    training = spec("ai-platform", "pss-evaluator")["trainingInput"]
    assert {k: v["imageUri"] for k, v in training.items() if isinstance(v, dict) and "imageUri" in v} == {
        "masterConfig": CPU, "workerConfig": CPU, "parameterServerConfig": CPU, "evaluatorConfig": CPU}
    assert (training["workerCount"], training["parameterServerCount"], training["evaluatorCount"]) == ("4", "2", "1")


def test_ai_platform_timeout_is_max_running_time_and_spot_is_refused():
    config = yaml.safe_load(yaml.safe_dump(spec("ai-platform", "mwms-v100", "--timeout", "3600")))
    validate_discovery(config, {"$ref": "GoogleCloudMlV1__Job"}, ml_v1_schemas())  # a real field of the schema
    assert config["trainingInput"]["scheduling"] == {"maxRunningTime": "3600s"}
    result = run_main(submit_job.main, "ai-platform", "--spot", *REQUESTS["mwms-v100"])
    assert result.returncode == 2 and result.stderr == "submit_job: error: --spot: AI Platform Training has no Spot VMs (use the vertex target)\n"
