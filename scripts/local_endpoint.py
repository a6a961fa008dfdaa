"""Runs a Model of the prediction image on this machine as Vertex AI runs a deployed one.

    python scripts/deploy_model.py local --image-uri IMAGE --artifact-uri gs://BUCKET/PATH \
        [--stage DIR=gs://BUCKET/PATH] [--request FILE] [-- SERVER_ARGS]

What Vertex does when it deploys the Model, done here with the same values (scripts/modelspec.py):
- it copies the artifactUri into a bucket of its own and tells the container where, in
  AIP_STORAGE_URI: here both buckets are on a local Cloud Storage server (scripts/local_gcs.py),
  which the container reaches at Google's host names through that server's proxy, with its CA;
  the container has no other way out;
- it runs the image with the Model's containerSpec (args, port) and the variables its
  custom-container page lists (AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE, AIP_MODE, ...);
- it sends traffic only once the health route answers 200;
- at undeployment it sends SIGTERM, then kills the container after a grace period.
The container runs on a network of its own, and its port is published on 127.0.0.1 only: nothing
beyond this machine can reach it. Every line it writes is shown as Cloud Logging would mark it
(stdout INFO, stderr ERROR).

The run ends after one request (--request FILE: the answer is printed) or at Ctrl-C or SIGTERM,
and removes all it made: the container, its network, the Cloud Storage server and its files.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

try:
    from scripts import engine as engine_settings, local_gcs, modelspec  # the one place these are imported
except ImportError:  # python scripts/deploy_model.py puts scripts/ itself first on sys.path
    import engine as engine_settings
    import local_gcs
    import modelspec

PREFIX = "vertex-endpoint-local-"  # of everything a run makes: containers, networks, scratch dirs
CA_IN_CONTAINER = "/etc/local-gcs/ca-bundle.pem"
# Where Vertex keeps its copy of a Model's artifacts (AIP_STORAGE_URI): a bucket of its own.
VERTEX_ARTIFACTS_BUCKET = "caip-tenant-local-artifacts"
LOCAL_PROJECT_NUMBER = "000000000000"
READY_SECONDS = 600  # for the health route to answer 200: TensorFlow's import and the model's load
STOP_GRACE_SECONDS = 30  # SIGTERM, then SIGKILL, as Kubernetes does by default


class EndpointError(modelspec.SpecError):
    """The rehearsal cannot go on; str() is one line."""


def say(source: str, severity: str, text: str) -> None:
    print(f"{source} {severity} {text.rstrip()}", flush=True)


def note(text: str, severity: str = "NOTICE") -> None:
    say("local-endpoint", severity, text)


def stage(server, pairs: list[str]) -> None:
    """LOCAL_DIR=gs://BUCKET/PATH: copies the files under LOCAL_DIR into the local server."""
    for pair in pairs:
        local, _, target = pair.partition("=")
        try:
            bucket, prefix = modelspec.artifact_location(target)
        except modelspec.SpecError:
            bucket = prefix = None
        root = Path(local)
        if bucket is None or not root.is_dir():
            raise EndpointError(f"--stage takes LOCAL_DIR=gs://BUCKET/PATH with an existing LOCAL_DIR; got {pair!r}")
        server.create_bucket(bucket)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            server.upload(bucket, f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())


def copy_artifacts(server, artifact_uri: str, model_id: str) -> str:
    """Vertex's copy of the artifacts; returns its gs:// URI (AIP_STORAGE_URI)."""
    bucket, prefix = modelspec.artifact_location(artifact_uri)
    server.create_bucket(bucket)
    names = [name for name in server.list(bucket, prefix + "/") if not name.endswith("/")]
    if not names:
        raise EndpointError(f"{artifact_uri}: no objects there (stage a local export with --stage DIR={artifact_uri})")
    server.create_bucket(VERTEX_ARTIFACTS_BUCKET)
    target = f"{model_id}/artifact"
    for name in names:
        server.upload(VERTEX_ARTIFACTS_BUCKET, f"{target}/{name[len(prefix) + 1:]}", server.download(bucket, name))
    return f"gs://{VERTEX_ARTIFACTS_BUCKET}/{target}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Engine:
    """docker or podman through its command line, with the project's settings (scripts/engine.py)."""

    def __init__(self, requested: str | None):
        try:
            chosen = engine_settings.settings(requested)
        except engine_settings.EngineError as error:
            raise EndpointError(str(error)) from None
        self.tool = chosen.engine
        self.environ = {**os.environ, **chosen.environ}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.tool, *args], capture_output=True, text=True, env=self.environ, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=self.environ)

    def network(self, name: str) -> tuple[str, str]:
        """Creates a network; (its subnet, this machine's address on it)."""
        created = self.run("network", "create", name)
        if created.returncode:
            raise EndpointError(f"{self.tool} network create: {last_line(created.stderr)}")
        info = json.loads(self.run("network", "inspect", name).stdout)[0]
        if "subnets" in info:  # podman
            return info["subnets"][0]["subnet"], info["subnets"][0]["gateway"]
        return info["IPAM"]["Config"][0]["Subnet"], info["IPAM"]["Config"][0]["Gateway"]  # docker


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


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


def _interrupt(*_):
    raise KeyboardInterrupt


def run(deployment: modelspec.Deployment, *, stages=(), request_file: str | None = None, local_port: int = 0,
        engine: str | None = None) -> int:
    """Deploys the Model here; returns 0 when it served (and answered --request with 200)."""
    body = None
    if request_file:
        try:
            body = Path(request_file).read_bytes()
        except OSError as error:
            raise EndpointError(f"--request {request_file}: {error.strerror}") from None
    tool = Engine(engine)
    if tool.run("image", "inspect", deployment.image_uri).returncode:
        raise EndpointError(f"{deployment.image_uri} is not an image on this machine (bash scripts/images.sh build serving "
                            "tags localhost/cassava-trainer-serving:dev); the rehearsal pulls nothing")
    run_id = uuid.uuid4().hex[:8]
    network = container = f"{PREFIX}{run_id}"
    scratch = Path(tempfile.mkdtemp(prefix=PREFIX))
    server = process = None
    made_network = False
    readers: list[threading.Thread] = []
    # Ctrl-C and SIGTERM both undeploy. (Signals reach only the main thread.)
    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)} if main else {}
    for signum in previous:
        signal.signal(signum, _interrupt)
    try:
        server = local_gcs.LocalGCS(scratch / "gcs", log=lambda line: note(line, "WARNING")).start()
        stage(server, list(stages))
        storage_uri = copy_artifacts(server, deployment.artifact_uri, deployment.model_id)
        subnet, gateway = tool.network(network)
        made_network = True
        proxy = server.serve_network(subnet, gateway)
        port = local_port or free_port()
        variables = modelspec.container_environment(deployment, storage_uri=storage_uri, deployed_model_id=run_id,
                                                    project_number=LOCAL_PROJECT_NUMBER)
        # How the container reaches the local Cloud Storage: Google's host names through the proxy,
        # trusting its CA, with a token TensorFlow's client sends without asking a metadata server.
        variables.update({"https_proxy": proxy, "HTTPS_PROXY": proxy, "no_proxy": "localhost,127.0.0.1,::1",
                          "NO_PROXY": "localhost,127.0.0.1,::1", **local_gcs.ca_variables(CA_IN_CONTAINER),
                          "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-gcs", "NO_GCE_CHECK": "true"})
        arguments = ["run", "--name", container, "--network", network, "-p", f"127.0.0.1:{port}:{deployment.port}",
                     "-v", f"{server.ca}:{CA_IN_CONTAINER}:ro"]
        for key, value in variables.items():
            arguments += ["-e", f"{key}={value}"]
        note(f"Model {deployment.model_id} from {deployment.artifact_uri} (copied to {storage_uri}), image "
             f"{deployment.image_uri}, on 127.0.0.1:{port} ({deployment.machine_type} is not emulated: it runs on this machine)")
        process = tool.popen(*arguments, deployment.image_uri, *deployment.server_args)
        for stream, severity in ((process.stdout, "INFO"), (process.stderr, "ERROR")):
            readers.append(threading.Thread(target=lambda s=stream, v=severity: [say("model", v, line) for line in s],
                                            daemon=True))
            readers[-1].start()
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if process.poll() is not None:
                for reader in readers:
                    reader.join(timeout=10)
                note(f"the container exited with code {process.returncode} before {deployment.health_route} "
                     "answered 200: Vertex would fail the deployment", "ERROR")
                return 1
            try:
                if get(port, deployment.health_route) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                note(f"{deployment.health_route} did not answer 200 within {READY_SECONDS} s", "ERROR")
                return 1
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}{deployment.predict_route}"
        note(f"ready: {url} (health {deployment.health_route} answers 200)", "INFO")
        if body is None:
            note(f"serving until Ctrl-C; e.g. curl -s -H 'Content-Type: application/json' --data @request.json {url}", "INFO")
            while process.poll() is None:
                time.sleep(0.5)
            note(f"the container exited with code {process.returncode}", "ERROR")
            return 1
        status, answer = post(port, deployment.predict_route, body)
        say("response", str(status), answer.decode(errors="replace"))
        return 0 if status == 200 else 1
    except KeyboardInterrupt:
        note("interrupted: undeploying", "WARNING")
        return 130
    finally:
        for signum in previous:  # a second Ctrl-C must not cut the cleanup short
            signal.signal(signum, signal.SIG_IGN)
        try:
            if process is not None:
                if process.poll() is None:
                    tool.run("stop", "-t", str(STOP_GRACE_SECONDS), container, timeout=STOP_GRACE_SECONDS + 60)
                try:
                    process.wait(timeout=STOP_GRACE_SECONDS + 30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                for reader in readers:
                    reader.join(timeout=10)
                exited = tool.run("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip()
                note(f"undeployed: the container stopped (SIGTERM, then {STOP_GRACE_SECONDS} s) with exit code "
                     f"{exited or process.returncode}")
            tool.run("rm", "-f", container)
            if made_network:
                tool.run("network", "rm", "-f", network)
            if server is not None:
                server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
