"""Job specs from scripts/submit_job.py, loaded into each platform's real schema, and the
cluster each replica would be told about, resolved by trainer.cluster."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from helpers import REPO, run_module, clean_env
from trainer.cluster import resolve

from scripts import jobspec, submit_job

CPU = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123"
GPU = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-gpu:abc123"
GCR_CPU = "gcr.io/my-project/cassava-trainer-cpu:abc123"

REQUESTS = {
    "mwms-v100": ["--workers", "3", "--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_V100",
                  "--accelerator-count", "1", "--image-uri", CPU, "--gpu-image-uri", GPU],
    "mwms-cpu-gcr": ["--workers", "1", "--image-uri", GCR_CPU, "--labels", "team=vision,env=dev",
                     "--service-account", "trainer@my-project.iam.gserviceaccount.com"],
    "pss-evaluator": ["--strategy", "pss", "--workers", "4", "--ps", "2", "--evaluator", "--image-uri", CPU,
                      "--evaluator-image-uri", CPU, "--base-output-dir", "gs://bucket/run-1",
                      "--network", "projects/123/global/networks/default"],
}
TRAINER_ARGS = ["--", "--dataset", "tfrecord:gs://bucket/cassava/train-*.tfrecord", "--epochs", "10"]
EXPECTED = {"mwms-v100": (4, 0, False), "mwms-cpu-gcr": (2, 0, False), "pss-evaluator": (5, 2, True)}


def spec(target, name, *extra):
    args = submit_job.build_parser().parse_args([target, "--dry-run", *REQUESTS[name], *extra])
    args.trainer_args = TRAINER_ARGS[1:]
    return submit_job.build_spec(args)[1]


# --- Vertex AI: aiplatform v1 protobuf types, unknown fields failing --------------------------

@pytest.mark.parametrize("name", REQUESTS)
def test_vertex_custom_job_loads_into_aiplatform_v1_types(name):
    from google.cloud import aiplatform_v1

    custom = spec("vertex", name)
    job = aiplatform_v1.CustomJob.from_json(json.dumps(custom), ignore_unknown_fields=False)
    job_spec = aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)
    pools = job_spec.worker_pool_specs
    assert pools[0].replica_count == 1
    assert list(pools[1].container_spec.args)[-4:] == TRAINER_ARGS[-4:]
    assert job.display_name == "cassava-multiworker"


def test_vertex_unknown_field_fails_the_schema():
    from google.cloud import aiplatform_v1

    custom = spec("vertex", "mwms-v100")
    custom["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["gpuType"] = "V100"
    with pytest.raises(Exception, match="gpuType"):
        aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)


def test_vertex_gpu_pools_use_the_gpu_image_and_ps_do_not():
    pools = spec("vertex", "mwms-v100")["jobSpec"]["workerPoolSpecs"]
    assert [p["containerSpec"]["imageUri"] for p in pools] == [GPU, GPU]
    assert pools[1]["machineSpec"] == {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_V100", "acceleratorCount": 1}
    pss = spec("vertex", "pss-evaluator")["jobSpec"]
    assert [p["replicaCount"] for p in pss["workerPoolSpecs"]] == ["1", "4", "2", "1"]
    assert pss["baseOutputDirectory"] == {"outputUriPrefix": "gs://bucket/run-1"}
    assert pss["workerPoolSpecs"][1]["containerSpec"]["args"][:2] == ["--strategy", "parameter_server"]


@pytest.mark.parametrize("name", REQUESTS)
def test_hptune_job_loads_into_aiplatform_v1_types(name):
    from google.cloud import aiplatform_v1

    tuning = spec("hptune", name, "--max-trials", "6", "--parallel-trials", "3")
    job = aiplatform_v1.HyperparameterTuningJob.from_json(json.dumps(tuning), ignore_unknown_fields=False)
    assert job.study_spec.metrics[0].metric_id == "accuracy"
    parameters = {p.parameter_id: p for p in job.study_spec.parameters}
    # The parameter ids become the trainer's own flags (--learning-rate=..., --per-replica-batch-size=...).
    assert set(parameters) == {"learning-rate", "per-replica-batch-size"}
    assert parameters["learning-rate"].scale_type == aiplatform_v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    assert list(parameters["per-replica-batch-size"].discrete_value_spec.values) == [32.0, 64.0, 128.0]
    assert (job.max_trial_count, job.parallel_trial_count) == (6, 3)


def test_tuned_values_are_accepted_by_the_trainer_flags():
    from trainer import config

    parsed = config.build_parser().parse_args(["--learning-rate=0.00031", "--per-replica-batch-size=64.0"])
    assert (parsed.learning_rate, parsed.per_replica_batch_size) == (0.00031, 64)


# --- AI Platform: ml v1 TrainingInput from google-api-python-client's discovery document -----

def ml_v1_schemas():
    import googleapiclient

    path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "ml.v1.json")
    with open(path) as document:
        return json.load(document)["schemas"]


def validate_discovery(value, schema, schemas, path="$"):
    """Checks `value` against a Google discovery schema; unknown fields fail."""
    if "$ref" in schema:
        return validate_discovery(value, schemas[schema["$ref"]], schemas, path)
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), f"{path}: expected an object"
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                validate_discovery(item, properties[key], schemas, f"{path}.{key}")
            elif "additionalProperties" in schema:
                validate_discovery(item, schema["additionalProperties"], schemas, f"{path}.{key}")
            else:
                raise AssertionError(f"{path}: unknown field {key!r}")
    elif kind == "array":
        assert isinstance(value, list), f"{path}: expected a list"
        for index, item in enumerate(value):
            validate_discovery(item, schema["items"], schemas, f"{path}[{index}]")
    elif kind == "string":
        assert isinstance(value, str), f"{path}: expected a string, got {value!r}"
        if schema.get("format") in ("int64", "uint64"):
            assert re.fullmatch(r"-?\d+", value), f"{path}: expected an int64 string"
        if "enum" in schema:
            assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: expected an integer"
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: expected a number"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{path}: expected a boolean"


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


# --- Kubeflow: the kubeflow-training SDK's TFJob model --------------------------------------------

def strict_model(data, type_name):
    """Deserialises into the SDK's OpenAPI models, failing on any field a model does not know."""
    import kubernetes.client.models as k8s
    from kubeflow.training import models as kubeflow

    if type_name.startswith("list["):
        return [strict_model(item, type_name[5:-1]) for item in data]
    if type_name.startswith("dict("):
        value_type = type_name[5:-1].split(", ", 1)[1]
        return {key: strict_model(item, value_type) for key, item in data.items()}
    model = getattr(kubeflow, type_name, None) or getattr(k8s, type_name, None)
    if model is None:
        return data  # a primitive (str, int, object, ...)
    json_to_attr = {json_key: attr for attr, json_key in model.attribute_map.items()}
    unknown = set(data) - set(json_to_attr)
    assert not unknown, f"{type_name}: unknown fields {sorted(unknown)}"
    return model(**{json_to_attr[k]: strict_model(v, model.openapi_types[json_to_attr[k]]) for k, v in data.items()})


@pytest.mark.parametrize("name", REQUESTS)
def test_tfjob_manifest_loads_into_kubeflow_training_models(name):
    manifest = yaml.safe_load(yaml.safe_dump(spec("tfjob", name)))
    job = strict_model(manifest, "KubeflowOrgV1TFJob")
    replicas = job.spec.tf_replica_specs
    assert replicas["Chief"].replicas == 1
    # Only the retryable codes restart a pod; a configuration error (2) fails the job at once.
    assert {r.restart_policy for r in replicas.values()} == {"ExitCode"}
    assert job.spec.run_policy.backoff_limit == 5
    args = replicas["Worker"].template.spec.containers[0].args
    assert args[args.index("--epochs") + 1] == "10"
    assert ("--model-dir" in args) == (name == "pss-evaluator")  # from --base-output-dir


def test_tfjob_gpu_pools_request_gpus():
    manifest = spec("tfjob", "mwms-v100")
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["image"] == GPU and worker["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    pss = spec("tfjob", "pss-evaluator")["spec"]["tfReplicaSpecs"]
    assert set(pss) == {"Chief", "Worker", "PS", "Evaluator"} and "resources" not in pss["PS"]["template"]["spec"]["containers"][0]


def test_tfjob_unknown_field_fails():
    manifest = spec("tfjob", "mwms-cpu-gcr")
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicyy"] = "Never"
    with pytest.raises(AssertionError, match="restartPolicyy"):
        strict_model(manifest, "KubeflowOrgV1TFJob")


# --- Round trip: what each replica is told, resolved by trainer.cluster ---------------------------

@pytest.mark.parametrize("platform, target", [("vertex", "vertex"), ("vertex", "hptune"), ("ai-platform", "ai-platform"), ("tfjob", "tfjob")])
@pytest.mark.parametrize("name", REQUESTS)
def test_every_replica_resolves_to_the_requested_cluster(platform, target, name):
    environments = jobspec.cluster_environments(platform, spec(target, name))
    num_workers, num_ps, evaluator = EXPECTED[name]
    resolved = []
    for environment in environments:
        for variable in environment:  # each variable alone must give the same answer
            resolved.append((variable, resolve({variable: environment[variable]})))
    clusters = [cluster for _, cluster in resolved]
    by_variable = {}
    for variable, cluster in resolved:
        by_variable.setdefault(variable, []).append(cluster)
    for variable, replicas in by_variable.items():
        assert sum(c.is_chief for c in replicas) == 1, f"{variable}: not exactly one chief"
        assert sum(c.task_type == "ps" for c in replicas) == num_ps
        assert sum(c.task_type == "evaluator" for c in replicas) == int(evaluator)
        assert len(replicas) == num_workers + num_ps + int(evaluator)
    assert {c.num_workers for c in clusters} == {num_workers}
    assert {c.num_ps for c in clusters} == {num_ps}
    assert all("master" not in c.tf_config["cluster"] for c in clusters)


# --- Inconsistent requests: one line, exit 2 -----------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["vertex", "--strategy", "pss", "--workers", "2", "--image-uri", CPU], "--strategy pss needs at least one parameter server"),
    (["vertex", "--machine-type", "e2-standard-8", "--accelerator-type", "NVIDIA_TESLA_T4", "--accelerator-count", "1",
      "--image-uri", CPU], "machine type e2-standard-8 cannot take NVIDIA_TESLA_T4"),
    (["vertex", "--machine-type", "a2-highgpu-1g", "--accelerator-type", "NVIDIA_TESLA_V100", "--accelerator-count", "1",
      "--image-uri", CPU], "machine type a2-highgpu-1g cannot take NVIDIA_TESLA_V100"),
    (["tfjob", "--workers", "0", "--image-uri", CPU], "--workers must be at least 1"),
    (["ai-platform", "--strategy", "pss", "--ps", "1", "--evaluator", "--image-uri", CPU], "an AI Platform evaluator needs --evaluator-image-uri"),
    (["jobset", "--strategy", "pss", "--workers", "2", "--image-uri", CPU], "--strategy pss needs at least one parameter server"),
    (["tfjob", "--queue", "team-a", "--image-uri", CPU], "--queue is for the jobset target"),
])
def test_inconsistent_requests_exit_2_with_one_line(argv, message):
    result = run_module("scripts.submit_job", *argv, "--dry-run", env=clean_env(), timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


def test_dry_run_prints_json_for_vertex_and_yaml_for_tfjob():
    vertex = run_module("scripts.submit_job", "vertex", "--dry-run", *REQUESTS["mwms-cpu-gcr"], "--", "--epochs", "3",
                        env=clean_env(), timeout=120)
    assert vertex.returncode == 0, vertex.stderr
    assert json.loads(vertex.stdout)["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"] == ["--epochs", "3"]
    tfjob = run_module("scripts.submit_job", "tfjob", *REQUESTS["mwms-cpu-gcr"], env=clean_env(), timeout=120)
    assert yaml.safe_load(tfjob.stdout)["kind"] == "TFJob"


def test_printed_tfjob_says_it_is_for_training_operator_1_9_and_points_to_jobset():
    tfjob = run_module("scripts.submit_job", "tfjob", *REQUESTS["mwms-cpu-gcr"], env=clean_env(), timeout=120)
    header = tfjob.stdout.split("apiVersion:")[0]
    assert header.startswith("# Kubeflow training-operator v1 (TFJob), maintained only on its release-1.9 branch")
    assert "use `submit_job.py jobset`" in header and all(line.startswith("#") for line in header.splitlines())
    help_text = run_module("scripts.submit_job", "--help", env=clean_env(), timeout=120).stdout
    assert "release-1.9" in help_text and "jobset" in help_text


# --- self-check job and GPU warnings ------------------------------------------------------------

def test_self_check_is_one_replica_of_the_chief_machine_running_selfcheck():
    from google.cloud import aiplatform_v1

    args = submit_job.build_parser().parse_args(["vertex", "--self-check", "--strategy", "pss", "--ps", "2",
                                                 *REQUESTS["mwms-v100"]])
    args.trainer_args = ["--image-size", "224"]
    custom = submit_job.build_spec(args)[1]
    job_spec = aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)
    [pool] = job_spec.worker_pool_specs
    assert pool.replica_count == 1
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name, pool.machine_spec.accelerator_count) == \
        ("n1-standard-8", "NVIDIA_TESLA_V100", 1)
    assert pool.container_spec.image_uri == GPU
    assert list(pool.container_spec.command) == ["python", "-m", "trainer.selfcheck"]
    assert list(pool.container_spec.args) == ["--image-size", "224"]  # no --strategy: not a training run
    assert custom["displayName"] == "cassava-multiworker-selfcheck"


def test_self_check_args_are_flags_the_selfcheck_accepts():
    from trainer import selfcheck

    with pytest.raises(SystemExit) as exit_info:
        selfcheck.main(["--help"])
    assert exit_info.value.code == 0
    with pytest.raises(SystemExit) as exit_info:
        selfcheck.main(["--epochs", "3"])  # a training flag is refused, not ignored
    assert exit_info.value.code == 2


def test_self_check_is_only_for_vertex():
    result = run_module("scripts.submit_job", "tfjob", "--self-check", *REQUESTS["mwms-cpu-gcr"], env=clean_env(), timeout=120)
    assert result.returncode == 2 and result.stderr == "submit_job: error: --self-check is for the vertex target\n"


H100 = ["--workers", "1", "--machine-type", "a3-highgpu-8g", "--accelerator-type", "NVIDIA_H100_80GB",
        "--accelerator-count", "8", "--image-uri", CPU, "--gpu-image-uri", GPU]


@pytest.mark.parametrize("target", ["vertex", "tfjob"])
def test_an_h100_request_prints_one_warning_line(target):
    result = run_module("scripts.submit_job", target, "--dry-run", *H100, env=clean_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("warning: NVIDIA_H100_80GB: TensorFlow 2.21 ships no kernels for this GPU")


def test_a_v100_request_prints_no_warning():
    result = run_module("scripts.submit_job", "vertex", "--dry-run", *REQUESTS["mwms-v100"], env=clean_env(), timeout=120)
    assert result.returncode == 0 and result.stderr == ""


# --- restart settings -------------------------------------------------------------------------------

def vertex_scheduling(target, name, *extra):
    from google.cloud import aiplatform_v1

    custom = spec(target, name, *extra)
    job_spec = custom["jobSpec"] if target == "vertex" else custom["trialJobSpec"]
    return aiplatform_v1.CustomJobSpec.from_json(json.dumps(job_spec), ignore_unknown_fields=False).scheduling


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_vertex_mwms_jobs_restart_as_a_whole_and_pss_jobs_do_not(target):
    assert vertex_scheduling(target, "mwms-v100").restart_job_on_worker_restart is True
    assert vertex_scheduling(target, "pss-evaluator").restart_job_on_worker_restart is False  # workers rejoin


def test_vertex_spot_and_timeout_load_into_the_schema():
    from google.cloud import aiplatform_v1

    scheduling = vertex_scheduling("vertex", "mwms-cpu-gcr", "--spot", "--timeout", "7200")
    assert scheduling.strategy == aiplatform_v1.Scheduling.Strategy.SPOT
    assert scheduling.timeout.total_seconds() == 7200
    plain = vertex_scheduling("vertex", "mwms-cpu-gcr")
    assert plain.strategy == aiplatform_v1.Scheduling.Strategy.STRATEGY_UNSPECIFIED and not plain.timeout


def test_ai_platform_timeout_is_max_running_time_and_spot_is_refused():
    config = yaml.safe_load(yaml.safe_dump(spec("ai-platform", "mwms-v100", "--timeout", "3600")))
    validate_discovery(config, {"$ref": "GoogleCloudMlV1__Job"}, ml_v1_schemas())  # a real field of the schema
    assert config["trainingInput"]["scheduling"] == {"maxRunningTime": "3600s"}
    result = run_module("scripts.submit_job", "ai-platform", "--spot", *REQUESTS["mwms-v100"], env=clean_env(), timeout=120)
    assert result.returncode == 2 and result.stderr == "submit_job: error: --spot: AI Platform Training has no Spot VMs (use the vertex target)\n"


def test_tfjob_backoff_limit_and_deadline_load_into_the_schema():
    manifest = yaml.safe_load(yaml.safe_dump(spec("tfjob", "pss-evaluator", "--max-restarts", "2", "--timeout", "600")))
    job = strict_model(manifest, "KubeflowOrgV1TFJob")
    assert (job.spec.run_policy.backoff_limit, job.spec.run_policy.active_deadline_seconds) == (2, 600)


def test_the_retryable_code_is_one_kubeflow_retries_and_configuration_errors_are_not():
    """training-operator's IsRetryableExitCode: 130, 137, 138 and 143 are retried under ExitCode."""
    from trainer import exits

    assert exits.RETRYABLE in (130, 137, 138, 143)
    assert exits.CONFIG not in (130, 137, 138, 143)
