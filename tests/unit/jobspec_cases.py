"""What the job-spec tests share: requests as submit_job.py takes them, the specs it builds from
them, and the platforms' own schemas to load them into (aiplatform v1's types, ml v1's discovery
document, the kubeflow-training SDK's models)."""

from __future__ import annotations

import json
import os
import re

from scripts import submit_job

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
