#!/usr/bin/env python3
"""Serves an exported model on a Vertex AI endpoint with the prediction image, or rehearses that here.

    python scripts/deploy_model.py vertex [options] [--dry-run] [-- SERVER_ARGS]
    python scripts/deploy_model.py local  [options] [--stage DIR=gs://...] [--request FILE] [-- SERVER_ARGS]

`vertex --dry-run` prints the three Vertex AI API requests that deploy the model (aiplatform v1
JSON, validated against its messages): the Model upload (the image, its port and routes, the
artifact URI), the endpoint's creation, and the deployment (machine type, min and max replicas).
No credentials, no network. Without --dry-run it sends them (google-cloud-aiplatform, the
`submit` extra) and prints the endpoint's name and console link; the deployment takes minutes.

`local` runs the same Model on this machine as Vertex would run it (scripts/rehearsal/endpoint.py):
the prediction image, given the variables Vertex gives a deployed model's container, with the
model read from a local Cloud Storage server at its gs:// URI, and its port published on
127.0.0.1 only. With --request it sends that request body (`python -m serving.predict MODEL
FILE... --vertex-request`, or `... --instances FILE.jsonl --vertex-request`, writes one), prints the
answer and stops; without, it serves until Ctrl-C. Everything it starts is removed when it ends.

Arguments after `--` go to the server (`python -m serving.server --help`: --signature, its limits).
An inconsistent request is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

if not __package__:  # run as a file (python scripts/deploy_model.py): the repo root is where `scripts` is found
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts import modelspec  # noqa: E402
from trainer import cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="scripts/deploy_model.py", description=__doc__.split("\n")[0],
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("target", choices=("vertex", "local"),
                        help="vertex: print (--dry-run) or send the requests; local: run the Model on this machine")
    parser.add_argument("--dry-run", action="store_true", help="vertex: print the requests; no credentials, no network")
    parser.add_argument("--project", default=os.environ.get("GOOGLE_CLOUD_PROJECT"), help="(vertex) the project ID")
    parser.add_argument("--region", default="us-central1")
    parser.add_argument("--image-uri", required=True,
                        help="the prediction image, e.g. REGION-docker.pkg.dev/PROJECT/REPO/tf-predictor-cpu:TAG")
    parser.add_argument("--artifact-uri", required=True, help="the export: the training job's gs://.../model directory")
    parser.add_argument("--display-name", default="cassava-classifier", help="of the Model, endpoint and deployed model")
    parser.add_argument("--model-id", default=None, help="the Model's ID (default: the display name)")
    parser.add_argument("--endpoint", default=None, metavar="ID",
                        help="the endpoint's ID (default: the model ID); with --no-create-endpoint, an existing one")
    parser.add_argument("--create-endpoint", action=argparse.BooleanOptionalAction, default=True,
                        help="create the endpoint (else deploy to --endpoint, which exists)")
    parser.add_argument("--dedicated-endpoint", action="store_true",
                        help="a dedicated public endpoint (its own DNS name, request bodies of up to 10 MB "
                        "instead of 1.5 MB)")
    parser.add_argument("--machine-type", default="n1-standard-4", help="each replica's machine (CPU)")
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--max-replicas", type=int, default=1, help="above --min-replicas, Vertex autoscales on CPU")
    parser.add_argument("--target-cpu-utilization", type=int, default=None, metavar="PERCENT",
                        help="the CPU use Vertex autoscales to (Vertex's default: 60)")
    parser.add_argument("--port", type=int, default=8080, help="the container's port (containerSpec.ports)")
    parser.add_argument("--predict-route", default="/predict")
    parser.add_argument("--health-route", default="/health")
    parser.add_argument("--service-account", default=None, help="the deployed model's service account")
    rehearsal = parser.add_argument_group("local")
    rehearsal.add_argument("--stage", action="append", default=[], metavar="DIR=gs://BUCKET/PATH",
                           help="copy a local export into the local Cloud Storage first (e.g. output/model=ARTIFACT_URI)")
    rehearsal.add_argument("--request", metavar="FILE",
                           help="send this request body, print the answer and stop (else serve until Ctrl-C)")
    rehearsal.add_argument("--local-port", type=int, default=0,
                           help="the port on 127.0.0.1 the container's port is published on (0: a free one)")
    rehearsal.add_argument("--engine", choices=("docker", "podman"), default=None,
                           help="default: docker if its daemon answers, else podman")
    return parser


def check_server_args(args: list[str]) -> None:
    """The arguments after -- must be ones serving.server takes (it is not imported with TensorFlow)."""
    from serving import server

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            server.build_parser({}).parse_args(args)
    except SystemExit as stop:
        if stop.code:
            raise modelspec.SpecError(f"after --: {said.getvalue().strip().removeprefix('python -m serving.server: error: ')}") from None


def deployment_of(args, server_args: list[str]) -> modelspec.Deployment:
    check_server_args(server_args)
    if args.target == "vertex" and not args.project:
        raise modelspec.SpecError("--project is needed (or GOOGLE_CLOUD_PROJECT)")
    model_id = args.model_id or args.display_name
    return modelspec.build(
        rehearsal=args.target == "local",
        project=args.project or "local", region=args.region, display_name=args.display_name, model_id=model_id,
        image_uri=args.image_uri,
        artifact_uri=args.artifact_uri, machine_type=args.machine_type, min_replicas=args.min_replicas,
        max_replicas=args.max_replicas, endpoint_id=args.endpoint or model_id, create_endpoint=args.create_endpoint,
        dedicated_endpoint=args.dedicated_endpoint, port=args.port, predict_route=args.predict_route,
        health_route=args.health_route, server_args=server_args, target_cpu_utilization=args.target_cpu_utilization,
        service_account=args.service_account)


def submit(deployment: modelspec.Deployment, requests: dict) -> None:
    """Sends the requests, each after the one before has finished, and prints the endpoint."""
    from google.cloud import aiplatform_v1

    options = {"api_endpoint": f"{deployment.region}-aiplatform.googleapis.com"}
    models = aiplatform_v1.ModelServiceClient(client_options=options)
    endpoints = aiplatform_v1.EndpointServiceClient(client_options=options)
    uploaded = models.upload_model(request=aiplatform_v1.UploadModelRequest.from_json(json.dumps(requests["uploadModel"])))
    print(f"uploading the Model {deployment.model_name} ...", file=sys.stderr, flush=True)
    uploaded.result()
    if requests["createEndpoint"] is not None:
        created = endpoints.create_endpoint(
            request=aiplatform_v1.CreateEndpointRequest.from_json(json.dumps(requests["createEndpoint"])))
        print(f"creating the endpoint {deployment.endpoint_name} ...", file=sys.stderr, flush=True)
        created.result()
    deployed = endpoints.deploy_model(request=aiplatform_v1.DeployModelRequest.from_json(json.dumps(requests["deployModel"])))
    print("deploying (this takes minutes) ...", file=sys.stderr, flush=True)
    deployed.result()
    print(deployment.endpoint_name)
    print(f"https://console.cloud.google.com/vertex-ai/online-prediction/locations/{deployment.region}/endpoints/"
          f"{deployment.endpoint_id}?project={deployment.project}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    server_args = argv[split + 1:]
    try:
        deployment = deployment_of(args, server_args)
        if args.target == "local":
            from scripts.rehearsal import endpoint, session

            return endpoint.run(deployment, session.Options(engine=args.engine, stages=tuple(args.stage)),
                                request_file=args.request, local_port=args.local_port)
        if args.stage or args.request or args.local_port or args.engine:
            raise modelspec.SpecError("--stage, --request, --local-port and --engine are for `local`")
        requests = modelspec.requests(deployment)
        modelspec.validate(requests)
        if args.dry_run:
            print(json.dumps(requests, indent=2))
            return 0
        submit(deployment, requests)
    except modelspec.SpecError as error:
        print(f"deploy_model: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
