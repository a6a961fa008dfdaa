#!/usr/bin/env python3
"""Turns "MWMS on 1 chief + 3 workers with a V100 each" into a job, and shows it before it costs.

    python scripts/submit_job.py vertex      [options] [--dry-run] [-- TRAINER_ARGS]
    python scripts/submit_job.py hptune      [options] [--dry-run] [-- TRAINER_ARGS]
    python scripts/submit_job.py ai-platform [options]              [-- TRAINER_ARGS]   (retired service)
    python scripts/submit_job.py jobset      [options]              [-- TRAINER_ARGS]
    python scripts/submit_job.py tfjob       [options]              [-- TRAINER_ARGS]
    python scripts/submit_job.py trainjob    [options]              [-- TRAINER_ARGS]
    python scripts/submit_job.py local [local options] vertex|hptune [options] [-- TRAINER_ARGS]
    python scripts/submit_job.py local [local options] --spec JOB.json
    python scripts/submit_job.py local [--engine E] [--preempt POD@WHEN] jobset [options] [-- TRAINER_ARGS]
    python scripts/submit_job.py local [--engine E] [--preempt POD@WHEN] --jobset JOBSET.yaml
    python scripts/submit_job.py local [--engine E] [--preempt POD@WHEN] trainjob [options] [-- TRAINER_ARGS]
    python scripts/submit_job.py local [--engine E] [--preempt POD@WHEN] --trainjob TRAINJOB.yaml [--runtime RUNTIME.yaml]

`local` runs the CustomJob (or HyperparameterTuningJob) on this machine, one container per
replica, as Vertex AI would run it; with a JobSet, one container per pod, as Kubernetes and JobSet
would; with a TrainJob, the JobSet Kubeflow Trainer would build from it and its runtime, run the
same way. It needs docker or podman. The rehearsal is the package scripts/rehearsal/ (its
__init__ says which module does what).

--dry-run prints the spec (JSON for Vertex AI, YAML for the others) with no credentials and no
network. Without it, `vertex` and `hptune` submit through google-cloud-aiplatform and print the
job's resource name and console link; `jobset`, `tfjob` and `trainjob` always print, for `kubectl apply -f`.
`ai-platform` prints the config.yaml of AI Platform Training, the retired service (shut down on
2025-04-07, Vertex AI's deprecations page), which nothing runs any more: it is kept because its
cluster shape (a chief named `master` in CLUSTER_SPEC, and in TF_CONFIG without useChiefInTfConfig)
still reaches the trainer, and the tests check the trainer against it.
`jobset` is Kubernetes' own: a JobSet (jobset.x-k8s.io/v1alpha2, the JobSet controller), whose
pods find their cluster themselves (trainer/cluster.py). `trainjob` is Kubeflow Trainer v2's: a
TrainJob (trainer.kubeflow.org/v1alpha1) on the TensorFlow runtimes of manifests/runtimes/, which
Trainer turns into such a JobSet. `tfjob` is for clusters that still run Kubeflow training-operator
1.9, maintained only on its release-1.9 branch.
An inconsistent request is one line on stderr and exit code 2.
Needs the `submit` extra (pip install '.[submit]'); the training images never carry it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

if not __package__:  # run as a file (python scripts/submit_job.py): the repo root is where `scripts` is found
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts import jobspec  # noqa: E402
from scripts.rehearsal import jobset as rehearsal_jobset, session, storage, trainjob as rehearsal_trainjob  # noqa: E402
from scripts.rehearsal import vertex as rehearsal_vertex  # noqa: E402
from trainer import cli  # noqa: E402


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(tuple(item.split("=", 1)) for item in text.split(",") if item)  # type: ignore[misc]
    except ValueError:
        raise argparse.ArgumentTypeError(f"labels are key=value,key=value; got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="scripts/submit_job.py", description=__doc__.split("\n")[0],
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("target", choices=("vertex", "hptune", "ai-platform", "jobset", "tfjob", "trainjob"),
                        help="jobset: a Kubernetes JobSet (new clusters); tfjob: a Kubeflow TFJob, for clusters that "
                        "still run training-operator 1.9 (maintained only on its release-1.9 branch); ai-platform: "
                        "the format of AI Platform Training, a retired service (shut down on 2025-04-07, Vertex AI's "
                        "deprecations page), kept because its CLUSTER_SPEC and `master` chief still reach the "
                        "trainer; new jobs go to vertex; trainjob: a Kubeflow Trainer v2 TrainJob on the TensorFlow "
                        "runtimes of manifests/runtimes/")
    parser.add_argument("--dry-run", action="store_true", help="print the spec; no credentials, no network")
    parser.add_argument("--self-check", action="store_true",
                        help="vertex: instead of training, run `python -m trainer.selfcheck` on one replica of the "
                        "chief's machine, GPUs and image (arguments after -- go to the self-check)")
    parser.add_argument("--name", default="cassava-multiworker", help="display name / JobSet, TrainJob or TFJob name")
    parser.add_argument("--strategy", choices=("mwms", "pss"), default="mwms")
    parser.add_argument("--workers", type=int, default=1,
                        help="the workers besides the chief (worker pool 1; TF_CONFIG's worker list), in both strategies: "
                        "`python -m trainer.launch --replicas N+1` runs the same MultiWorkerMirrored job locally")
    parser.add_argument("--ps", type=int, default=0, help="parameter servers (pss)")
    parser.add_argument("--evaluator", action="store_true", help="add a side-car evaluator")
    parser.add_argument("--image-uri", required=True, help="CPU image, e.g. REGION-docker.pkg.dev/PROJECT/REPO/cassava-trainer-cpu:TAG (or tf-runtime-cpu)")
    parser.add_argument("--gpu-image-uri", default=None, help="image for pools with accelerators (default --image-uri)")
    parser.add_argument("--evaluator-image-uri", default=None, help="evaluator image (required for ai-platform)")
    parser.add_argument("--machine-type", default="n1-standard-8", help="chief and workers")
    parser.add_argument("--accelerator-type", default=None, help="e.g. NVIDIA_TESLA_V100, on chief and workers")
    parser.add_argument("--accelerator-count", type=int, default=0)
    parser.add_argument("--ps-machine-type", default="n1-standard-4")
    parser.add_argument("--evaluator-machine-type", default=None, help="default: the workers' machine and accelerators")
    parser.add_argument("--base-output-dir", default=None, help="gs:// prefix; Vertex sets AIP_MODEL_DIR etc. under it")
    parser.add_argument("--service-account", default=None)
    parser.add_argument("--network", default=None, help="projects/NUMBER/global/networks/NAME for VPC peering")
    parser.add_argument("--labels", type=parse_labels, default=(), help="key=value,key=value")
    faults = parser.add_argument_group("faults")
    faults.add_argument("--spot", action="store_true",
                        help="vertex/hptune: run on Spot VMs (scheduling.strategy SPOT); jobset, trainjob: on GKE Spot "
                        "nodes (nodeSelector and toleration cloud.google.com/gke-spot)")
    faults.add_argument("--timeout", type=int, default=None, metavar="SECONDS",
                        help="stop the job after this long (Vertex scheduling.timeout, AI Platform maxRunningTime, "
                        "TFJob and TrainJob activeDeadlineSeconds; JobSet: each Job's activeDeadlineSeconds, counted "
                        "again after a restart of the JobSet)")
    faults.add_argument("--max-restarts", type=int, default=jobspec.DEFAULT_MAX_RESTARTS,
                        help="tfjob: runPolicy.backoffLimit, the pod restarts allowed before the job fails; jobset: "
                        "failurePolicy.maxRestarts, the restarts of the whole JobSet, and the replacements each PSS "
                        "worker or evaluator Job may make of its pods; trainjob: the runtime's, which a TrainJob "
                        "cannot change")
    capacity = parser.add_argument_group(
        "capacity and machines (vertex, hptune; docs/gpus.md says which combinations Vertex AI takes)")
    capacity.add_argument("--flex-start", action="store_true",
                          help="obtain the GPUs through Dynamic Workload Scheduler (scheduling.strategy FLEX_START): "
                          "the job waits until every node can start together")
    capacity.add_argument("--max-wait", default=None, metavar="DURATION",
                          help="with --flex-start: how long to wait for the GPUs (scheduling.maxWaitDuration; 3600, "
                          "90m, 12h, 2d; 0 waits without limit; Vertex's default is 1 day)")
    capacity.add_argument("--reservation", default=None, metavar="any|none|projects/P/zones/Z/reservations/NAME",
                          help="consume a Compute Engine reservation on the chief's and workers' machines "
                          "(machineSpec.reservationAffinity): any matching one, none, or that one")
    capacity.add_argument("--persistent-resource-id", default=None, metavar="ID",
                          help="run on a Vertex AI persistent resource's VMs (persistentResourceId); the machine, "
                          "GPUs and boot disk must match one of its resource pools")
    capacity.add_argument("--boot-disk-type", default=None, metavar="TYPE",
                          help="the chief's and workers' boot disk: pd-ssd, pd-standard or hyperdisk-balanced "
                          "(default: the machine's own; A3 Ultra, A4 and G4 boot from hyperdisk-balanced only)")
    capacity.add_argument("--boot-disk-size-gb", type=int, default=None, metavar="GB",
                          help="the chief's and workers' boot disk size, 100 to 64000 (default 100)")
    capacity.add_argument("--enable-web-access", action="store_true",
                          help="an interactive shell into each replica while it runs (enableWebAccess)")
    capacity.add_argument("--tensorboard", default=None, metavar="projects/P/locations/L/tensorboards/ID",
                          help="upload the TensorBoard events to this Vertex AI TensorBoard (needs --base-output-dir "
                          "and --service-account)")
    capacity.add_argument("--disable-retries", action="store_true",
                          help="no restart or retry of any kind after the job starts (scheduling.disableRetries; "
                          "it overrides restartJobOnWorkerRestart)")
    reduction = parser.add_argument_group("Reduction Server (vertex, hptune; mwms on GPU workers)")
    reduction.add_argument("--reduction-server", type=int, default=0, metavar="REDUCERS",
                           help="add this many Reduction Server reducers (worker pool 2, Google's image): NCCL's "
                           "all-reduce between the GPU workers goes through them; the workers' image needs Google's "
                           "NCCL plugin (docs/gpus.md#reduction-server)")
    reduction.add_argument("--reduction-server-machine-type", default=jobspec.REDUCTION_SERVER_MACHINE_TYPE,
                           help="the reducers' machine; their total bandwidth should match the workers'")
    reduction.add_argument("--reduction-server-image", default=jobspec.REDUCTION_SERVER_IMAGES[0],
                           help="Google's image, from the multi-region nearest the job (us-, europe- or asia-docker)")
    parser.add_argument("--project", default=os.environ.get("GOOGLE_CLOUD_PROJECT"), help="for submitting")
    parser.add_argument("--region", default="us-central1")
    parser.add_argument("--namespace", default="default", help="jobset/trainjob/tfjob namespace")
    parser.add_argument("--queue", default=None, metavar="LOCALQUEUE",
                        help="jobset, trainjob: the Kueue LocalQueue that admits the JobSet or TrainJob (label "
                        "kueue.x-k8s.io/queue-name)")
    tuning = parser.add_argument_group("tuning (hptune; ai-platform with --tune)")
    tuning.add_argument("--tune", action="store_true", help="ai-platform: add a hyperparameters block")
    tuning.add_argument("--metric", default="accuracy", help="the tag cassava.task reports (--hypertune-metric)")
    tuning.add_argument("--goal", choices=("MAXIMIZE", "MINIMIZE"), default="MAXIMIZE")
    tuning.add_argument("--max-trials", type=int, default=8)
    tuning.add_argument("--parallel-trials", type=int, default=2)
    tuning.add_argument("--learning-rate-range", default="1e-5,1e-2", help="min,max on a log scale")
    tuning.add_argument("--batch-sizes", default="32,64,128", help="per-replica batch sizes to try")
    return parser


def vertex_options(args) -> jobspec.VertexOptions:
    """The capacity and machine options, refused with one line on a target that has none of them."""
    options = jobspec.VertexOptions(
        flex_start=args.flex_start,
        max_wait_seconds=None if args.max_wait is None else jobspec.parse_duration(args.max_wait, "--max-wait"),
        reservation=args.reservation, persistent_resource_id=args.persistent_resource_id,
        boot_disk_type=args.boot_disk_type, boot_disk_size_gb=args.boot_disk_size_gb,
        enable_web_access=args.enable_web_access, tensorboard=args.tensorboard, disable_retries=args.disable_retries)
    given = options.given() + (["--reduction-server"] if args.reduction_server else [])
    if given and args.target not in ("vertex", "hptune"):
        raise jobspec.SpecError(f"{', '.join(given)}: for the vertex and hptune targets ({args.target} has no such setting)")
    return options


def build_request(args) -> jobspec.JobRequest:
    if args.target == "ai-platform" and args.evaluator and not args.evaluator_image_uri:
        raise jobspec.SpecError("an AI Platform evaluator needs --evaluator-image-uri (gcloud has no flag for it; it goes in config.yaml)")
    return jobspec.build_request(
        name=args.name, strategy=args.strategy, workers=args.workers, ps=args.ps, evaluator=args.evaluator,
        image_uri=args.image_uri, gpu_image_uri=args.gpu_image_uri, evaluator_image_uri=args.evaluator_image_uri,
        machine_type=args.machine_type, accelerator_type=args.accelerator_type, accelerator_count=args.accelerator_count,
        ps_machine_type=args.ps_machine_type, evaluator_machine_type=args.evaluator_machine_type,
        trainer_args=args.trainer_args, base_output_dir=args.base_output_dir, service_account=args.service_account,
        network=args.network, labels=args.labels, spot=args.spot, timeout_seconds=args.timeout,
        max_restarts=args.max_restarts, reducers=args.reduction_server,
        reducer_machine_type=args.reduction_server_machine_type, reducer_image_uri=args.reduction_server_image,
        vertex=vertex_options(args),
    )


def build_spec(args) -> tuple[str, dict]:
    """(format, spec) for the target; raises jobspec.SpecError on an inconsistent request."""
    request = build_request(args)
    try:
        low, high = (float(v) for v in args.learning_rate_range.split(","))
        batch_sizes = tuple(int(v) for v in args.batch_sizes.split(","))
    except ValueError:
        raise jobspec.SpecError("--learning-rate-range is MIN,MAX and --batch-sizes is N,N,...") from None
    if not 0 < low < high:
        raise jobspec.SpecError(f"--learning-rate-range needs 0 < min < max, got {low},{high}")
    if args.parallel_trials > args.max_trials or args.max_trials < 1:
        raise jobspec.SpecError("--parallel-trials cannot exceed --max-trials, which must be at least 1")
    tuning = jobspec.Tuning(args.metric, args.goal, args.max_trials, args.parallel_trials, (low, high), batch_sizes)
    if args.self_check and args.target != "vertex":
        raise jobspec.SpecError("--self-check is for the vertex target")
    if args.queue and args.target not in ("jobset", "trainjob"):
        raise jobspec.SpecError("--queue is for the jobset and trainjob targets")
    if args.target == "vertex":
        if args.self_check:
            # The args after -- are the self-check's own, untouched by the strategy.
            return "json", jobspec.vertex_selfcheck_job(dataclasses.replace(request, trainer_args=tuple(args.trainer_args)))
        return "json", jobspec.vertex_custom_job(request)
    if args.target == "hptune":
        return "json", jobspec.vertex_tuning_job(request, tuning)
    if args.target == "ai-platform":
        return "yaml", jobspec.ai_platform_config(request, args.region, tuning if args.tune else None)
    if args.target == "jobset":
        return "yaml", jobspec.jobset_manifest(request, args.namespace, args.queue)
    if args.target == "trainjob":
        return "yaml", jobspec.trainjob_manifest(request, args.namespace, args.queue)
    return "yaml", jobspec.tfjob_manifest(request, args.namespace)


def yaml_header(spec: dict) -> str:
    """The comment lines printed above a YAML spec: what it is and what it needs."""
    if spec.get("kind") == "JobSet":
        return jobspec.jobset_header(spec)
    if spec.get("kind") == "TFJob":
        return jobspec.TFJOB_HEADER
    if spec.get("kind") == "TrainJob":
        return jobspec.trainjob_header(spec)
    if "trainingInput" in spec:
        return jobspec.AI_PLATFORM_HEADER
    return ""


def submit(target: str, spec: dict, project: str | None, region: str) -> None:
    """Creates the job through the Vertex AI API with exactly the spec a dry run prints."""
    from google.cloud import aiplatform_v1

    if not project:
        raise jobspec.SpecError("submitting needs --project (or GOOGLE_CLOUD_PROJECT)")
    client = aiplatform_v1.JobServiceClient(client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})
    parent = f"projects/{project}/locations/{region}"
    if target == "vertex":
        job = client.create_custom_job(parent=parent, custom_job=aiplatform_v1.CustomJob.from_json(json.dumps(spec)))
        page = "training"
    else:
        job = client.create_hyperparameter_tuning_job(
            parent=parent, hyperparameter_tuning_job=aiplatform_v1.HyperparameterTuningJob.from_json(json.dumps(spec)))
        page = "hyperparameter-tuning-jobs"
    job_id = job.name.rsplit("/", 1)[-1]
    print(job.name)
    print(f"https://console.cloud.google.com/vertex-ai/locations/{region}/{page}/{job_id}?project={project}")


def build_local_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog="scripts/submit_job.py local", description=session.__doc__.split("\n")[0],
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--spec", help="a CustomJob or HyperparameterTuningJob JSON (what --dry-run prints, or your own)")
    parser.add_argument("--jobset", metavar="FILE",
                        help="run this JobSet's pods instead (YAML, '-' for stdin; or give `jobset` and its options): "
                             "hostnames, environment and restart rules as Kubernetes and JobSet apply them")
    parser.add_argument("--trainjob", metavar="FILE",
                        help="run this Kubeflow Trainer v2 TrainJob instead (YAML, '-' for stdin; or give `trainjob` and its "
                             "options): the JobSet Trainer v2.3.0 builds from it and its runtime, run as --jobset runs one")
    parser.add_argument("--runtime", action="append", default=[], metavar="FILE",
                        help="with a TrainJob: a ClusterTrainingRuntime or TrainingRuntime file (or folder) installed "
                             "besides manifests/runtimes/ (the same name: this one), e.g. with your own image (repeatable)")
    parser.add_argument("--engine", choices=("docker", "podman"), default=None, help="default: docker if its daemon answers, else podman")
    parser.add_argument("--real-gcs", action="store_true",
                        help="use Google's Cloud Storage with your Application Default Credentials instead of a local server")
    parser.add_argument("--stage", action="append", default=[], metavar="LOCAL=gs://BUCKET/PREFIX",
                        help="copy local files into the local server's bucket before the job (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="after the job, copy the local server's buckets to DIR/BUCKET/")
    parser.add_argument("--preempt", action="append", default=[], metavar="REPLICA@SECONDS",
                        help="a Spot preemption of REPLICA (e.g. workerpool1-0) SECONDS after the start, or REPLICA@/REGEX/ "
                        "when it prints a matching line: the job fails with STOCKOUT and restarts whole; for a JobSet "
                        "or a TrainJob, POD@SECONDS evicts that pod (DisruptionTarget) (repeatable)")
    parser.add_argument("--maintenance", action="append", default=[], metavar="REPLICA@SECONDS",
                        help="VM maintenance on REPLICA, as --preempt: it alone comes back on another machine "
                        "(every replica with restartJobOnWorkerRestart) (repeatable)")
    parser.add_argument("--replica-restarts", type=int, default=rehearsal_vertex.REPLICA_RESTARTS,
                        help="restarts of a replica after maintenance before the whole job is retried (Vertex: 5)")
    parser.add_argument("--job-retries", type=int, default=rehearsal_vertex.JOB_RETRIES,
                        help="retries of the whole job after a possibly transient exit (SIGABRT, SIGSEGV) (Vertex: 3)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="HOST[:PORT]",
                        help="a host the containers may reach through the proxy besides Cloud Storage, e.g. pypi.org "
                        "for a job that installs packages at start (port 443 unless given; repeatable)")
    parser.add_argument("--public-gcs", default=storage.PUBLIC_GCS, metavar="URL",
                        help="where objects of buckets the rehearsal does not hold are read from, anonymously "
                        "({host} is the Google host asked); 'none' answers them as missing")
    parser.add_argument("--seed", type=int, default=0, help="tuning: the random search's seed")
    parser.add_argument("--print-compose", action="store_true",
                        help="print the job as a compose file (docker compose -f - up) and exit")
    return parser


LOCAL_TARGETS = ("vertex", "hptune", "jobset", "trainjob")


def local_platform(options, target_args: list[str]) -> str:
    if options.trainjob or target_args[:1] == ["trainjob"]:
        return session.TRAINJOB
    return session.JOBSET if options.jobset or target_args[:1] == ["jobset"] else session.VERTEX


def local(argv: list[str]) -> int:
    """`local`: the spec from --spec / --jobset / --trainjob, or from the vertex/hptune/jobset/trainjob
    options, run on this machine."""
    split = argv.index("--") if "--" in argv else len(argv)
    target_at = next((i for i, a in enumerate(argv[:split]) if a in LOCAL_TARGETS), split)
    options = build_local_parser().parse_args(argv[:target_at])
    target_args, trainer_args = argv[target_at:split], argv[split + 1:]
    platform = local_platform(options, target_args)
    given = [flag for flag, value in (("--spec", options.spec), ("--jobset", options.jobset), ("--trainjob", options.trainjob))
             if value]
    if len(given) > 1 or (given and target_args):
        raise jobspec.SpecError("give one of --spec FILE, --jobset FILE, --trainjob FILE, or vertex/hptune/jobset/trainjob "
                                "followed by their options")
    if options.runtime and platform != session.TRAINJOB:
        raise jobspec.SpecError("--runtime is for a TrainJob (--trainjob FILE, or trainjob and its options)")
    if platform in (session.JOBSET, session.TRAINJOB):
        vertex_only = [flag for flag, value in (("--print-compose", options.print_compose), ("--seed", options.seed),
                                                ("--replica-restarts", options.replica_restarts != rehearsal_vertex.REPLICA_RESTARTS),
                                                ("--job-retries", options.job_retries != rehearsal_vertex.JOB_RETRIES))
                       if value]
        if vertex_only:
            raise jobspec.SpecError(f"{', '.join(vertex_only)}: for Vertex jobs, not a "
                                    f"{'JobSet' if platform == session.JOBSET else 'TrainJob'}")
    runtimes: list[dict] = []
    if target_args:
        args = build_parser().parse_args(target_args)
        args.trainer_args = trainer_args
        _, document = build_spec(args)
    elif options.trainjob:
        document, runtimes = rehearsal_trainjob.load(options.trainjob)
    elif options.jobset:
        document = rehearsal_jobset.load(options.jobset)
    elif options.spec:
        try:
            with open(options.spec) as file:
                document = json.load(file)
        except (OSError, ValueError) as error:
            raise jobspec.SpecError(f"--spec {options.spec}: {error}") from None
    else:
        raise jobspec.SpecError("local needs --spec FILE, --jobset FILE, or vertex/hptune/jobset followed by their options")
    if options.print_compose:
        import yaml

        _, job_spec = rehearsal_vertex.job_spec_of(document)
        credentials = storage.default_credentials() if options.real_gcs else None
        print(yaml.safe_dump(rehearsal_vertex.compose_file(job_spec, "local", credentials), sort_keys=False), end="")
        return 0
    if platform == session.TRAINJOB:
        # What a cluster holds: the runtimes `kubectl apply -f manifests/runtimes/` installs, then
        # those given (a later one of the same name replaces an earlier, as a later apply would).
        installed = rehearsal_trainjob.shipped_runtimes() + rehearsal_trainjob.runtimes_in(options.runtime) + runtimes
        document = rehearsal_trainjob.to_jobset(document, installed)
    return session.rehearse(platform, document, session.Options(
        engine=options.engine, real_gcs=options.real_gcs, stages=tuple(options.stage), keep_dir=options.keep,
        allow_hosts=tuple(options.allow_host), public_gcs=None if options.public_gcs == "none" else options.public_gcs,
        preempt=tuple(options.preempt), maintenance=tuple(options.maintenance),
        vertex=rehearsal_vertex.Options(options.replica_restarts, options.job_retries, options.seed)))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["local"]:
        try:
            return local(argv[1:])
        except jobspec.SpecError as error:
            print(f"submit_job: error: {error}", file=sys.stderr)
            return 2
    # Everything after `--` goes to cassava.task untouched.
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    args.trainer_args = argv[split + 1:]
    try:
        fmt, spec = build_spec(args)
        request = build_request(args)
        if args.self_check:  # one replica of the chief's pool is all the self-check runs
            request = dataclasses.replace(request, pools=(request.pool("chief"),))
        for warning in jobspec.accelerator_warnings(request):
            print(warning, file=sys.stderr)
        if args.target == "trainjob":
            for warning in jobspec.trainjob_warnings(request):
                print(warning, file=sys.stderr)
        if args.dry_run or args.target in ("ai-platform", "jobset", "tfjob", "trainjob"):
            if fmt == "json":
                print(json.dumps(spec, indent=2))
            else:
                import yaml

                print(yaml_header(spec) + yaml.safe_dump(spec, sort_keys=False), end="")
            return 0
        submit(args.target, spec, args.project, args.region)
    except jobspec.SpecError as error:
        print(f"submit_job: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
