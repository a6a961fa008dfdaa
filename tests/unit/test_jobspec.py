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
    from cassava.task import CassavaTask
    from trainer import fit

    parsed = fit.build_parser(CassavaTask()).parse_args(["--learning-rate=0.00031", "--per-replica-batch-size=64.0"])
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
    assert result.stderr.startswith("warning: NVIDIA_H100_80GB (compute capability 9.0): TensorFlow 2.21.0's wheel "
                                    "ships no kernels for this GPU, only compute_90 PTX")


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


# --- 2026's GPUs: every machine type of the table, written and validated -------------------------

GPU_JOBS = {
    "h100": ["--machine-type", "a3-highgpu-8g", "--accelerator-type", "NVIDIA_H100_80GB", "--accelerator-count", "8"],
    "h100-mega": ["--machine-type", "a3-megagpu-8g", "--accelerator-type", "NVIDIA_H100_MEGA_80GB", "--accelerator-count", "8"],
    "h200": ["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H200_141GB", "--accelerator-count", "8"],
    "b200": ["--machine-type", "a4-highgpu-8g", "--accelerator-type", "NVIDIA_B200", "--accelerator-count", "8"],
    "l4": ["--machine-type", "g2-standard-24", "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "2"],
    "rtx-pro-6000": ["--machine-type", "g4-standard-48", "--accelerator-type", "NVIDIA_RTX_PRO_6000", "--accelerator-count", "1"],
}


def custom_job_spec(target, argv, trainer_args=()):
    args = submit_job.build_parser().parse_args([target, "--dry-run", "--image-uri", CPU, "--gpu-image-uri", GPU, *argv])
    args.trainer_args = list(trainer_args)
    return submit_job.build_spec(args)[1]


def validated(target, spec):
    """The spec loaded into aiplatform v1's own message, unknown fields failing; its CustomJobSpec."""
    from google.cloud import aiplatform_v1

    if target == "vertex":
        return aiplatform_v1.CustomJob.from_json(json.dumps(spec), ignore_unknown_fields=False).job_spec
    return aiplatform_v1.HyperparameterTuningJob.from_json(json.dumps(spec), ignore_unknown_fields=False).trial_job_spec


@pytest.mark.parametrize("target", ["vertex", "hptune"])
@pytest.mark.parametrize("gpu", GPU_JOBS)
def test_specs_for_current_gpus_print_and_validate(target, gpu):
    result = run_module("scripts.submit_job", target, "--dry-run", "--workers", "3", "--image-uri", CPU,
                        "--gpu-image-uri", GPU, *GPU_JOBS[gpu], env=clean_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    job_spec = validated(target, json.loads(result.stdout))
    machine = job_spec.worker_pool_specs[1].machine_spec
    given = dict(zip(GPU_JOBS[gpu][::2], GPU_JOBS[gpu][1::2]))
    assert (machine.machine_type, machine.accelerator_type.name, machine.accelerator_count) == (
        given["--machine-type"], given["--accelerator-type"], int(given["--accelerator-count"]))
    assert job_spec.worker_pool_specs[1].container_spec.image_uri == GPU
    # A3 Ultra, A4 and G4 boot from Hyperdisk only; the others from Vertex's default pd-ssd.
    hyperdisk = given["--machine-type"].startswith(("a3-ultragpu", "a4-", "g4-"))
    assert job_spec.worker_pool_specs[1].disk_spec.boot_disk_type == ("hyperdisk-balanced" if hyperdisk else "pd-ssd")


@pytest.mark.parametrize("argv, message", [
    (["--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_K80", "--accelerator-count", "1"],
     "NVIDIA_TESLA_K80 is retired: Compute Engine ended its support on 2024-05-01"),
    (["--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_P100", "--accelerator-count", "1"],
     "NVIDIA_TESLA_P100 is retired: Compute Engine shut P100 GPUs down on 2026-09-15"),
    (["--machine-type", "a4x-highgpu-4g", "--accelerator-type", "NVIDIA_GB200", "--accelerator-count", "4"],
     "machine type a4x-highgpu-4g has arm64 CPUs (NVIDIA Grace); the images are built for x86_64"),
    (["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H100_80GB", "--accelerator-count", "8"],
     "machine type a3-ultragpu-8g cannot take NVIDIA_H100_80GB (it takes NVIDIA_H200_141GB)"),
    (["--machine-type", "a4-highgpu-8g", "--accelerator-type", "NVIDIA_B200", "--accelerator-count", "4"],
     "machine type a4-highgpu-8g takes 8 NVIDIA_B200, not 4"),
    (["--machine-type", "a3-highgpu-8g"], "machine type a3-highgpu-8g comes with 8 NVIDIA_H100_80GB: give --accelerator-type"),
    (["--machine-type", "n1-standard-8", "--ps-machine-type", "a2-highgpu-1g", "--strategy", "pss", "--ps", "1"],
     "--ps-machine-type: machine type a2-highgpu-1g comes with 1 NVIDIA_TESLA_A100"),
    (["--evaluator", "--evaluator-machine-type", "n9-highmem-8"],
     "--evaluator-machine-type: machine type n9-highmem-8 is not one Vertex AI offers"),
    (["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H200_141GB", "--accelerator-count", "8",
      "--boot-disk-type", "pd-ssd"], "--boot-disk-type pd-ssd: machine type a3-ultragpu-8g boots only from hyperdisk-balanced"),
    (["--boot-disk-size-gb", "50"], "--boot-disk-size-gb must be between 100 and 64000, got 50"),
])
@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_retired_or_wrong_machines_exit_2_with_one_line(target, argv, message):
    result = run_module("scripts.submit_job", target, "--dry-run", "--image-uri", CPU, *argv, env=clean_env(), timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


# --- capacity and machine options ------------------------------------------------------------------

H200 = GPU_JOBS["h200"]
OPTION_FIELDS = [
    (["--flex-start", "--max-wait", "2h"], lambda spec: (spec.scheduling.strategy.name,
                                                         spec.scheduling.max_wait_duration.total_seconds()),
     ("FLEX_START", 7200)),
    (["--flex-start", "--max-wait", "0"], lambda spec: spec.scheduling.max_wait_duration.total_seconds(), 0),
    (["--reservation", "any"], lambda spec: [p.machine_spec.reservation_affinity.reservation_affinity_type.name
                                             for p in spec.worker_pool_specs], ["ANY_RESERVATION"] * 2),
    (["--reservation", "none"], lambda spec: spec.worker_pool_specs[0].machine_spec.reservation_affinity
     .reservation_affinity_type.name, "NO_RESERVATION"),
    (["--reservation", "projects/p/zones/us-central1-b/reservations/h200-block"],
     lambda spec: (spec.worker_pool_specs[1].machine_spec.reservation_affinity.reservation_affinity_type.name,
                   spec.worker_pool_specs[1].machine_spec.reservation_affinity.key,
                   list(spec.worker_pool_specs[1].machine_spec.reservation_affinity.values)),
     ("SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name",
      ["projects/p/zones/us-central1-b/reservations/h200-block"])),
    (["--persistent-resource-id", "h200-pool"], lambda spec: spec.persistent_resource_id, "h200-pool"),
    (["--boot-disk-size-gb", "500"], lambda spec: [(p.disk_spec.boot_disk_type, p.disk_spec.boot_disk_size_gb)
                                                   for p in spec.worker_pool_specs], [("hyperdisk-balanced", 500)] * 2),
    (["--enable-web-access"], lambda spec: spec.enable_web_access, True),
    (["--tensorboard", "projects/p/locations/us-central1/tensorboards/77", "--base-output-dir", "gs://b/run",
      "--service-account", "trainer@p.iam.gserviceaccount.com"],
     lambda spec: spec.tensorboard, "projects/p/locations/us-central1/tensorboards/77"),
    (["--disable-retries"], lambda spec: (spec.scheduling.disable_retries, spec.scheduling.restart_job_on_worker_restart),
     (True, False)),
]


@pytest.mark.parametrize("target", ["vertex", "hptune"])
@pytest.mark.parametrize("argv, field, expected", OPTION_FIELDS, ids=[" ".join(o[0][:2]) for o in OPTION_FIELDS])
def test_each_capacity_and_machine_option_reaches_a_validated_spec(target, argv, field, expected):
    spec = validated(target, custom_job_spec(target, [*H200, *argv]))
    assert field(spec) == expected


def test_without_options_the_spec_has_none_of_their_fields():
    job_spec = custom_job_spec("vertex", H200)["jobSpec"]
    assert not {"persistentResourceId", "enableWebAccess", "tensorboard"} & set(job_spec)
    assert job_spec["scheduling"] == {"restartJobOnWorkerRestart": True}
    assert all("reservationAffinity" not in p["machineSpec"] for p in job_spec["workerPoolSpecs"])


def test_a_reservation_is_taken_only_by_the_pools_on_the_reserved_machine():
    pools = custom_job_spec("vertex", [*H200, "--evaluator", "--evaluator-machine-type", "n1-standard-8",
                                       "--reservation", "any"])["jobSpec"]["workerPoolSpecs"]
    assert ["reservationAffinity" in p["machineSpec"] for p in pools if p] == [True, True, False]


def test_the_self_check_obtains_its_machine_as_the_job_would_and_uploads_nothing():
    args = submit_job.build_parser().parse_args(["vertex", "--self-check", "--image-uri", CPU, "--gpu-image-uri", GPU,
                                                 *H200, "--reservation", "any", "--boot-disk-size-gb", "200",
                                                 "--tensorboard", "projects/p/locations/l/tensorboards/1",
                                                 "--base-output-dir", "gs://b/r", "--service-account", "s@p.iam"])
    args.trainer_args = []
    job_spec = validated("vertex", submit_job.build_spec(args)[1])
    [pool] = job_spec.worker_pool_specs
    assert pool.machine_spec.reservation_affinity.reservation_affinity_type.name == "ANY_RESERVATION"
    assert (pool.disk_spec.boot_disk_type, pool.disk_spec.boot_disk_size_gb) == ("hyperdisk-balanced", 200)
    assert not job_spec.tensorboard and not job_spec.base_output_directory.output_uri_prefix


@pytest.mark.parametrize("argv, message", [
    (["--flex-start", "--spot"], "--flex-start and --spot are two values of one field, scheduling.strategy"),
    (["--max-wait", "1h"], "--max-wait is for --flex-start"),
    (["--flex-start", "--max-wait", "soon"], "--max-wait takes a duration such as 3600, 3600s, 90m, 12h or 2d; got 'soon'"),
    (["--flex-start", "--max-wait", "-5"], "--max-wait takes a duration"),
    (["--flex-start", "--timeout", str(8 * 86400)], "--flex-start takes jobs with a --timeout of at most 7 days"),
    (["--flex-start", "--evaluator", "--evaluator-machine-type", "n1-standard-8"],
     "--flex-start needs the same machine configuration in every worker pool (Dynamic Workload Scheduler), but the "
     "evaluator pool runs on n1-standard-8"),
    (["--flex-start", "--reduction-server", "4"], "--flex-start needs the same machine configuration in every worker pool"),
    (["--reservation", "any", "--spot"], "--reservation with --spot: a reservation's capacity cannot create Spot VMs"),
    (["--reservation", "projects/p/zones/z/reservations/r", "--flex-start"],
     "--reservation with --flex-start: Vertex AI runs Flex Start jobs without Compute Engine reservations"),
    (["--reservation", "any", "--persistent-resource-id", "pool-1"], "--reservation with --persistent-resource-id"),
    (["--reservation", "my-reservation"], "--reservation is any, none, or a reservation's full name"),
    (["--persistent-resource-id", "pool-1", "--spot"], "--persistent-resource-id with --spot: a job on a persistent "
                                                       "resource runs on the VMs the resource already holds"),
    (["--persistent-resource-id", "pool-1", "--flex-start"], "--persistent-resource-id with --flex-start"),
    (["--persistent-resource-id", "Pool_1"], "--persistent-resource-id is a persistent resource's ID"),
    (["--tensorboard", "projects/p/locations/l/tensorboards/1", "--service-account", "s@p.iam"],
     "--tensorboard needs --base-output-dir"),
    (["--tensorboard", "projects/p/locations/l/tensorboards/1", "--base-output-dir", "gs://b/r"],
     "--tensorboard needs --service-account"),
    (["--tensorboard", "my-board", "--base-output-dir", "gs://b/r", "--service-account", "s"],
     "--tensorboard is a Vertex AI TensorBoard's name"),
])
@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_combinations_vertex_refuses_exit_2_with_one_line(target, argv, message):
    result = run_module("scripts.submit_job", target, "--dry-run", "--image-uri", CPU, "--gpu-image-uri", GPU,
                        *H200, *argv, env=clean_env(), timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("gpu, machine, count", [("NVIDIA_TESLA_V100", "n1-standard-8", "1"),
                                                 ("NVIDIA_TESLA_T4", "n1-standard-8", "1"),
                                                 ("NVIDIA_RTX_PRO_6000", "g4-standard-48", "1")])
def test_flex_start_is_refused_on_gpus_dynamic_workload_scheduler_does_not_provision(gpu, machine, count):
    result = run_module("scripts.submit_job", "vertex", "--dry-run", "--image-uri", CPU, "--flex-start",
                        "--machine-type", machine, "--accelerator-type", gpu, "--accelerator-count", count,
                        env=clean_env(), timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("submit_job: error: --flex-start needs GPUs Dynamic Workload Scheduler provisions "
                                    "(NVIDIA_TESLA_A100, NVIDIA_A100_80GB, NVIDIA_L4, NVIDIA_H100_80GB")
    assert f"this job asks for {gpu}" in result.stderr


def test_flex_start_on_cpu_machines_is_refused():
    result = run_module("scripts.submit_job", "vertex", "--dry-run", "--image-uri", CPU, "--flex-start",
                        env=clean_env(), timeout=120)
    assert result.returncode == 2 and "this job asks for none" in result.stderr


@pytest.mark.parametrize("target", ["jobset", "tfjob", "ai-platform"])
@pytest.mark.parametrize("option", [["--flex-start"], ["--reservation", "any"], ["--enable-web-access"],
                                    ["--reduction-server", "2"], ["--disable-retries"]])
def test_vertex_options_on_other_targets_exit_2(target, option):
    result = run_module("scripts.submit_job", target, "--image-uri", CPU, "--evaluator-image-uri", CPU, *option,
                        env=clean_env(), timeout=120)
    assert result.returncode == 2
    assert result.stderr == f"submit_job: error: {option[0]}: for the vertex and hptune targets ({target} has no such setting)\n"


# --- Reduction Server ----------------------------------------------------------------------------

REDUCER_JOB = [*H200, "--workers", "3", "--reduction-server", "4"]


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_the_reducer_pool_is_worker_pool_2_with_googles_image_and_machine(target):
    spec = custom_job_spec(target, REDUCER_JOB, ["--epochs", "3"])
    job_spec = validated(target, spec)
    reducers = job_spec.worker_pool_specs[2]
    assert reducers.replica_count == 4 and reducers.machine_spec.machine_type == "n1-highcpu-16"
    assert not reducers.machine_spec.accelerator_count  # reducers use no GPUs
    assert reducers.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    assert list(reducers.container_spec.args) == [] and list(reducers.container_spec.command) == []
    assert list(job_spec.worker_pool_specs[1].container_spec.args) == ["--epochs", "3"]
    assert job_spec.scheduling.restart_job_on_worker_restart  # an MWMS job


def test_the_reducer_machine_and_image_can_be_chosen():
    pools = custom_job_spec("vertex", [*REDUCER_JOB, "--reduction-server-machine-type", "n2-highcpu-16",
                                       "--reduction-server-image",
                                       "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"]
                            )["jobSpec"]["workerPoolSpecs"]
    assert pools[2]["machineSpec"] == {"machineType": "n2-highcpu-16"}
    assert pools[2]["containerSpec"]["imageUri"].startswith("europe-docker.pkg.dev/")


@pytest.mark.parametrize("argv, message", [
    (["--reduction-server", "2", "--strategy", "pss", "--ps", "1", *H200],
     "--reduction-server is for --strategy mwms: worker pool 2 holds either parameter servers or reducers"),
    (["--reduction-server", "2"], "--reduction-server needs GPU workers (--accelerator-type)"),
    (["--reduction-server", "2", *H200, "--reduction-server-image", "gcr.io/me/reducer:1"],
     "--reduction-server-image must be one of Google's Reduction Server images"),
    (["--reduction-server", "2", *H200, "--reduction-server-machine-type", "a2-highgpu-1g"],
     "--reduction-server-machine-type: machine type a2-highgpu-1g comes with 1 NVIDIA_TESLA_A100"),
    (["--reduction-server", "-1", *H200], "--reduction-server takes a number of reducers, got -1"),
])
def test_reducers_where_vertex_cannot_use_them_exit_2_with_one_line(argv, message):
    result = run_module("scripts.submit_job", "vertex", "--dry-run", "--image-uri", CPU, *argv, env=clean_env(), timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


def test_a_reducer_job_warns_once_what_the_image_needs():
    result = run_module("scripts.submit_job", "vertex", "--dry-run", "--image-uri", CPU, "--gpu-image-uri", GPU,
                        *GPU_JOBS["l4"], "--reduction-server", "2", env=clean_env(), timeout=120)
    assert result.returncode == 0
    [warning] = result.stderr.splitlines()
    assert warning.startswith("warning: --reduction-server: the workers' image must carry Google's NCCL plugin, the apt "
                              "package google-reduction-server")
    assert "docs/gpus.md#reduction-server" in warning


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_every_replica_of_a_reducer_job_is_told_what_vertex_tells_it(target):
    """Vertex names tasks by pool: the reducers are `workerpool2` and `ps` like parameter servers,
    and `job` (the spec) says pool 2 runs Google's image. The trainer must train MWMS over the
    chief and workers, with the reducers counted apart and never given to TensorFlow."""
    environments = jobspec.cluster_environments("vertex", custom_job_spec(target, REDUCER_JOB))
    assert len(environments) == 1 + 3 + 4
    reducer_hosts = [f"workerpool2-{i}:2222" for i in range(4)]
    for environment in environments:
        assert json.loads(environment["CLUSTER_SPEC"])["cluster"]["workerpool2"] == reducer_hosts
        assert json.loads(environment["TF_CONFIG"])["cluster"]["ps"] == reducer_hosts
    trainers, reducers = environments[:4], environments[4:]
    for environment in trainers:
        for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
            cluster = resolve({variable: environment[variable]})
            assert (cluster.num_ps, cluster.num_reducers, cluster.num_workers) == (0, 4, 4)
            assert set(cluster.tf_config["cluster"]) == {"chief", "worker"}
            from trainer import strategy

            assert strategy.choose("auto", cluster) == "multi_worker_mirrored"
    for environment in reducers:
        for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
            with pytest.raises(Exception, match="is a Reduction Server reducer"):
                resolve({variable: environment[variable]})


@pytest.mark.parametrize("target, strategy", [("vertex", ["--workers", "1"]), ("hptune", ["--workers", "1"]),
                                              ("vertex", ["--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator"])])
def test_a_users_image_without_trainer_args_runs_its_own_command(target, strategy):
    """`--image-uri` of an image built FROM ours with its own ENTRYPOINT (gcloud's autopackaging
    layout): no cassava flag given, so no pool gets args or a command that would replace its own."""
    spec = custom_job_spec(target, [*strategy, "--base-output-dir", "gs://b/job"])
    pools = (spec.get("jobSpec") or spec["trialJobSpec"])["workerPoolSpecs"]
    assert [pool for pool in pools if pool and ("args" in pool["containerSpec"] or "command" in pool["containerSpec"])] == []
    assert {pool["containerSpec"]["imageUri"] for pool in pools if pool} == {CPU}
