"""Kubeflow Trainer v2 for TensorFlow: the ClusterTrainingRuntimes of manifests/runtimes/ and the
TrainJobs `submit_job.py trainjob` writes, read by the API's own models and Kubernetes' schemas;
Trainer v2.3.0's rules that turn the pair into a JobSet (scripts/rehearsal/trainjob/), one table or
test per rule; what its webhooks refuse, in Trainer's words; and the cluster every pod of the
JobSet resolves by itself."""

from __future__ import annotations

import copy
import io
import json
import time

import pytest
import yaml

from helpers import run_main
from scripts import jobspec, submit_job
from scripts.jobspec import trainjob as trainjob_spec
from scripts.rehearsal import runner
from scripts.rehearsal.jobset import controller as jobset_controller, failure_policy, pods as jobset_pods
from scripts.rehearsal.trainjob import admission, build, manifest as manifests, patches, pod_sets, to_jobset
from trainer import exits
from trainer.cluster import ClusterConfigError, resolve

IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123"
GPU_IMAGE = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-gpu:abc123"
RUNTIMES = {runtime["metadata"]["name"]: runtime for runtime in manifests.shipped_runtimes()}
MWMS, PSS = "tensorflow-distributed", "tensorflow-parameter-server"
PSS_ARGS = ["--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator"]


# A TrainJob as a user writes it for kubectl (docs/kubernetes.md shows this one): two workers of
# MultiWorkerMirrored, the image's own command, numNodes given to the pods too.
HAND_WRITTEN_TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: mnist
spec:
  runtimeRef:
    name: tensorflow-distributed
  trainer:
    image: us-central1-docker.pkg.dev/my-project/trainers/mnist:v1
    numNodes: 2
    env:
    - name: TRAINJOB_NUM_NODES
      value: "2"
"""


def written(*argv: str, trainer_args=("--epochs", "2")) -> dict:
    """The TrainJob `submit_job.py trainjob` prints, as kubectl reads it back."""
    args = submit_job.build_parser().parse_args(["trainjob", "--name", "demo", "--image-uri", IMAGE, *argv])
    args.trainer_args = list(trainer_args)
    return yaml.safe_load(yaml.safe_dump(submit_job.build_spec(args)[1]))


def trainjob(runtime: str = MWMS, **spec) -> dict:
    """A TrainJob written by hand."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "demo"},
            "spec": {"runtimeRef": {"name": runtime}, **spec}}


def rjobs(jobset: dict) -> dict:
    return {rjob["name"]: rjob for rjob in jobset["spec"]["replicatedJobs"]}


def node_container(rjob: dict) -> dict:
    return next(c for c in rjob["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "node")


def env_of(container: dict) -> dict:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container.get("env", [])}


# --- The runtimes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [MWMS, PSS])
def test_each_runtime_loads_whole_into_the_trainer_api_models(name):
    runtime = RUNTIMES[name]
    trainjob_spec.check_schema(runtime)  # raises on a field the models drop or a wrong type
    from kubeflow_trainer_api.models import TrainerV1alpha1ClusterTrainingRuntime

    assert TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime).to_dict() == runtime


@pytest.mark.parametrize("name", [MWMS, PSS])
def test_every_job_and_pod_template_of_a_runtime_passes_the_strict_kubernetes_schemas(name):
    import kubernetes_validate

    for rjob in RUNTIMES[name]["spec"]["template"]["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"t-{rjob['name']}-0"},
               "spec": {**rjob["template"]["spec"], "template": rjob["template"]["spec"]["template"]}}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"t-{rjob['name']}-0-0"},
               "spec": rjob["template"]["spec"]["template"]["spec"]}
        for kubernetes_object in (job, pod):
            assert kubernetes_validate.validate(kubernetes_object, "1.33", strict=True) == "1.33"


def test_a_field_the_models_do_not_know_or_a_wrong_type_is_one_line():
    unknown = copy.deepcopy(RUNTIMES[MWMS])
    unknown["spec"]["mlPolicy"]["numNodez"] = 2
    with pytest.raises(jobspec.SpecError, match=r'strict decoding error: unknown field "spec.mlPolicy.numNodez"'):
        trainjob_spec.check_schema(unknown)
    wrong = trainjob(trainer={"numNodes": "many"})
    with pytest.raises(jobspec.SpecError, match=r"TrainJob demo: TrainerV1alpha1Trainer.numNodes: Input should be a valid "
                                                 "integer") as refused:
        trainjob_spec.check_schema(wrong)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name, jobs", [(MWMS, ("node",)), (PSS, ("node", "chief", "ps", "evaluator"))])
def test_runtimes_follow_trainers_conventions(name, jobs):
    """Named `<framework>-...`, labelled with their framework, an mlPolicy (the Kubeflow SDK refuses a
    runtime without one) that names no framework plugin (plainML), every replicatedJob labelled
    trainer with its one container `node` (what the ClusterTrainingRuntime webhook requires)."""
    runtime = RUNTIMES[name]
    assert name.startswith("tensorflow-")
    assert runtime["metadata"]["labels"] == {"trainer.kubeflow.org/framework": "tensorflow"}
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1}
    spec = runtime["spec"]["template"]["spec"]
    assert tuple(rjob["name"] for rjob in spec["replicatedJobs"]) == jobs == trainjob_spec.RUNTIME_JOBS[name]
    for rjob in spec["replicatedJobs"]:
        assert pod_sets.ancestor_of(rjob) == "trainer"
        [container] = rjob["template"]["spec"]["template"]["spec"]["containers"]
        assert container["name"] == "node" and container["image"].endswith("/tf-runtime-cpu:v1")
        assert "command" not in container and "args" not in container  # the image's ENTRYPOINT (trainer.run) runs
    assert admission.admitted_runtime(runtime)  # its webhook admits it


@pytest.mark.parametrize("name", [MWMS, PSS])
def test_no_runtime_holds_a_tf_config_and_each_pod_gets_the_jobset_variables(name):
    for rjob in RUNTIMES[name]["spec"]["template"]["spec"]["replicatedJobs"]:
        env = node_container(rjob)["env"]
        names = [entry["name"] for entry in env]
        assert "TF_CONFIG" not in names
        # TRAINJOB_NUM_NODES is first, so that a TrainJob's entry takes its place before JOBSET_PODS reads it.
        assert names[0] == "TRAINJOB_NUM_NODES" and names.index("JOBSET_PODS") > 0
        assert env_of({"env": env})["JOBSET_PODS"].startswith("node=$(TRAINJOB_NUM_NODES)")
        assert env_of({"env": env})["JOBSET_NAME"] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}


# Exit code -> what the runtime's policies do with a pod that ends so, per role: bad input fails
# any role at once; a bug's code (1, 3) only a role replaced alone, as a task of a collective also
# exits 1 when a preempted peer is lost.
BAD_INPUT, OWN, RETRYABLE = (exits.CONFIG, 126, 127), (1, 3), (130, 137, 138, exits.RETRYABLE)


@pytest.mark.parametrize("name, role, alone", [(MWMS, "node", False), (PSS, "node", True), (PSS, "chief", False),
                                               (PSS, "ps", False), (PSS, "evaluator", True)])
def test_a_preempted_pod_is_retried_and_a_permanent_exit_fails_the_trainjob(name, role, alone):
    """The exit-code contract (trainer/exits.py) through the runtime's podFailurePolicy and the
    JobSet's failurePolicy: a retryable code or a disruption replaces the pod (a PSS worker or the
    evaluator alone, uncounted when disrupted) or restarts the JobSet; bad input fails the Job at
    once (PodFailurePolicy), which fails the JobSet, and so does any other code of a pod replaced
    alone; a task of the collective that exits 1 restarts the JobSet."""
    spec = RUNTIMES[name]["spec"]["template"]["spec"]
    job = rjobs({"spec": spec})[role]["template"]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    for code in BAD_INPUT:
        assert failure_policy.pod_failure_action(job, code, disrupted=False, container="node") == "FailJob"
    for code in OWN:
        assert failure_policy.pod_failure_action(job, code, disrupted=False, container="node") == (
            "FailJob" if alone else "Count")
    for code in RETRYABLE:
        assert failure_policy.pod_failure_action(job, code, disrupted=False, container="node") == "Count"
    assert failure_policy.pod_failure_action(job, 143, disrupted=True, container="node") == ("Ignore" if alone else "Count")
    # The Cloud Storage FUSE sidecar's own exit code never fails the Job.
    assert failure_policy.pod_failure_action(job, 1, disrupted=False, container="gke-gcsfuse-sidecar") == "Count"
    assert job["backoffLimit"] == (5 if alone else 0)
    policy = spec["failurePolicy"]
    assert failure_policy.jobset_failure_action(policy, role, "PodFailurePolicy") == "FailJobSet"
    assert failure_policy.jobset_failure_action(policy, role, "BackoffLimitExceeded") == "RestartJobSet"
    assert policy["restartStrategy"] == "BlockingRecreate" and policy["maxRestarts"] == jobspec.DEFAULT_MAX_RESTARTS


def test_the_trainjob_succeeds_when_its_workers_or_its_chief_and_evaluator_do():
    assert RUNTIMES[MWMS]["spec"]["template"]["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["node"]}
    assert RUNTIMES[PSS]["spec"]["template"]["spec"]["successPolicy"] == {"operator": "All",
                                                                          "targetReplicatedJobs": ["chief", "evaluator"]}


@pytest.mark.parametrize("name", [MWMS, PSS])
def test_every_pod_mounts_every_bucket_under_gcs_as_on_vertex(name):
    """GKE's Cloud Storage FUSE CSI driver, dynamic mounting (bucketName "_"), for the images' user;
    the pod annotation asks the driver for its sidecar."""
    for rjob in RUNTIMES[name]["spec"]["template"]["spec"]["replicatedJobs"]:
        template = rjob["template"]["spec"]["template"]
        assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
        assert node_container(rjob)["volumeMounts"] == [{"name": "gcs", "mountPath": "/gcs"}]
        [volume] = template["spec"]["volumes"]
        assert volume["csi"]["driver"] == jobset_pods.GCS_FUSE_DRIVER
        assert volume["csi"]["volumeAttributes"]["bucketName"] == "_"
        assert "uid=1000,gid=1000" in volume["csi"]["volumeAttributes"]["mountOptions"]


# --- The TrainJob submit_job.py writes --------------------------------------------------------------

REQUESTS = {
    "mwms": ["--workers", "1"],
    "mwms-gpu": ["--workers", "3", "--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_V100",
                 "--accelerator-count", "2", "--gpu-image-uri", GPU_IMAGE],
    "pss": [*PSS_ARGS, "--base-output-dir", "gs://bucket/run-1"],
    "spot-queue-timeout": ["--workers", "1", "--spot", "--queue", "team-a", "--timeout", "7200", "--labels", "team=vision",
                           "--namespace", "ml", "--service-account", "trainer@my-project.iam.gserviceaccount.com"],
}
# (runtime, numNodes, the node image) of each request
EXPECTED = {"mwms": (MWMS, 2, IMAGE), "mwms-gpu": (MWMS, 4, GPU_IMAGE), "pss": (PSS, 2, IMAGE),
            "spot-queue-timeout": (MWMS, 2, IMAGE)}


@pytest.mark.parametrize("request_name", REQUESTS)
def test_the_written_trainjob_loads_whole_into_the_trainer_api_models(request_name):
    written_job = written(*REQUESTS[request_name])
    trainjob_spec.check_schema(written_job)
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    assert TrainerV1alpha1TrainJob.from_dict(written_job).to_dict() == written_job


@pytest.mark.parametrize("request_name", REQUESTS)
def test_the_written_trainjob_names_its_runtime_nodes_and_the_same_count_for_the_pods(request_name):
    written_job = written(*REQUESTS[request_name])
    runtime, nodes, image = EXPECTED[request_name]
    spec = written_job["spec"]
    assert spec["runtimeRef"] == {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
    assert spec["trainer"]["numNodes"] == nodes and spec["trainer"]["image"] == image
    assert env_of(spec["trainer"])["TRAINJOB_NUM_NODES"] == str(nodes)
    assert "TF_CONFIG" not in env_of(spec["trainer"])


def test_gpus_outputs_and_faults_reach_the_trainjob():
    gpu = written(*REQUESTS["mwms-gpu"])["spec"]["trainer"]
    assert gpu["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 2}}
    pss = written(*REQUESTS["pss"])["spec"]["trainer"]
    assert env_of(pss)["AIP_MODEL_DIR"] == "gs://bucket/run-1/model/"
    assert env_of(pss)["AIP_CHECKPOINT_DIR"] == "gs://bucket/run-1/checkpoints/"
    assert pss["args"] == ["--strategy", "parameter_server", "--epochs", "2", "--model-dir", "gs://bucket/run-1/model"]
    faults = written(*REQUESTS["spot-queue-timeout"])
    assert faults["metadata"] == {"name": "demo", "namespace": "ml",
                                  "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "team-a"}}
    assert faults["spec"]["activeDeadlineSeconds"] == 7200
    [patch] = faults["spec"]["runtimePatches"]
    assert patch["manager"] == trainjob_spec.PATCH_MANAGER
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod == {"serviceAccountName": "trainer@my-project.iam.gserviceaccount.com",
                   "nodeSelector": {"cloud.google.com/gke-spot": "true"},
                   "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                                    "effect": "NoSchedule"}]}


def test_without_trainer_arguments_the_images_own_command_runs():
    assert "args" not in written("--workers", "1", trainer_args=())["spec"]["trainer"]


@pytest.mark.parametrize("argv, refusal", [
    (["--workers", "1", "--evaluator"], "--evaluator: the runtime tensorflow-distributed has no evaluator"),
    (["--strategy", "pss", "--workers", "2", "--ps", "2", "--evaluator"], "--ps 2: the runtime tensorflow-parameter-server has one"),
    (["--strategy", "pss", "--workers", "2", "--ps", "1"], "--strategy pss needs --evaluator"),
    ([*PSS_ARGS, "--evaluator-image-uri", GPU_IMAGE], "the evaluator's own machine or image"),
    (["--workers", "1", "--max-restarts", "2"], "--max-restarts 2: the runtime tensorflow-distributed restarts"),
    (["--workers", "1", "--name", "a" * 60], "too long for a TrainJob"),
    (["--workers", "1", "--name", "9lives"], "a TrainJob's name starts with a letter"),
    (["--workers", "1", "--reservation", "any"], "--reservation: for the vertex and hptune targets"),
])
def test_what_a_trainjob_cannot_say_is_refused_in_one_line(argv, refusal):
    result = run_main(submit_job.main, "trainjob", "--image-uri", IMAGE, *argv)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith("submit_job: error: ") and refusal in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_the_printed_trainjob_says_what_it_needs_and_pss_gpus_warn():
    result = run_main(submit_job.main, "trainjob", "--image-uri", IMAGE, *REQUESTS["mwms-gpu"])
    assert result.returncode == 0
    assert "kubectl apply -f manifests/runtimes/tensorflow-distributed.yaml" in result.stdout.split("apiVersion:")[0]
    pss_gpu = run_main(submit_job.main, "trainjob", "--image-uri", IMAGE, *PSS_ARGS, "--accelerator-type",
                       "NVIDIA_TESLA_V100", "--accelerator-count", "1", "--machine-type", "n1-standard-8")
    assert pss_gpu.returncode == 0 and "parameter server's and the evaluator's pods get the workers' GPUs" in pss_gpu.stderr


# --- Trainer's rules: TrainJob + runtime -> JobSet ---------------------------------------------------

@pytest.mark.parametrize("request_name", REQUESTS)
def test_every_pod_of_the_jobset_finds_itself_in_one_cluster(request_name):
    """The JobSet Trainer builds, its pods as Kubernetes starts them (jobset/pods.py), each resolving
    its cluster from its own env alone: one cluster for all, each its own task, no evaluator in it."""
    built = to_jobset(written(*REQUESTS[request_name]), list(RUNTIMES.values()))
    runtime, nodes, _ = EXPECTED[request_name]
    clusters, tasks = set(), []
    for pod in jobset_pods.jobset_pods(built.jobset):
        cluster = resolve(pod["env"])
        clusters.add(json.dumps(cluster.tf_config["cluster"], sort_keys=True))
        tasks.append((cluster.task_type, cluster.task_index))
        assert pod["env"]["JOBSET_PODS"].startswith(f"node={nodes}")
    [cluster] = [json.loads(c) for c in clusters]
    assert cluster["worker"] == [f"demo-node-0-{i}.demo:2222" for i in range(nodes)]
    if runtime == MWMS:
        assert set(cluster) == {"worker"} and tasks == [("worker", i) for i in range(nodes)]
    else:
        assert cluster["chief"] == ["demo-chief-0-0.demo:2222"] and cluster["ps"] == ["demo-ps-0-0.demo:2222"]
        assert ("evaluator", 0) in tasks and "evaluator" not in cluster


def test_worker_zero_of_a_multiworker_trainjob_is_its_chief():
    built = to_jobset(written("--workers", "1"), list(RUNTIMES.values()))
    chiefs = [resolve(pod["env"]).is_chief for pod in jobset_pods.jobset_pods(built.jobset)]
    assert chiefs == [True, False]


# numNodes (TrainJob), runtime mlPolicy.numNodes, runtime parallelism of a replicatedJob not labelled
# trainer -> the pods of each replicatedJob (trainingruntime.go:186-198, plainml.go:56-60).
@pytest.mark.parametrize("num_nodes, runtime_nodes, expected", [
    (None, 1, {"node": 1, "chief": 1, "ps": 1, "evaluator": 1}),
    (3, 1, {"node": 3, "chief": 1, "ps": 1, "evaluator": 1}),
    (3, 2, {"node": 3, "chief": 2, "ps": 2, "evaluator": 2}),  # every replicatedJob labelled trainer takes mlPolicy's
    (None, None, {"node": 1, "chief": 1, "ps": 1, "evaluator": 1}),
])
def test_num_nodes_sizes_the_first_trainer_job_and_ml_policy_every_other(num_nodes, runtime_nodes, expected):
    runtime = copy.deepcopy(RUNTIMES[PSS])
    runtime["spec"]["mlPolicy"] = {} if runtime_nodes is None else {"numNodes": runtime_nodes}
    trainer = {"numNodes": num_nodes} if num_nodes is not None else {}
    jobset = to_jobset(trainjob(PSS, trainer=trainer), [runtime]).jobset
    for name, rjob in rjobs(jobset).items():
        spec = rjob["template"]["spec"]
        assert (spec["parallelism"], spec["completions"], rjob["replicas"]) == (expected[name], expected[name], 1), name


def test_a_job_not_labelled_trainer_keeps_its_own_parallelism_and_container():
    runtime = copy.deepcopy(RUNTIMES[PSS])
    ps = rjobs(runtime["spec"]["template"])["ps"]
    del ps["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
    ps["template"]["spec"]["parallelism"] = 2
    jobset = to_jobset(trainjob(PSS, trainer={"numNodes": 3, "image": "mine:1", "args": ["go"]}), [runtime]).jobset
    built_ps = rjobs(jobset)["ps"]
    assert built_ps["template"]["spec"]["parallelism"] == built_ps["template"]["spec"]["completions"] == 2
    assert node_container(built_ps)["image"].endswith("tf-runtime-cpu:v1") and "args" not in node_container(built_ps)
    assert node_container(rjobs(jobset)["chief"])["image"] == "mine:1"


def test_the_trainjobs_image_command_args_and_env_override_the_runtimes_node_containers():
    env = [{"name": "TRAINJOB_NUM_NODES", "value": "3"}, {"name": "EXTRA", "value": "x"}]
    jobset = to_jobset(trainjob(PSS, trainer={"image": "mine:1", "command": ["python", "-m", "trainer.run", "--"],
                                              "args": ["python", "task.py"], "env": env, "numNodes": 3}),
                       list(RUNTIMES.values())).jobset
    for name, rjob in rjobs(jobset).items():
        container = node_container(rjob)
        assert (container["image"], container["command"], container["args"]) == (
            "mine:1", ["python", "-m", "trainer.run", "--"], ["python", "task.py"]), name
        names = [entry["name"] for entry in container["env"]]
        # Replaced where the runtime has it (before JOBSET_PODS, which refers to it), the rest appended.
        assert names[0] == "TRAINJOB_NUM_NODES" and names[-1] == "EXTRA" and names.count("TRAINJOB_NUM_NODES") == 1
        assert env_of(container)["TRAINJOB_NUM_NODES"] == "3"
    untouched = to_jobset(trainjob(MWMS), list(RUNTIMES.values())).jobset
    assert node_container(rjobs(untouched)["node"]) == node_container(rjobs(RUNTIMES[MWMS]["spec"]["template"])["node"])


def test_resources_per_node_merge_into_every_trainer_container_key_by_key():
    runtime = copy.deepcopy(RUNTIMES[MWMS])
    node_container(rjobs(runtime["spec"]["template"])["node"])["resources"] = {
        "limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "2"}}
    trainer = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": 2, "cpu": "8"}}}
    container = node_container(rjobs(to_jobset(trainjob(MWMS, trainer=trainer), [runtime]).jobset)["node"])
    assert container["resources"] == {"limits": {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": 2}, "requests": {"cpu": "2"}}
    without_policy = copy.deepcopy(runtime)
    del without_policy["spec"]["mlPolicy"]  # Trainer drops resourcesPerNode then (trainingruntime.go:200)
    dropped = node_container(rjobs(to_jobset(trainjob(MWMS, trainer=trainer), [without_policy]).jobset)["node"])
    assert dropped["resources"] == {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "2"}}


def test_the_runtimes_policies_network_and_labels_reach_the_jobset():
    runtime = copy.deepcopy(RUNTIMES[PSS])
    runtime["spec"]["template"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "n"}}
    built = to_jobset(trainjob(PSS, trainer={"numNodes": 2}), [runtime]).jobset
    template = runtime["spec"]["template"]["spec"]
    for field in ("failurePolicy", "successPolicy", "network"):
        assert built["spec"][field] == template[field], field
    assert built["metadata"] == {"name": "demo", "namespace": "default", "labels": {"team": "a"}, "annotations": {"note": "n"}}
    assert built["spec"]["suspend"] is False
    for name, rjob in rjobs(built).items():
        original = rjobs(runtime["spec"]["template"])[name]["template"]["spec"]
        assert rjob["template"]["spec"]["podFailurePolicy"] == original["podFailurePolicy"]
        assert rjob["template"]["spec"]["backoffLimit"] == original["backoffLimit"]


def patch(*replicated_jobs, manager="example.com/test", metadata=None) -> dict:
    template: dict = {"spec": {"replicatedJobs": list(replicated_jobs)}}
    if metadata:
        template["metadata"] = metadata
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


def pod_patch(job: str, pod_spec: dict, pod_metadata=None) -> dict:
    template: dict = {"spec": pod_spec}
    if pod_metadata:
        template["metadata"] = pod_metadata
    return {"name": job, "template": {"spec": {"template": template}}}


def test_runtime_patches_merge_as_kubernetes_strategic_merge_patch():
    """Maps key by key; containers, env, volumes and volumeMounts item by item on their keys (a
    volume keeping only the patch's keys); tolerations whole; labels onto the JobSet."""
    runtime = copy.deepcopy(RUNTIMES[MWMS])
    pod = rjobs(runtime["spec"]["template"])["node"]["template"]["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"pool": "a", "zone": "z1"}
    pod["tolerations"] = [{"key": "old", "operator": "Exists"}]
    pod["volumes"].append({"name": "cache", "emptyDir": {}})
    pod["containers"].append({"name": "sidecar", "image": "side:1", "env": [{"name": "A", "value": "1"}]})
    patches_ = [
        patch(pod_patch("node", {"nodeSelector": {"pool": "b"}, "tolerations": [{"key": "new", "operator": "Exists"}],
                                 "serviceAccountName": "sa",
                                 "volumes": [{"name": "gcs", "csi": {"volumeAttributes": {"bucketName": "mine"}}},
                                             {"name": "cache", "persistentVolumeClaim": {"claimName": "c"}},
                                             {"name": "extra", "emptyDir": {}}],
                                 "containers": [{"name": "node", "volumeMounts": [{"name": "extra", "mountPath": "/x"}]},
                                                {"name": "sidecar", "env": [{"name": "B", "value": "2"}]}]},
                        {"labels": {"pod": "p"}}),
              metadata={"labels": {"team": "t"}}),
        patch(pod_patch("node", {"nodeSelector": {"zone": "z2"}}), manager="example.com/second"),
    ]
    built = to_jobset(trainjob(MWMS, runtimePatches=patches_), [runtime]).jobset
    pod = rjobs(built)["node"]["template"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"pool": "b", "zone": "z2"}  # key by key, one patch after the other
    assert pod["spec"]["tolerations"] == [{"key": "new", "operator": "Exists"}]
    assert pod["spec"]["serviceAccountName"] == "sa"
    # retainKeys: a volume keeps the sources the patch names (cache loses its emptyDir), merged within.
    assert pod["spec"]["volumes"] == [
        {"name": "gcs", "csi": {"driver": "gcsfuse.csi.storage.gke.io",
                                "volumeAttributes": {"bucketName": "mine", "mountOptions": "implicit-dirs,uid=1000,gid=1000"}}},
        {"name": "cache", "persistentVolumeClaim": {"claimName": "c"}}, {"name": "extra", "emptyDir": {}}]
    node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
    assert node["volumeMounts"] == [{"name": "gcs", "mountPath": "/gcs"}, {"name": "extra", "mountPath": "/x"}]
    assert node["image"].endswith("tf-runtime-cpu:v1")  # untouched by the patch
    sidecar = next(c for c in pod["spec"]["containers"] if c["name"] == "sidecar")
    assert sidecar["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert pod["metadata"]["labels"] == {"pod": "p"} and pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    assert built["metadata"]["labels"] == {"team": "t"}


def test_strategic_merge_appends_a_new_item_and_keeps_the_order():
    merged = patches.strategic_merge({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                                     {"env": [{"name": "C", "value": "3"}, {"name": "A", "value": "9"}]})
    assert merged == {"env": [{"name": "A", "value": "9"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}]}
    assert patches.strategic_merge({"args": ["a", "b"]}, {"args": ["c"]}) == {"args": ["c"]}


# --- What the API server and Trainer's webhooks refuse ----------------------------------------------

def refusal(trainjob_document, runtimes=None) -> str:
    with pytest.raises(jobspec.SpecError) as refused:
        to_jobset(trainjob_document, list(RUNTIMES.values()) if runtimes is None else runtimes)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_trainjob_naming_an_unknown_runtime_is_refused_with_trainers_own_message():
    """ClusterTrainingRuntime.ValidateObjects (clustertrainingruntime.go:99-108): the cache's NotFound,
    wrapped in field.Invalid at spec.RuntimeRef (its JSON with the CRD's defaults), through the
    validating webhook, as the API server answers kubectl."""
    assert refusal(trainjob("tensorflow-nope")) == (
        'TrainJob demo: admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
        'spec.RuntimeRef: Invalid value: {"name":"tensorflow-nope","apiGroup":"trainer.kubeflow.org",'
        '"kind":"ClusterTrainingRuntime"}: ClusterTrainingRuntime.trainer.kubeflow.org "tensorflow-nope" not found: '
        'specified clusterTrainingRuntime must be created before the TrainJob is created')


def test_a_namespaced_runtime_is_found_in_the_trainjobs_namespace_only():
    namespaced = copy.deepcopy(RUNTIMES[MWMS])
    namespaced["kind"], namespaced["metadata"]["namespace"] = "TrainingRuntime", "team-a"
    job = trainjob(MWMS)
    job["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    assert refusal(job, [namespaced]).endswith(
        'spec.runtimeRef: Invalid value: {"name":"tensorflow-distributed","apiGroup":"trainer.kubeflow.org",'
        '"kind":"TrainingRuntime"}: TrainingRuntime.trainer.kubeflow.org "tensorflow-distributed" not found: '
        'specified trainingRuntime must be created before the TrainJob is created')
    job["metadata"]["namespace"] = "team-a"
    assert to_jobset(job, [namespaced]).jobset["metadata"]["namespace"] == "team-a"


@pytest.mark.parametrize("change, message", [
    (lambda j: j["spec"]["runtimeRef"].update(kind="PyTorchJob"), "denied the request: unsupported runtime: PyTorchJob.trainer.kubeflow.org"),
    (lambda j: j["spec"].update(initializer={"dataset": {"storageUri": "hf://x"}}),
     'spec.runtimeRef: Invalid value: {"name":"tensorflow-distributed","apiGroup":"trainer.kubeflow.org",'
     '"kind":"ClusterTrainingRuntime"}: must have dataset-initializer job when trainJob is configured with input datasetConfig'),
    (lambda j: j["spec"].update(runtimePatches=[patch(pod_patch("node", {"containers": [
        {"name": "node", "env": [{"name": "X", "value": "1"}]}]}))]),
     "must not have envs for the dataset-initializer, model-initializer, node containers"),
    (lambda j: j["spec"].update(runtimePatches=[patch(manager="nodomain")]),
     'spec.runtimePatches.manager: Invalid value: "nodomain": must be a domain-prefixed path (such as "acme.io/foo")'),
    (lambda j: j["metadata"].update(name="Demo"), "metadata.name must match RFC 1035 DNS label format"),
    (lambda j: j["spec"].update(activeDeadlineSeconds=0), "spec.activeDeadlineSeconds in body should be greater than or equal to 1"),
    (lambda j: j["spec"].update(runtimePatches=[patch(), patch()]),
     'spec.runtimePatches[1]: Duplicate value: map[string]interface {}{"manager":"example.com/test"}'),
    (lambda j: j["spec"].update(managedBy="kueue.x-k8s.io/multikueue"), "MultiKueue"),
    (lambda j: j["spec"].update(suspend=True), "spec.suspend is true"),
    (lambda j: j["spec"].update(trainer={"imagePullPolicy": "Always"}), 'unknown field "spec.trainer.imagePullPolicy"'),
])
def test_what_trainer_refuses_is_refused_before_anything_runs(change, message):
    job = trainjob(MWMS)
    change(job)
    assert message in refusal(job)


def test_a_patch_naming_a_container_the_runtime_lacks_passes_the_webhook_but_not_the_api_server():
    """JobSet.Validate lists the names from the template the patches are already merged into
    (trainingruntime.go:304-316 then jobset.go:99-110), so the patch's container is there, and the
    JobSet Trainer builds has a container without an image."""
    job = trainjob(MWMS, runtimePatches=[patch(pod_patch("node", {"containers": [
        {"name": "helper", "volumeMounts": [{"name": "gcs", "mountPath": "/g"}]}]}))])
    assert "containers[1].image: Required value" in refusal(job)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["spec"]["template"]["spec"]["replicatedJobs"][0].update(replicas=2),
     "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1"),
    (lambda r: node_container(r["spec"]["template"]["spec"]["replicatedJobs"][0]).update(name="trainer"),
     "must contain the required container for the ancestor: trainer"),
    (lambda r: r["spec"]["mlPolicy"].update(torch={}), "mlPolicy.torch is Trainer's torch plugin"),
])
def test_a_runtime_trainer_or_its_webhook_would_not_take_is_refused(change, message):
    runtime = copy.deepcopy(RUNTIMES[MWMS])
    change(runtime)
    assert message in refusal(trainjob(MWMS), [runtime])


def test_a_deprecated_runtime_warns_as_the_webhook_does():
    runtime = copy.deepcopy(RUNTIMES[MWMS])
    runtime["metadata"]["labels"]["trainer.kubeflow.org/support"] = "deprecated"
    [warning] = to_jobset(trainjob(MWMS), [runtime]).warnings
    assert 'Referenced ClusterTrainingRuntime "tensorflow-distributed" is deprecated' in warning


def test_a_domain_prefixed_manager_is_taken_and_others_say_why_not():
    assert build.domain_prefixed_path_errors("m", "cassava-trainer/submit-job") == []
    assert build.domain_prefixed_path_errors("m", "") == ["m: Required value"]
    [bad_host] = build.domain_prefixed_path_errors("m", "Bad_Host/x")
    assert bad_host.startswith('m: Invalid value: "Bad_Host": a lowercase RFC 1123 subdomain')


def test_the_cli_refuses_a_trainjob_on_an_unknown_runtime_before_any_engine(tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(trainjob("no-such-runtime")))
    result = run_main(submit_job.main, "local", "--trainjob", str(tmp_path / "job.yaml"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert 'ClusterTrainingRuntime.trainer.kubeflow.org "no-such-runtime" not found' in result.stderr


def test_a_runtime_given_with_the_trainjob_or_by_runtime_is_installed_and_wins(tmp_path):
    mine = manifests.with_image(RUNTIMES[MWMS], "localhost/tf-runtime-cpu:test")
    (tmp_path / "both.yaml").write_text(yaml.safe_dump_all([trainjob(MWMS), mine]))
    job, in_file = manifests.load(str(tmp_path / "both.yaml"))
    jobset = to_jobset(job, [*RUNTIMES.values(), *in_file]).jobset
    assert node_container(rjobs(jobset)["node"])["image"] == "localhost/tf-runtime-cpu:test"
    (tmp_path / "v1.yaml").write_text(yaml.safe_dump({**trainjob(MWMS), "apiVersion": "kubeflow.org/v1"}))
    with pytest.raises(jobspec.SpecError, match="has apiVersion 'kubeflow.org/v1'; Kubeflow Trainer v2.3.0 serves"):
        manifests.load(str(tmp_path / "v1.yaml"))


# --- The pods' side ------------------------------------------------------------------------------------

def test_a_trainjob_whose_num_nodes_exceeds_its_pods_count_stops_those_pods_with_the_fix():
    """numNodes 3 but no TRAINJOB_NUM_NODES: the runtime's 1 stands, and pods 1 and 2 find no place
    in the cluster (exit 2, one line naming the variable)."""
    jobset = to_jobset(trainjob(MWMS, trainer={"numNodes": 3, "image": "mine:1"}), list(RUNTIMES.values())).jobset
    pods = jobset_pods.jobset_pods(jobset)
    assert [pod["hostname"] for pod in pods] == ["demo-node-0-0", "demo-node-0-1", "demo-node-0-2"]
    assert resolve(pods[0]["env"]).tf_config is None  # alone, it trains as one process
    with pytest.raises(ClusterConfigError, match="numNodes must reach its pods as env TRAINJOB_NUM_NODES too"):
        resolve(pods[2]["env"])


def test_the_trainjobs_deadline_stops_every_pod_as_trainer_deletes_the_jobset():
    from test_rehearsal_jobset import RecordingRun

    built = to_jobset(trainjob(MWMS, activeDeadlineSeconds=30, trainer={"numNodes": 2, "image": "mine:1",
                                                                       "env": [{"name": "TRAINJOB_NUM_NODES", "value": "2"}]}),
                      list(RUNTIMES.values()))
    deadline = jobset_controller.OwnerDeadline(built.deadline, "TrainJob exceeded its active deadline")
    rules = jobset_controller.JobSetRules(built.jobset, runner.Output(io.StringIO()), network="rehearsal-test",
                                          owner_deadline=deadline)
    run = RecordingRun()
    rules.begin(run, 0)
    assert rules.tick(run, time.monotonic() + 10) is None
    outcome = rules.tick(run, time.monotonic() + 31)
    assert outcome.code == jobset_controller.DEADLINE_EXIT and outcome.message == "TrainJob exceeded its active deadline"


def test_the_dynamic_cloud_storage_mount_is_every_local_bucket():
    from test_rehearsal_jobset import RecordingRun

    built = to_jobset(trainjob(MWMS, trainer={"image": "mine:1"}), list(RUNTIMES.values()))
    rules = jobset_controller.JobSetRules(built.jobset, runner.Output(io.StringIO()), network="rehearsal-test",
                                          bucket_directory=lambda bucket: f"/files/{bucket}" if bucket != "_" else "/files")
    run = RecordingRun()
    rules.begin(run, 0)
    assert run.last["demo-node-0-0"].volumes == ("/files:/gcs",)
    output = io.StringIO()
    no_fuse = jobset_controller.JobSetRules(built.jobset, runner.Output(output), network="rehearsal-test")
    no_fuse.begin(run, 0)
    assert run.last["demo-node-0-0"].volumes == () and "/gcs/ is empty in them, gs:// works" in output.getvalue()


def test_the_hand_written_trainjob_of_the_docs_trains_two_workers_with_its_images_own_command():
    hand_written = yaml.safe_load(HAND_WRITTEN_TRAINJOB)
    trainjob_spec.check_schema(hand_written)
    built = to_jobset(hand_written, list(RUNTIMES.values()))
    [node] = built.jobset["spec"]["replicatedJobs"]
    container = node_container(node)
    assert container["image"] == "us-central1-docker.pkg.dev/my-project/trainers/mnist:v1"
    assert "command" not in container and "args" not in container  # the image's ENTRYPOINT and CMD
    clusters = {json.dumps(resolve(pod["env"]).tf_config, sort_keys=True) for pod in jobset_pods.jobset_pods(built.jobset)}
    assert [json.loads(c)["cluster"] for c in clusters] == [{"worker": ["mnist-node-0-0.mnist:2222",
                                                                       "mnist-node-0-1.mnist:2222"]}] * 2


@pytest.mark.parametrize("request_name", REQUESTS)
def test_the_jobset_trainer_builds_loads_into_the_jobset_models_and_kubernetes_schemas(request_name):
    """What the rules build is a JobSet the API server takes: JobSet v1alpha2's models read it whole,
    and each Job and pod template passes Kubernetes' strict schemas."""
    import kubernetes_validate
    from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet

    jobset = to_jobset(written(*REQUESTS[request_name]), list(RUNTIMES.values())).jobset
    assert JobsetV1alpha2JobSet.from_dict(jobset).to_dict() == jobset
    for rjob in jobset["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"demo-{rjob['name']}-0"}, "spec": job_spec}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"demo-{rjob['name']}-0-0"},
               "spec": job_spec["template"]["spec"]}
        for kubernetes_object in (job, pod):
            assert kubernetes_validate.validate(kubernetes_object, "1.33", strict=True) == "1.33"
