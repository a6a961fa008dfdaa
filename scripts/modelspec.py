"""A deployment of the prediction image to Vertex AI, as the API requests that make it, and the
environment Vertex gives the container: pure functions of one `Deployment`.

The requests are aiplatform v1's, in their JSON form (what `scripts/deploy_model.py vertex
--dry-run` prints, and `validate` loads into the v1 messages with unknown fields failing):
- UploadModelRequest: the Model, with `artifactUri` (the export, gs://) and `containerSpec`
  (image, port, predict and health routes, the server's flags as `args`); the routes are always
  given, so that the server's URLs do not depend on IDs Vertex picks at deployment;
- CreateEndpointRequest, unless the model goes to an endpoint that already exists;
- DeployModelRequest: machine type, min and max replicas, CPU autoscaling target, all traffic.
The Model and Endpoint IDs are chosen here (`modelId`, `endpointId`), so that each request can
name the resources of the ones before it.

`container_environment` is what Vertex AI's "Custom container requirements for prediction"
(https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements) says a
deployed model's container is given: AIP_HTTP_PORT (the first containerSpec port), the routes
(AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE: the Model's; without them Vertex would make them of the
endpoint's and the deployed model's IDs), AIP_STORAGE_URI (a copy of the artifactUri that Vertex
makes in a bucket of its own), and who and where it is (AIP_DEPLOYED_MODEL_ID, AIP_ENDPOINT_ID,
AIP_MACHINE_TYPE, AIP_MODE, ...), then containerSpec.env. The rehearsal (scripts/rehearsal/endpoint.py)
starts the image with exactly these.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from scripts.jobspec import SpecError  # one error for every command: one line, exit 2

# Vertex AI's own names for what a CPU autoscaling target measures.
CPU_UTILIZATION_METRIC = "aiplatform.googleapis.com/prediction/online/cpu/utilization"
# The server's flags that Vertex's variables set: the Model decides them, not its args.
SET_BY_VERTEX = ("--model-dir", "--host", "--port", "--health-route", "--predict-route")
MODEL_ID = re.compile(r"[a-z][a-z0-9_-]{0,62}")
ENDPOINT_ID = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?|[1-9][0-9]{0,8}")
MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*-[a-z]+-\d+")
# Machine families with accelerators: the image computes on the CPU (tensorflow-cpu) and would
# leave them idle.
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-", "ct", "tpu")
GS_URI = re.compile(r"gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])/(\S+?)/?")




@dataclasses.dataclass(frozen=True)
class Deployment:
    project: str
    region: str
    display_name: str
    model_id: str
    image_uri: str
    artifact_uri: str
    machine_type: str
    min_replicas: int
    max_replicas: int
    endpoint_id: str
    create_endpoint: bool
    dedicated_endpoint: bool
    port: int
    predict_route: str
    health_route: str
    server_args: tuple[str, ...] = ()
    target_cpu_utilization: int | None = None
    service_account: str | None = None

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def model_name(self) -> str:
        return f"{self.parent}/models/{self.model_id}"

    @property
    def endpoint_name(self) -> str:
        return f"{self.parent}/endpoints/{self.endpoint_id}"


def build(*, rehearsal: bool = False, **fields) -> Deployment:
    """A Deployment, checked; raises SpecError naming the first inconsistency. A rehearsal may run
    an image that only this machine has (a localhost/ tag)."""
    deployment = Deployment(**{**fields, "server_args": tuple(fields.get("server_args", ()))})
    if not GS_URI.fullmatch(deployment.artifact_uri):
        raise SpecError(f"--artifact-uri must be gs://BUCKET/PATH (the training job's model directory), "
                        f"got {deployment.artifact_uri!r}")
    if deployment.image_uri.startswith("localhost/") and not rehearsal:
        raise SpecError(f"--image-uri {deployment.image_uri} is a local tag: Vertex AI pulls the image from "
                        "Artifact Registry (scripts/supply_chain/images.sh push tf-predictor-cpu REPO prints its name)")
    if not MODEL_ID.fullmatch(deployment.model_id):
        raise SpecError(f"--model-id {deployment.model_id!r}: 1-63 of a-z, 0-9, _ and -, starting with a letter")
    if not ENDPOINT_ID.fullmatch(deployment.endpoint_id):
        raise SpecError(f"--endpoint {deployment.endpoint_id!r}: up to 63 of a-z, 0-9 and -, starting with a letter "
                        "and ending with a letter or digit, or a number of up to 9 digits")
    if deployment.machine_type.startswith(GPU_FAMILIES):
        raise SpecError(f"--machine-type {deployment.machine_type} has accelerators; the prediction image computes "
                        "on the CPU (tensorflow-cpu), so they would stay idle: choose a CPU machine type")
    if not MACHINE_TYPE.fullmatch(deployment.machine_type):
        raise SpecError(f"--machine-type {deployment.machine_type!r} is not a machine type (e.g. n1-standard-4)")
    if deployment.min_replicas < 1 or deployment.max_replicas < deployment.min_replicas:
        raise SpecError(f"replicas: need 1 <= --min-replicas <= --max-replicas, got {deployment.min_replicas} "
                        f"and {deployment.max_replicas}")
    if deployment.target_cpu_utilization is not None and not 1 <= deployment.target_cpu_utilization <= 100:
        raise SpecError(f"--target-cpu-utilization is a percentage, 1-100, got {deployment.target_cpu_utilization}")
    if not 0 < deployment.port < 65536:
        raise SpecError(f"--port {deployment.port} is outside 1-65535")
    for flag, route in (("--predict-route", deployment.predict_route), ("--health-route", deployment.health_route)):
        if not route.startswith("/"):
            raise SpecError(f"{flag} {route!r} must start with /")
    if deployment.predict_route == deployment.health_route:
        raise SpecError("--predict-route and --health-route must differ")
    set_here = [arg.split("=", 1)[0] for arg in deployment.server_args if arg.split("=", 1)[0] in SET_BY_VERTEX]
    if set_here:
        raise SpecError(f"{', '.join(set_here)} after --: Vertex AI sets these through AIP_* from the Model "
                        "(--port, --predict-route, --health-route and --artifact-uri of this command)")
    return deployment


def container_spec(deployment: Deployment) -> dict:
    spec = {"imageUri": deployment.image_uri, "ports": [{"containerPort": deployment.port}],
            "predictRoute": deployment.predict_route, "healthRoute": deployment.health_route}
    if deployment.server_args:
        spec["args"] = list(deployment.server_args)
    return spec


def upload_model_request(deployment: Deployment) -> dict:
    return {"parent": deployment.parent, "modelId": deployment.model_id,
            "model": {"displayName": deployment.display_name, "artifactUri": deployment.artifact_uri.rstrip("/"),
                      "containerSpec": container_spec(deployment)}}


def create_endpoint_request(deployment: Deployment) -> dict | None:
    if not deployment.create_endpoint:
        return None
    endpoint = {"displayName": deployment.display_name}
    if deployment.dedicated_endpoint:
        endpoint["dedicatedEndpointEnabled"] = True  # its own DNS name; bodies of up to 10 MB
    return {"parent": deployment.parent, "endpointId": deployment.endpoint_id, "endpoint": endpoint}


def deploy_model_request(deployment: Deployment) -> dict:
    resources = {"machineSpec": {"machineType": deployment.machine_type},
                 "minReplicaCount": deployment.min_replicas, "maxReplicaCount": deployment.max_replicas}
    if deployment.target_cpu_utilization is not None:
        resources["autoscalingMetricSpecs"] = [{"metricName": CPU_UTILIZATION_METRIC,
                                                "target": deployment.target_cpu_utilization}]
    deployed = {"model": deployment.model_name, "displayName": deployment.display_name, "dedicatedResources": resources}
    if deployment.service_account:
        deployed["serviceAccount"] = deployment.service_account
    # "0" is the model this request deploys: it takes all of the endpoint's traffic.
    return {"endpoint": deployment.endpoint_name, "deployedModel": deployed, "trafficSplit": {"0": 100}}


def requests(deployment: Deployment) -> dict:
    """The three requests, in the order they are sent (createEndpoint null when none is made)."""
    return {"uploadModel": upload_model_request(deployment), "createEndpoint": create_endpoint_request(deployment),
            "deployModel": deploy_model_request(deployment)}


def validate(printed: dict) -> None:
    """Loads each request into its aiplatform v1 message, unknown fields failing; raises SpecError."""
    from google.cloud import aiplatform_v1

    messages = {"uploadModel": aiplatform_v1.UploadModelRequest, "createEndpoint": aiplatform_v1.CreateEndpointRequest,
                "deployModel": aiplatform_v1.DeployModelRequest}
    for key, message in messages.items():
        if printed.get(key) is None:
            continue
        try:
            message.from_json(json.dumps(printed[key]), ignore_unknown_fields=False)
        except Exception as error:  # noqa: BLE001  (protobuf's parse errors have no common type)
            raise SpecError(f"{key} is not a valid {message.__name__}: {str(error).splitlines()[0]}") from None


def container_environment(deployment: Deployment, *, storage_uri: str, deployed_model_id: str,
                          project_number: str, env: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The variables a deployed model's container gets (the requirements page's table), then the
    Model's containerSpec.env. `storage_uri` is Vertex's copy of the artifacts."""
    variables = {
        "AIP_HTTP_PORT": str(deployment.port),
        "AIP_HEALTH_ROUTE": deployment.health_route,
        "AIP_PREDICT_ROUTE": deployment.predict_route,
        "AIP_STORAGE_URI": storage_uri,
        "AIP_MODE": "PREDICTION",
        "AIP_MODE_VERSION": "1.0.0",
        "AIP_FRAMEWORK": "CUSTOM_CONTAINER",
        "AIP_MACHINE_TYPE": deployment.machine_type,
        "AIP_PROJECT_NUMBER": project_number,
        "AIP_MODEL_NAME": deployment.model_id,
        "AIP_ENDPOINT_ID": deployment.endpoint_id,
        "AIP_DEPLOYED_MODEL_ID": deployed_model_id,
    }
    variables.update(dict(env))
    return variables


def artifact_location(uri: str) -> tuple[str, str]:
    """gs://BUCKET/PATH -> (BUCKET, PATH without a trailing /)."""
    match = GS_URI.fullmatch(uri)
    if not match:
        raise SpecError(f"not a gs://BUCKET/PATH: {uri!r}")
    return match.group(1), match.group(2).rstrip("/")
