"""A deployed Model's rules over the runner: the prediction image run here as Vertex AI runs a Model
deployed to an endpoint (`python scripts/deploy_model.py local ...`).

What Vertex does when it deploys the Model, done here with the same values (scripts/modelspec.py,
Vertex AI's "Custom container requirements for inference" page):
- it copies the artifactUri into a bucket of its own and tells the container where, in
  AIP_STORAGE_URI: here both buckets are on the rehearsal's local Cloud Storage (storage.py),
  which the container reaches at Google's host names through the proxy, with its CA; the
  container has no other way out;
- it runs the image with the Model's containerSpec (args, port) and the variables the page lists
  (AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE, AIP_MODE, ...);
- it sends traffic only once the health route answers 200; a container that exits before that
  fails the deployment;
- at undeployment it sends SIGTERM, then kills the container after a grace period.
The container's port is published on 127.0.0.1 only: nothing beyond this machine can reach it.
The run ends after one request (`request`: the answer is printed as `response STATUS BODY`) or at
Ctrl-C or SIGTERM (session.py), and removes all it made.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

from scripts import modelspec
from scripts.rehearsal import session as sessions
from scripts.rehearsal.runner import PREFIX, Container, Outcome, RehearsalError, Run, drive
from trainer.process.ports import free_port

# Where Vertex keeps its copy of a Model's artifacts (AIP_STORAGE_URI): a bucket of its own.
VERTEX_ARTIFACTS_BUCKET = "caip-tenant-local-artifacts"
LOCAL_PROJECT_NUMBER = "000000000000"
READY_SECONDS = 600  # for the health route to answer 200: TensorFlow's import and the model's load
STOP_GRACE_SECONDS = 30  # SIGTERM, then SIGKILL, as Kubernetes does by default
MODEL = "model"  # the container's name in the log



def get(port: int, path: str, timeout: float = 5) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class EndpointRules:
    """One deployed Model: ready once healthy, then one request or serving until stopped."""

    def __init__(self, deployment: modelspec.Deployment, output, *, network: str, storage_uri: str, port: int,
                 body: bytes | None):
        self.deployment, self.output, self.network = deployment, output, network
        self.port, self.body = port, body
        self.env = modelspec.container_environment(deployment, storage_uri=storage_uri, deployed_model_id=network[-8:],
                                                   project_number=LOCAL_PROJECT_NUMBER)
        self.ready = False

    def begin(self, run: Run, attempt: int) -> None:
        self.deadline = time.monotonic() + READY_SECONDS
        run.launch(Container(key=MODEL, name=f"{self.network}-{MODEL}", hostname=MODEL, image=self.deployment.image_uri,
                             args=tuple(self.deployment.server_args), env=self.env,
                             ports=(f"127.0.0.1:{self.port}:{self.deployment.port}",), grace=STOP_GRACE_SECONDS))

    def disrupt(self, run, container, fault) -> float:
        return STOP_GRACE_SECONDS

    def exited(self, run: Run, container: Container, code: int, fault):
        if not self.ready:
            return Outcome(1, f"the container exited with code {code} before {self.deployment.health_route} "
                              "answered 200: Vertex would fail the deployment")
        return Outcome(1, f"the container exited with code {code} while it served")

    def tick(self, run: Run, now: float):
        if self.ready:
            return None
        try:
            healthy = get(self.port, self.deployment.health_route) == 200
        except OSError:
            healthy = False
        if not healthy:
            if now > self.deadline:
                return Outcome(1, f"{self.deployment.health_route} did not answer 200 within {READY_SECONDS} s")
            time.sleep(0.3)
            return None
        self.ready = True
        url = f"http://127.0.0.1:{self.port}{self.deployment.predict_route}"
        self.output.note(f"ready: {url} (health {self.deployment.health_route} answers 200)", "INFO")
        if self.body is None:
            self.output.note(f"serving until Ctrl-C; e.g. curl -s -H 'Content-Type: application/json' "
                             f"--data @request.json {url}", "INFO")
            return None
        status, answer = post(self.port, self.deployment.predict_route, self.body)
        self.output.line("response", str(status), answer.decode(errors="replace"))
        return Outcome(0 if status == 200 else 1, f"answered the request with {status}")


def copy_artifacts(storage, artifact_uri: str, model_id: str) -> str:
    """Vertex's copy of the artifacts; returns its gs:// URI (AIP_STORAGE_URI)."""
    bucket, prefix = modelspec.artifact_location(artifact_uri)
    target = f"{model_id}/artifact"
    if not storage.copy(bucket, prefix, VERTEX_ARTIFACTS_BUCKET, target):
        raise RehearsalError(f"{artifact_uri}: no objects there (stage a local export with --stage DIR={artifact_uri})")
    return f"gs://{VERTEX_ARTIFACTS_BUCKET}/{target}"


def run(deployment: modelspec.Deployment, options: sessions.Options, *, request_file: str | None = None,
        local_port: int = 0) -> int:
    """Deploys the Model here; returns 0 when it served (and answered --request with 200)."""
    body = None
    if request_file:
        try:
            body = Path(request_file).read_bytes()
        except OSError as error:
            raise RehearsalError(f"--request {request_file}: {error.strerror}") from None
    bucket, _ = modelspec.artifact_location(deployment.artifact_uri)

    def play(session, storage, run_id: str, scratch: Path) -> int:
        if session.engine.run("image", "inspect", deployment.image_uri).returncode:
            raise RehearsalError(f"{deployment.image_uri} is not an image on this machine (bash scripts/supply_chain/images.sh "
                                 "build tf-predictor-cpu tags localhost/tf-predictor-cpu:dev); the rehearsal pulls nothing")
        storage_uri = copy_artifacts(storage, deployment.artifact_uri, deployment.model_id)
        port = local_port or free_port()
        network = f"{PREFIX}{run_id}"
        rules = EndpointRules(deployment, session.output, network=network, storage_uri=storage_uri, port=port, body=body)
        session.output.note(f"Model {deployment.model_id} from {deployment.artifact_uri} (copied to {storage_uri}), "
                            f"image {deployment.image_uri}, on 127.0.0.1:{port}; not emulated: machineType "
                            f"{deployment.machine_type}, replicas {deployment.min_replicas}-{deployment.max_replicas}")
        endpoint = Run(session, network)
        try:
            outcome = drive(endpoint, rules)
            session.output.note(outcome.message, "INFO" if outcome.code == 0 else "ERROR")
            return outcome.code
        finally:  # also when interrupted: Ctrl-C and SIGTERM undeploy
            stopped = endpoint.exits[MODEL][-1] if endpoint.exits[MODEL] else "-"
            session.output.note(f"undeployed: the container stopped (SIGTERM, then {STOP_GRACE_SECONDS} s) with "
                                f"exit code {stopped}")

    return sessions.run_session(options, [bucket, VERTEX_ARTIFACTS_BUCKET], play)
