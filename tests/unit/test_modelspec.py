"""scripts/deploy_model.py and scripts/modelspec.py: the Vertex AI requests that deploy the
prediction image, against aiplatform v1's own messages, and every inconsistent request refused in
one line."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from scripts import deploy_model, modelspec

IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/tf-predictor-cpu:v1"
BASE = ["vertex", "--dry-run", "--project", "my-project", "--image-uri", IMAGE, "--artifact-uri", "gs://my-bucket/runs/1/model"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = deploy_model.main(list(argv))
    except SystemExit as stop:
        code = stop.code
    return code, out.getvalue(), err.getvalue()


def printed(*argv: str) -> dict:
    code, out, err = run(*argv)
    assert code == 0, err
    return json.loads(out)


def test_the_requests_load_into_aiplatform_v1_messages_with_unknown_fields_failing():
    from google.cloud import aiplatform_v1

    requests = printed(*BASE, "--max-replicas", "4", "--target-cpu-utilization", "70", "--dedicated-endpoint",
                       "--service-account", "serve@my-project.iam.gserviceaccount.com", "--", "--max-instances", "16")
    upload = aiplatform_v1.UploadModelRequest.from_json(json.dumps(requests["uploadModel"]), ignore_unknown_fields=False)
    endpoint = aiplatform_v1.CreateEndpointRequest.from_json(json.dumps(requests["createEndpoint"]), ignore_unknown_fields=False)
    deploy = aiplatform_v1.DeployModelRequest.from_json(json.dumps(requests["deployModel"]), ignore_unknown_fields=False)
    container = upload.model.container_spec
    assert (container.image_uri, [p.container_port for p in container.ports]) == (IMAGE, [8080])
    assert (container.predict_route, container.health_route, list(container.args)) == ("/predict", "/health", ["--max-instances", "16"])
    assert upload.model.artifact_uri == "gs://my-bucket/runs/1/model"
    assert upload.parent == endpoint.parent == "projects/my-project/locations/us-central1"
    assert endpoint.endpoint.dedicated_endpoint_enabled is True
    # The deployment names the model and the endpoint the requests before it make.
    assert deploy.deployed_model.model == f"{upload.parent}/models/{upload.model_id}"
    assert deploy.endpoint == f"{endpoint.parent}/endpoints/{endpoint.endpoint_id}"
    resources = deploy.deployed_model.dedicated_resources
    assert (resources.machine_spec.machine_type, resources.min_replica_count, resources.max_replica_count) == ("n1-standard-4", 1, 4)
    assert [(m.metric_name, m.target) for m in resources.autoscaling_metric_specs] == [(modelspec.CPU_UTILIZATION_METRIC, 70)]
    assert dict(deploy.traffic_split) == {"0": 100}
    assert deploy.deployed_model.service_account == "serve@my-project.iam.gserviceaccount.com"


def test_validate_refuses_a_field_the_v1_messages_do_not_have():
    requests = printed(*BASE)
    requests["deployModel"]["deployedModel"]["dedicatedResources"]["replicas"] = 2
    with pytest.raises(modelspec.SpecError, match=r"^deployModel is not a valid DeployModelRequest: .*replicas"):
        modelspec.validate(requests)


def test_an_existing_endpoint_gets_no_create_request():
    requests = printed(*BASE, "--endpoint", "1234567", "--no-create-endpoint", "--model-id", "cassava_v2")
    assert requests["createEndpoint"] is None
    assert requests["deployModel"]["endpoint"] == "projects/my-project/locations/us-central1/endpoints/1234567"
    assert requests["deployModel"]["deployedModel"]["model"].endswith("/models/cassava_v2")


@pytest.mark.parametrize("extra, message", [
    (["--artifact-uri", "output/model"], "--artifact-uri must be gs://BUCKET/PATH"),
    (["--image-uri", "localhost/tf-predictor-cpu:dev"], "--image-uri localhost/tf-predictor-cpu:dev is a local tag"),
    (["--min-replicas", "3", "--max-replicas", "2"], "replicas: need 1 <= --min-replicas <= --max-replicas, got 3 and 2"),
    (["--min-replicas", "0"], "replicas: need 1 <= --min-replicas"),
    (["--machine-type", "g2-standard-8"], "--machine-type g2-standard-8 has accelerators"),
    (["--machine-type", "big"], "--machine-type 'big' is not a machine type"),
    (["--target-cpu-utilization", "150"], "--target-cpu-utilization is a percentage, 1-100, got 150"),
    (["--model-id", "1st"], "--model-id '1st': 1-63 of a-z"),
    (["--endpoint", "ends-"], "--endpoint 'ends-': up to 63"),
    (["--predict-route", "predict"], "--predict-route 'predict' must start with /"),
    (["--health-route", "/predict"], "--predict-route and --health-route must differ"),
    (["--stage", "output/model=gs://my-bucket/m"], "--stage, --request, --local-port and --engine are for `local`"),
    (["--", "--model-dir", "gs://x/y"], "--model-dir after --: Vertex AI sets these through AIP_*"),
    (["--", "--max-instances", "none"], "after --: argument --max-instances: expected a whole number, got 'none'"),
])
def test_an_inconsistent_request_is_one_line_and_exit_2(extra, message):
    argv = [*BASE, *extra[:extra.index("--")]] + extra[extra.index("--"):] if "--" in extra else [*BASE, *extra]
    code, out, err = run(*argv)
    assert code == 2 and out == "", out
    assert len(err.splitlines()) == 1 and err.startswith(f"deploy_model: error: {message}"), err


def test_a_malformed_flag_and_a_missing_project_are_one_line_and_exit_2(monkeypatch):
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    code, _, err = run("vertex", "--dry-run", "--image-uri", IMAGE, "--artifact-uri", "gs://my-bucket/m")
    assert (code, err) == (2, "deploy_model: error: --project is needed (or GOOGLE_CLOUD_PROJECT)\n")
    code, _, err = run(*BASE, "--max-replicas", "many")
    assert code == 2 and err == ("scripts/deploy_model.py: error: argument --max-replicas: invalid int value: 'many' "
                                 "(--help lists the flags)\n")


def test_the_container_gets_the_variables_vertex_documents():
    deployment = deploy_model.deployment_of(deploy_model.build_parser().parse_args(
        ["local", "--image-uri", "localhost/tf-predictor-cpu:dev", "--artifact-uri", "gs://my-bucket/m",
         "--port", "7080", "--predict-route", "/v1/predict", "--machine-type", "e2-standard-4"]), [])
    env = modelspec.container_environment(deployment, storage_uri="gs://caip-tenant-x/123/artifact",
                                          deployed_model_id="42", project_number="000000000000")
    assert env == {"AIP_HTTP_PORT": "7080", "AIP_HEALTH_ROUTE": "/health", "AIP_PREDICT_ROUTE": "/v1/predict",
                   "AIP_STORAGE_URI": "gs://caip-tenant-x/123/artifact", "AIP_MODE": "PREDICTION", "AIP_MODE_VERSION": "1.0.0",
                   "AIP_FRAMEWORK": "CUSTOM_CONTAINER", "AIP_MACHINE_TYPE": "e2-standard-4",
                   "AIP_PROJECT_NUMBER": "000000000000", "AIP_MODEL_NAME": "cassava-classifier",
                   "AIP_ENDPOINT_ID": "cassava-classifier", "AIP_DEPLOYED_MODEL_ID": "42"}
    # and the server takes its settings from exactly these
    from serving import server

    settings = server.settings_from([], env)
    assert (settings.port, settings.predict_route, settings.health_route, settings.model_dir) == (
        7080, "/v1/predict", "/health", "gs://caip-tenant-x/123/artifact")
