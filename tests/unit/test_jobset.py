"""JobSets from `submit_job.py jobset`, loaded into JobSet's and Kubernetes' own schemas, and the
cluster every pod resolves by itself from what Kubernetes gives it: for the generated JobSets
and for JobSets written by hand in the shape the docs show."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
import yaml

from helpers import run_main
from scripts import jobspec, submit_job
from scripts.rehearsal.jobset import failure_policy, pods as rehearsal_pods
from trainer import exits
from trainer.cluster import ClusterConfigError, resolve

CPU = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123"
GPU = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-gpu:abc123"
V100 = ["--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_V100", "--accelerator-count", "2",
        "--gpu-image-uri", GPU]

REQUESTS = {
    "mwms-cpu": ["--workers", "2", "--image-uri", CPU],
    "mwms-gpu": ["--workers", "3", "--image-uri", CPU, *V100],
    "mwms-evaluator": ["--workers", "1", "--evaluator", "--image-uri", CPU],
    "pss-evaluator": ["--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator", "--image-uri", CPU,
                      "--base-output-dir", "gs://bucket/run-1"],
    "pss-gpu": ["--strategy", "pss", "--workers", "3", "--ps", "2", "--evaluator", "--evaluator-machine-type",
                "n1-standard-4", "--image-uri", CPU, *V100],
    "spot-queue-timeout": ["--workers", "1", "--image-uri", CPU, "--spot", "--queue", "team-a", "--timeout", "7200",
                           "--max-restarts", "2", "--labels", "team=vision", "--namespace", "ml",
                           "--service-account", "trainer@my-project.iam.gserviceaccount.com"],
}
# (chief + workers, parameter servers, evaluator) of each request
EXPECTED = {"mwms-cpu": (3, 0, False), "mwms-gpu": (4, 0, False), "mwms-evaluator": (2, 0, True),
            "pss-evaluator": (3, 1, True), "pss-gpu": (4, 2, True), "spot-queue-timeout": (2, 0, False)}
TRAINER_ARGS = ["--dataset", "tfrecord:gs://bucket/cassava/train-*.tfrecord", "--epochs", "10"]


def manifest(name_or_argv, *extra):
    """The JobSet `submit_job.py jobset` prints, as `kubectl` would read it back."""
    argv = REQUESTS[name_or_argv] if isinstance(name_or_argv, str) else name_or_argv
    args = submit_job.build_parser().parse_args(["jobset", *argv, *extra])
    args.trainer_args = TRAINER_ARGS
    return yaml.safe_load(yaml.safe_dump(submit_job.build_spec(args)[1]))


# --- The schemas: JobSet v1alpha2 (kubeflow-trainer-api) and Kubernetes 1.33 (kubernetes-validate) -----

def jobset_model(data):
    """The JobSet as kubeflow-trainer-api's models read it. Their from_dict drops a field it does not
    know, so the caller compares to_dict() with the input; model_validate cannot be used, as it
    refuses a plain number or string for the resource quantities' oneOf model."""
    from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet

    return JobsetV1alpha2JobSet.from_dict(data)


def kubernetes_objects(jobset):
    """Each replicatedJob's template as a batch/v1 Job, and its pod template as a v1 Pod."""
    for rjob in jobset["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        yield {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"tf-{rjob['name']}-0"}, "spec": job_spec}
        yield {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"tf-{rjob['name']}-0-0"},
               "spec": job_spec["template"]["spec"]}


@pytest.mark.parametrize("name", REQUESTS)
def test_jobset_loads_into_the_jobset_models_with_no_field_left_over(name):
    jobset = manifest(name)
    model = jobset_model(jobset)
    assert model.to_dict() == jobset
    assert [rjob.name for rjob in model.spec.replicated_jobs] == [r["name"] for r in jobset["spec"]["replicatedJobs"]]


@pytest.mark.parametrize("name", REQUESTS)
def test_every_job_and_pod_template_passes_the_strict_kubernetes_schemas(name):
    import kubernetes_validate

    for kubernetes_object in kubernetes_objects(manifest(name)):
        assert kubernetes_validate.validate(kubernetes_object, "1.33", strict=True) == "1.33"


def test_a_wrong_field_fails_each_validator():
    import kubernetes_validate
    from pydantic import ValidationError

    jobset = manifest("pss-evaluator")
    # An unknown field: the models drop it, so the round trip differs; the strict schema names it.
    unknown = copy.deepcopy(jobset)
    unknown["spec"]["replicatedJobs"][0]["template"]["spec"]["restartPolicyy"] = "Never"
    assert jobset_model(unknown).to_dict() != unknown
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(next(kubernetes_objects(unknown)), "1.33", strict=True)
    # A wrong type, in the JobSet's own part and in a pod.
    wrong_type = copy.deepcopy(jobset)
    wrong_type["spec"]["replicatedJobs"][0]["replicas"] = "1"
    with pytest.raises(ValidationError):
        jobset_model(wrong_type)
    pod = list(kubernetes_objects(jobset))[1]
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "tf"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.33", strict=True)


# --- The shape: one Indexed Job per role ------------------------------------------------------------

@pytest.mark.parametrize("name", REQUESTS)
def test_one_indexed_job_per_role_with_the_roles_pods_as_completions(name):
    jobset = manifest(name)
    num_workers, num_ps, evaluator = EXPECTED[name]
    pods = {"chief": 1, "worker": num_workers - 1, "ps": num_ps, "evaluator": int(evaluator)}
    pods = {role: count for role, count in pods.items() if count}
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    assert jobset["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    rjobs = jobset["spec"]["replicatedJobs"]
    assert [r["name"] for r in rjobs] == list(pods)
    for rjob in rjobs:
        job = rjob["template"]["spec"]
        assert rjob["replicas"] == 1 and job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == pods[rjob["name"]]
        [container] = job["template"]["spec"]["containers"]
        assert " ".join(TRAINER_ARGS) in " ".join(container["args"])
        assert {e["name"]: e.get("value") for e in container["env"]}["JOBSET_PODS"] == ",".join(f"{r}={n}" for r, n in pods.items())
        names = [e["name"] for e in container["env"]]
        # Defined before TF_CONFIG, which refers to it, from the annotation the Job controller would read.
        assert names.index("JOB_COMPLETION_INDEX") < names.index("TF_CONFIG")
        assert container["env"][names.index("JOB_COMPLETION_INDEX")]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}


def test_gpu_pools_use_the_gpu_image_and_request_gpus_and_ps_do_not():
    rjobs = {r["name"]: r["template"]["spec"]["template"]["spec"]["containers"][0]
             for r in manifest("pss-gpu")["spec"]["replicatedJobs"]}
    for role in ("chief", "worker"):
        assert rjobs[role]["image"] == GPU and rjobs[role]["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert rjobs["ps"]["image"] == CPU and "resources" not in rjobs["ps"]
    # The evaluator has its own machine type here, so no GPUs; it keeps the training image.
    assert rjobs["evaluator"]["image"] == GPU and "resources" not in rjobs["evaluator"]
    assert rjobs["worker"]["args"][:2] == ["--strategy", "parameter_server"]


def test_base_output_dir_becomes_the_model_dir():
    chief = manifest("pss-evaluator")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert chief["args"][chief["args"].index("--model-dir") + 1] == "gs://bucket/run-1/model"


# --- Restarts, success, Spot, Kueue, time limit ----------------------------------------------------

def roles_of(jobset):
    return {r["name"]: r["template"]["spec"] for r in jobset["spec"]["replicatedJobs"]}


def test_mwms_tasks_fail_their_job_at_once_so_the_whole_jobset_restarts():
    jobset = manifest("mwms-evaluator", "--max-restarts", "4")
    policy = jobset["spec"]["failurePolicy"]
    assert (policy["maxRestarts"], policy["restartStrategy"]) == (4, "BlockingRecreate")
    # No rule for BackoffLimitExceeded: JobSet's default action restarts the JobSet.
    assert policy["rules"] == [{"name": "permanentExitCode", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    roles = roles_of(jobset)
    assert {role: job["backoffLimit"] for role, job in roles.items()} == {"chief": 0, "worker": 0, "evaluator": 4}
    assert roles["worker"]["podFailurePolicy"]["rules"][0] == {
        "action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert all(job["template"]["spec"]["restartPolicy"] == "Never" for job in roles.values())


def test_pss_workers_and_the_evaluator_are_replaced_alone_and_chief_and_ps_restart_the_jobset():
    roles = roles_of(manifest("pss-evaluator", "--max-restarts", "3"))
    assert {role: job["backoffLimit"] for role, job in roles.items()} == {"chief": 0, "worker": 3, "ps": 0, "evaluator": 3}
    disruption = {role: job["podFailurePolicy"]["rules"][0]["action"] for role, job in roles.items()}
    assert disruption == {"chief": "Count", "worker": "Ignore", "ps": "Count", "evaluator": "Ignore"}


@pytest.mark.parametrize("name", REQUESTS)
def test_a_permanent_exit_code_fails_the_job_and_the_retryable_one_does_not(name):
    """Bad input (2; 126 and 127, a command that cannot be run) fails any role's Job at once; a
    retryable code never does. Exit 1 fails at once only a role replaced alone (a PSS worker, the
    evaluator), whose code is its own: an MWMS task, the coordinator and a parameter server exit 1
    when a preempted peer is lost (a plain script's uncaught error), so theirs restarts the JobSet."""
    request = manifest(name)
    pss = any(rjob["name"] == "ps" for rjob in request["spec"]["replicatedJobs"])
    for role, job in roles_of(request).items():
        alone = role == "evaluator" or (pss and role == "worker")
        for code in (exits.CONFIG, 126, 127):
            assert failure_policy.pod_failure_action(job, code, disrupted=False) == "FailJob", (role, code)
        for code in (130, 137, 138, exits.RETRYABLE):
            assert failure_policy.pod_failure_action(job, code, disrupted=False) == "Count", (role, code)
        assert failure_policy.pod_failure_action(job, 1, disrupted=False) == ("FailJob" if alone else "Count"), role
        values = job["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"]
        assert values == sorted(set(values))  # Kubernetes refuses an unordered or repeated list


def test_failure_rule_names_are_ones_the_jobset_webhook_accepts():
    import re

    rules = manifest("spot-queue-timeout")["spec"]["failurePolicy"]["rules"]
    assert len(rules) == 2
    assert all(re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]) for rule in rules)


def test_the_jobset_succeeds_with_the_chief_and_the_evaluator():
    assert manifest("mwms-cpu")["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert manifest("pss-evaluator")["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief", "evaluator"]}


def test_spot_queue_timeout_labels_and_namespace():
    jobset = manifest("spot-queue-timeout")
    assert jobset["metadata"] == {"name": "cassava-multiworker", "namespace": "ml",
                                  "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "team-a"}}
    assert {"name": "timeLimit", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]} in jobset["spec"]["failurePolicy"]["rules"]
    for job in roles_of(jobset).values():
        assert job["activeDeadlineSeconds"] == 7200
        pod = job["template"]["spec"]
        assert pod["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
        assert pod["tolerations"] == [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
        assert pod["serviceAccountName"] == "trainer@my-project.iam.gserviceaccount.com"
    plain = manifest("mwms-cpu")
    assert "labels" not in plain["metadata"] and len(plain["spec"]["failurePolicy"]["rules"]) == 1
    assert all("nodeSelector" not in job["template"]["spec"] and "activeDeadlineSeconds" not in job for job in roles_of(plain).values())


def test_printed_jobset_says_what_it_needs_and_loads():
    result = run_main(submit_job.main, "jobset", *REQUESTS["spot-queue-timeout"], "--", "--epochs", "3")
    assert result.returncode == 0, result.stderr
    header = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert result.stdout.startswith("# A JobSet (jobset.x-k8s.io/v1alpha2)")
    assert "the JobSet controller (v0.7 or later) and Kueue, with a LocalQueue team-a in namespace ml" in " ".join(header)
    printed = yaml.safe_load(result.stdout)
    assert printed["kind"] == "JobSet" and printed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["args"] == ["--epochs", "3"]


@pytest.mark.parametrize("argv, message", [
    (["--name", "9lives"], "--name 9lives: a JobSet name must start with a letter"),
    (["--name", "cassava-resnet50-multiworker-experiment-0042", "--evaluator"],
     "--name cassava-resnet50-multiworker-experiment-0042: too long for a JobSet, pod names such as "
     "cassava-resnet50-multiworker-experiment-0042-evaluator-0-0-xxxxx would pass 63 characters; use at most 43"),
])
def test_a_name_kubernetes_would_refuse_is_one_line_and_exit_2(argv, message):
    result = run_main(submit_job.main, "jobset", "--image-uri", CPU, *argv)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


# --- Every pod's cluster, resolved by the trainer from its own environment -------------------------

def resolved_pods(jobset):
    """{hostname: Cluster} for every pod of `jobset`, each from the JobSet variables of the
    environment Kubernetes gives it (TF_CONFIG, when the JobSet sets one, left out)."""
    return {pod["hostname"]: resolve(without_tf_config(pod["env"])) for pod in rehearsal_pods.jobset_pods(jobset)}


def without_tf_config(env):
    return {name: value for name, value in env.items() if name != "TF_CONFIG"}


@pytest.mark.parametrize("name", REQUESTS)
def test_every_pod_resolves_one_cluster_each_with_its_own_dns_name(name):
    jobset = manifest(name)
    num_workers, num_ps, evaluator = EXPECTED[name]
    pods = rehearsal_pods.jobset_pods(jobset)
    clusters = [resolve(without_tf_config(pod["env"])) for pod in pods]
    assert len({json.dumps(c.tf_config["cluster"], sort_keys=True) for c in clusters}) == 1
    assert sum(c.is_chief for c in clusters) == 1
    assert {(c.num_workers, c.num_ps, c.has_evaluator, c.source) for c in clusters} == {(num_workers, num_ps, evaluator, "JobSet")}
    assert sum(c.task_type == "evaluator" for c in clusters) == int(evaluator)
    training_cluster = clusters[0].tf_config["cluster"]
    assert sum(len(hosts) for hosts in training_cluster.values()) == num_workers + num_ps
    for pod, cluster in zip(pods, clusters):
        assert pod["subdomain"] == jobset["metadata"]["name"]
        if cluster.task_type != "evaluator":
            assert training_cluster[cluster.task_type][cluster.task_index] == f"{pod['hostname']}.{pod['subdomain']}:2222"


@pytest.mark.parametrize("name", REQUESTS)
def test_every_pods_tf_config_gives_the_cluster_its_jobset_variables_give(name):
    """A command that reads only TF_CONFIG joins the same cluster as trainer.cluster's JobSet
    resolution. TF_CONFIG never names the evaluator, so only the evaluator itself knows of one."""
    for pod in rehearsal_pods.jobset_pods(manifest(name)):
        from_tf_config, from_jobset = resolve(pod["env"]), resolve(without_tf_config(pod["env"]))
        assert (from_tf_config.source, from_jobset.source) == ("TF_CONFIG", "JobSet")
        if from_jobset.task_type != "evaluator":
            from_jobset = dataclasses.replace(from_jobset, has_evaluator=False)
        assert dataclasses.replace(from_tf_config, source="JobSet") == from_jobset, pod["hostname"]
        tf_config = json.loads(pod["env"]["TF_CONFIG"])  # as TensorFlow reads it: the index a number
        assert tf_config["task"] == {"type": pod["replicated_job"], "index": pod["completion_index"]}


def test_a_user_image_without_trainer_arguments_runs_its_own_command():
    """No trainer arguments: no args and no command, so the image's ENTRYPOINT and CMD run; the
    output directories reach it as Vertex names them."""
    args = submit_job.build_parser().parse_args(["jobset", "--image-uri", "registry.example/team/my-model:1",
                                                 "--workers", "1", "--base-output-dir", "gs://bucket/run-1"])
    args.trainer_args = []  # what argparse leaves when nothing follows `--`
    jobset = yaml.safe_load(yaml.safe_dump(submit_job.build_spec(args)[1]))
    for rjob in jobset["spec"]["replicatedJobs"]:
        [container] = rjob["template"]["spec"]["template"]["spec"]["containers"]
        assert "args" not in container and "command" not in container
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["AIP_MODEL_DIR"], env["AIP_CHECKPOINT_DIR"]) == ("gs://bucket/run-1/model/", "gs://bucket/run-1/checkpoints/")
        assert "TF_CONFIG" in env


def test_the_cli_prints_the_same_cluster_in_every_pod(monkeypatch):
    from trainer import cluster as cluster_lib
    from trainer.cluster import JOB_COMPLETION_INDEX, JOBSET_VARIABLES

    printed = []
    for pod in rehearsal_pods.jobset_pods(manifest("pss-evaluator")):
        for variable in ("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID", "HOSTNAME", JOB_COMPLETION_INDEX, *JOBSET_VARIABLES):
            monkeypatch.delenv(variable, raising=False)
        for variable, value in pod["env"].items():
            monkeypatch.setenv(variable, value)
        result = run_main(lambda argv: cluster_lib.main())
        assert result.returncode == 0, result.stderr
        printed.append(json.loads(result.stdout))
        assert printed[-1] == json.loads(resolve(pod["env"]).to_json())
    assert len({json.dumps(p["tf_config"]["cluster"], sort_keys=True) for p in printed}) == 1
    assert sorted(f"{p['task_type']}-{p['task_index']}" for p in printed) == ["chief-0", "evaluator-0", "ps-0", "worker-0", "worker-1"]


# A JobSet as a person writes it from the docs: only what the trainer needs, JobSet's defaults for
# the rest (completionMode Indexed, replicas 1, DNS hostnames on), the env entries copied as they are.
HAND_WRITTEN_MWMS = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: cassava
spec:
  successPolicy:
    operator: All
    targetReplicatedJobs: [chief]
  failurePolicy:
    maxRestarts: 3
    restartStrategy: BlockingRecreate
  replicatedJobs:
  - name: chief
    template:
      spec:
        completions: 1
        parallelism: 1
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123
              args: [--epochs, "10"]
              env:
              - name: JOBSET_NAME
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
              - name: JOBSET_REPLICATED_JOB
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}
              - name: JOBSET_JOB_INDEX
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
              - name: JOBSET_PODS
                value: chief=1,worker=2
  - name: worker
    template:
      spec:
        completions: 2
        parallelism: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123
              args: [--epochs, "10"]
              env:
              - name: JOBSET_NAME
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
              - name: JOBSET_REPLICATED_JOB
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}
              - name: JOBSET_JOB_INDEX
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
              - name: JOBSET_PODS
                value: chief=1,worker=2
"""

# The same with parameter servers and an evaluator, one container written once (a YAML anchor).
HAND_WRITTEN_PSS = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: cassava
  namespace: ml
spec:
  successPolicy:
    operator: All
    targetReplicatedJobs: [chief, evaluator]
  failurePolicy:
    maxRestarts: 3
    restartStrategy: BlockingRecreate
  replicatedJobs:
  - name: chief
    template:
      spec:
        completions: 1
        parallelism: 1
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers: &trainer
            - name: trainer
              image: us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123
              args: [--strategy, parameter_server, --epochs, "10"]
              ports:
              - containerPort: 2222
              env:
              - name: JOBSET_NAME
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}
              - name: JOBSET_REPLICATED_JOB
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}
              - name: JOBSET_JOB_INDEX
                valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
              - name: JOBSET_PODS
                value: chief=1,ps=1,worker=2,evaluator=1
  - name: ps
    template:
      spec:
        completions: 1
        parallelism: 1
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers: *trainer
  - name: worker
    template:
      spec:
        completions: 2
        parallelism: 2
        backoffLimit: 3
        template:
          spec:
            restartPolicy: Never
            containers: *trainer
  - name: evaluator
    template:
      spec:
        completions: 1
        parallelism: 1
        backoffLimit: 3
        template:
          spec:
            restartPolicy: Never
            containers: *trainer
"""


@pytest.mark.parametrize("hand_written, argv", [
    (HAND_WRITTEN_MWMS, ["--workers", "2"]),
    (HAND_WRITTEN_PSS, ["--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator", "--namespace", "ml"]),
])
def test_a_jobset_written_by_hand_resolves_in_every_pod_as_the_generated_one(hand_written, argv):
    import kubernetes_validate

    by_hand = yaml.safe_load(hand_written)
    generated = manifest(["--name", "cassava", "--image-uri", CPU, *argv])
    assert resolved_pods(by_hand) == resolved_pods(generated)
    assert len(resolved_pods(by_hand)) == sum(r["template"]["spec"]["completions"] for r in by_hand["spec"]["replicatedJobs"])
    # ... and what the docs show is a valid JobSet too (the models add a port's default protocol).
    assert jobset_model(by_hand).to_dict() == with_default_protocol(by_hand)
    for kubernetes_object in kubernetes_objects(by_hand):
        kubernetes_validate.validate(kubernetes_object, "1.33", strict=True)


def with_default_protocol(jobset):
    jobset = json.loads(json.dumps(jobset))
    for rjob in jobset["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
    return jobset


def test_a_hand_written_jobset_with_its_own_subdomain_passes_it_on():
    jobset = yaml.safe_load(HAND_WRITTEN_MWMS)
    jobset["spec"]["network"] = {"subdomain": "tf-net"}
    for rjob in jobset["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "JOBSET_SUBDOMAIN", "value": "tf-net"})
    pods = rehearsal_pods.jobset_pods(jobset)
    assert {pod["subdomain"] for pod in pods} == {"tf-net"}
    assert resolve(pods[0]["env"]).tf_config["cluster"]["worker"] == ["cassava-worker-0-0.tf-net:2222", "cassava-worker-0-1.tf-net:2222"]


def hand_written_with(change):
    jobset = yaml.safe_load(HAND_WRITTEN_MWMS)
    change(jobset)
    return jobset


def worker_env(jobset):
    return jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("change, message", [
    # Two Jobs of workers instead of one Job with two pods.
    (lambda js: js["spec"]["replicatedJobs"][1].update(replicas=2), "JOBSET_JOB_INDEX is 1: the trainer takes one Job per role"),
    # The env entries not copied into the workers.
    (lambda js: worker_env(js).pop(), "JOBSET_PODS is not set in this JobSet pod"),
    # More pods than JOBSET_PODS gives the workers.
    (lambda js: js["spec"]["replicatedJobs"][1]["template"]["spec"].update(completions=3, parallelism=3),
     "JOB_COMPLETION_INDEX is 2, but JOBSET_PODS gives worker 2 pod(s)"),
    # The Job index read from the wrong label.
    (lambda js: worker_env(js)[2]["valueFrom"]["fieldRef"].update(fieldPath="metadata.labels['jobset.sigs.k8s.io/job-global-index']"),
     "JOBSET_JOB_INDEX is 1: the trainer takes one Job per role"),
    # The role read from the wrong label.
    (lambda js: worker_env(js)[1]["valueFrom"]["fieldRef"].update(fieldPath="metadata.labels['jobset.sigs.k8s.io/jobset-name']"),
     'JOBSET_REPLICATED_JOB: replicatedJob "cassava" is not a role'),
    # A label JobSet does not set: the downward API gives an empty value.
    (lambda js: worker_env(js)[0]["valueFrom"]["fieldRef"].update(fieldPath="metadata.labels['app.kubernetes.io/name']"),
     "JOBSET_NAME is empty in this JobSet pod"),
])
def test_a_hand_written_jobset_that_gets_it_wrong_stops_the_pods_it_misleads(change, message):
    errors = []
    for pod in rehearsal_pods.jobset_pods(hand_written_with(change)):
        try:
            resolve(pod["env"])
        except ClusterConfigError as error:
            errors.append(str(error))
    assert errors and all(error.startswith(message) for error in errors), errors
    assert [resolve(pod["env"]).task_name for pod in rehearsal_pods.jobset_pods(yaml.safe_load(HAND_WRITTEN_MWMS))] == \
        ["chief-0", "worker-0", "worker-1"]


# --- jobset_pods: what Kubernetes makes of a manifest -----------------------------------------------

def test_pods_get_jobsets_labels_the_job_controllers_index_and_hostname():
    pods = rehearsal_pods.jobset_pods(yaml.safe_load(HAND_WRITTEN_PSS))
    worker = next(pod for pod in pods if pod["hostname"] == "cassava-worker-0-1")
    assert (worker["subdomain"], worker["namespace"], worker["completion_index"]) == ("cassava", "ml", 1)
    assert {key: worker["labels"][key] for key in (
        "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index",
        "jobset.sigs.k8s.io/job-global-index", "jobset.sigs.k8s.io/global-replicas", "batch.kubernetes.io/job-completion-index",
        "batch.kubernetes.io/job-name")} == {
        "jobset.sigs.k8s.io/jobset-name": "cassava", "jobset.sigs.k8s.io/replicatedjob-name": "worker",
        "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/job-global-index": "2",
        "jobset.sigs.k8s.io/global-replicas": "4", "batch.kubernetes.io/job-completion-index": "1",
        "batch.kubernetes.io/job-name": "cassava-worker-0"}
    assert worker["env"]["HOSTNAME"] == "cassava-worker-0-1" and worker["env"]["JOB_COMPLETION_INDEX"] == "1"
    assert [pod["hostname"] for pod in pods] == ["cassava-chief-0-0", "cassava-ps-0-0", "cassava-worker-0-0",
                                                 "cassava-worker-0-1", "cassava-evaluator-0-0"]


def test_pod_env_resolves_field_refs_and_references_as_the_kubelet_does():
    jobset = yaml.safe_load(HAND_WRITTEN_MWMS)
    env = worker_env(jobset)
    env += [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TASK", "value": "$(JOBSET_REPLICATED_JOB)-$(JOB_COMPLETION_INDEX)-$$(JOBSET_NAME)"},
            {"name": "JOB_COMPLETION_INDEX", "value": "mine"}]
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]["args"] = [
        "--model-dir", "gs://bucket/$(JOBSET_NAME)/$(JOB_COMPLETION_INDEX)"]
    pod = rehearsal_pods.jobset_pods(jobset)[2]
    # JOB_COMPLETION_INDEX is not yet defined where TASK refers to it, and the Job controller leaves
    # a container's own JOB_COMPLETION_INDEX alone; args see the whole environment.
    assert pod["env"]["TASK"] == "worker-$(JOB_COMPLETION_INDEX)-$(JOBSET_NAME)"
    # metadata.name is the hostname and the 5 random characters Kubernetes adds (generateName).
    assert re.fullmatch(r"cassava-worker-0-1-[bcdfghjklmnpqrstvwxz2456789]{5}", pod["env"]["POD_NAME"])
    assert pod["env"]["JOB_COMPLETION_INDEX"] == "mine"
    assert pod["containers"][0]["args"] == ["--model-dir", "gs://bucket/cassava/mine"]


@pytest.mark.parametrize("change, message", [
    (lambda js: worker_env(js).append({"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
     "cassava-worker-0-0 container trainer env IP: fieldRef status.podIP is known only once the pod runs"),
    (lambda js: worker_env(js).append({"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
     "cassava-worker-0-0 container trainer env KEY: valueFrom.secretKeyRef is known only inside a cluster"),
    (lambda js: js["spec"]["replicatedJobs"][1]["template"]["spec"].update(completionMode="NonIndexed"),
     "replicatedJob worker: completionMode NonIndexed: its pods have no index"),
    (lambda js: js["spec"]["replicatedJobs"][1]["template"]["spec"].update(parallelism=1),
     "replicatedJob worker: parallelism 1 starts only that many of its 2 pods at a time"),
])
def test_what_jobset_pods_cannot_know_or_kubernetes_would_not_run_is_a_spec_error(change, message):
    with pytest.raises(jobspec.SpecError) as error:
        rehearsal_pods.jobset_pods(hand_written_with(change))
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("queue", ["Bad Name", "team_a", "-team", "q" * 64])
def test_a_queue_kubernetes_would_refuse_is_refused_here(queue):
    from scripts.submit_job import main

    assert main(["jobset", "--image-uri", CPU, f"--queue={queue}"]) == 2
