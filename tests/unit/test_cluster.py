"""trainer.cluster over the environments Vertex AI, AI Platform and Kubeflow really set."""

import json

import pytest

from cassava.task import CassavaTask
from helpers import run_main
from trainer.cluster import ClusterConfigError, resolve

pytestmark = pytest.mark.unit

VERTEX_CLUSTER = {
    "chief": ["cmle-training-workerpool0-ab-0:2222"],
    "worker": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
    "ps": ["cmle-training-workerpool2-ab-0:2222"],
    "evaluator": ["cmle-training-workerpool3-ab-0:2222"],
}
TRAINING_CLUSTER = {k: v for k, v in VERTEX_CLUSTER.items() if k != "evaluator"}


def env(variable, value):
    return {variable: json.dumps(value)}


def test_no_variables_is_a_single_chief():
    cluster = resolve({})
    assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("chief", 0, True)
    assert cluster.tf_config is None and cluster.num_workers == 1 and cluster.source == "none"


def test_empty_tf_config_object_is_a_single_chief():
    assert resolve({"TF_CONFIG": "{}"}).tf_config is None


def test_vertex_tf_config_worker_drops_evaluator_from_training_cluster():
    cluster = resolve(env("TF_CONFIG", {"cluster": VERTEX_CLUSTER, "task": {"type": "worker", "index": 1}, "environment": "cloud"}))
    assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("worker", 1, False)
    assert (cluster.num_workers, cluster.num_ps, cluster.has_evaluator) == (3, 1, True)
    assert cluster.tf_config == {"cluster": TRAINING_CLUSTER, "task": {"type": "worker", "index": 1}}


def test_vertex_tf_config_chief_is_chief():
    cluster = resolve(env("TF_CONFIG", {"cluster": VERTEX_CLUSTER, "task": {"type": "chief", "index": 0}}))
    assert cluster.is_chief and cluster.task_type == "chief"


def test_vertex_cluster_spec_worker_pools_map_to_roles():
    spec = {
        "cluster": {
            "workerpool0": VERTEX_CLUSTER["chief"],
            "workerpool1": VERTEX_CLUSTER["worker"],
            "workerpool2": VERTEX_CLUSTER["ps"],
            "workerpool3": VERTEX_CLUSTER["evaluator"],
        },
        "environment": "cloud",
        "task": {"type": "workerpool2", "index": 0, "trial": "3"},
        "job": "{\"python_module\":\"\",\"package_uris\":[]}",
    }
    cluster = resolve(env("CLUSTER_SPEC", spec))
    assert (cluster.task_type, cluster.task_index, cluster.trial) == ("ps", 0, "3")
    assert cluster.tf_config["cluster"] == TRAINING_CLUSTER
    assert cluster.source == "CLUSTER_SPEC" and cluster.has_evaluator


def test_vertex_cluster_spec_evaluator_is_not_in_training_cluster():
    spec = {"cluster": {"workerpool0": ["c:1"], "workerpool1": ["w:1"], "workerpool3": ["e:1"]},
            "task": {"type": "workerpool3", "index": 0}}
    cluster = resolve(env("CLUSTER_SPEC", spec))
    assert cluster.task_type == "evaluator" and not cluster.is_chief and cluster.has_evaluator
    assert "evaluator" not in cluster.tf_config["cluster"]
    assert cluster.num_workers == 2


def test_ai_platform_master_in_tf_config_becomes_chief_with_trial():
    spec = {"cluster": {"master": ["m:2222"], "worker": ["w0:2222"], "ps": ["p0:2222"]},
            "task": {"type": "master", "index": 0, "trial": "7"}, "environment": "cloud", "job": {"scale_tier": "CUSTOM"}}
    cluster = resolve(env("TF_CONFIG", spec))
    assert (cluster.task_type, cluster.is_chief, cluster.trial) == ("chief", True, "7")
    assert cluster.tf_config == {"cluster": {"chief": ["m:2222"], "worker": ["w0:2222"], "ps": ["p0:2222"]},
                                 "task": {"type": "chief", "index": 0}}


def test_ai_platform_master_in_cluster_spec_becomes_chief():
    spec = {"cluster": {"master": ["m:2222"], "worker": ["w0:2222", "w1:2222"]},
            "task": {"type": "worker", "index": 1, "trial": "2"}, "job": {}}
    cluster = resolve(env("CLUSTER_SPEC", spec))
    assert cluster.tf_config["cluster"]["chief"] == ["m:2222"] and not cluster.is_chief
    assert (cluster.num_workers, cluster.trial) == (3, "2")


def test_ai_platform_evaluator_task():
    spec = {"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}}
    cluster = resolve(env("TF_CONFIG", spec))
    assert cluster.task_type == "evaluator" and cluster.has_evaluator and not cluster.is_chief


@pytest.mark.parametrize("chief_name", ["chief", "master", "Chief", "Master"])
def test_kubeflow_tfjob_replica_names(chief_name):
    spec = {"cluster": {chief_name: ["tfjob-chief-0.ns.svc:2222"], "worker": ["tfjob-worker-0.ns.svc:2222"],
                        "ps": ["tfjob-ps-0.ns.svc:2222"]},
            "task": {"type": "worker", "index": 0}, "environment": "cloud"}
    cluster = resolve(env("TF_CONFIG", spec))
    assert cluster.tf_config["cluster"]["chief"] == ["tfjob-chief-0.ns.svc:2222"]
    assert not cluster.is_chief and cluster.num_ps == 1


def test_worker_only_cluster_makes_worker_zero_chief():
    spec = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    assert resolve(env("TF_CONFIG", spec)).is_chief
    spec["task"]["index"] = 1
    assert not resolve(env("TF_CONFIG", spec)).is_chief


def test_worker_zero_is_not_chief_when_a_chief_exists():
    spec = {"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    assert not resolve(env("TF_CONFIG", spec)).is_chief


def test_tf_config_wins_over_cluster_spec():
    environ = {**env("TF_CONFIG", {"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}),
               **env("CLUSTER_SPEC", {"cluster": {"workerpool0": ["c:1"]}, "task": {"type": "workerpool0", "index": 0}})}
    cluster = resolve(environ)
    assert cluster.source == "TF_CONFIG" and cluster.task_type == "worker"


def test_trial_from_cloud_ml_trial_id_when_task_has_none():
    environ = {**env("TF_CONFIG", {"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0}}),
               "CLOUD_ML_TRIAL_ID": "12"}
    assert resolve(environ).trial == "12"
    assert resolve({"CLOUD_ML_TRIAL_ID": "4"}).trial == "4"


@pytest.mark.parametrize(
    "variable, raw, expected",
    [
        ("TF_CONFIG", '{"cluster": {"chief": ["c:1"]', "TF_CONFIG: not valid JSON"),
        ("TF_CONFIG", '["chief"]', "TF_CONFIG: expected a JSON object"),
        ("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"]}}), 'TF_CONFIG: "task" is missing'),
        ("CLUSTER_SPEC", json.dumps({"cluster": {"chief": ["c:1"]}, "task": {"type": "scheduler", "index": 0}}),
         'CLUSTER_SPEC: unknown task type "scheduler"'),
        ("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 1}}),
         "TF_CONFIG: task worker 1 is out of range: the cluster has 1 worker"),
        ("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"], "master": ["m:1"]}, "task": {"type": "chief", "index": 0}}),
         "TF_CONFIG: cluster names the chief twice (chief and master)"),
        ("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": -1}}),
         "TF_CONFIG: task.index must be a non-negative integer"),
        ("TF_CONFIG", json.dumps({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}),
         "TF_CONFIG: the cluster has neither a chief nor a worker"),
        ("CLUSTER_SPEC", json.dumps({"cluster": {"chief": "c:1"}, "task": {"type": "chief", "index": 0}}),
         'CLUSTER_SPEC: cluster role "chief" must be a list'),
    ],
)
def test_bad_input_raises_one_line_naming_the_variable(variable, raw, expected):
    with pytest.raises(ClusterConfigError) as error:
        resolve({variable: raw})
    assert str(error.value).startswith(expected)
    assert "\n" not in str(error.value)


@pytest.fixture
def cli_environment(monkeypatch):
    """Sets this process's environment as `python -m trainer.cluster` would see it: the test's own
    environment without the variables `drop` names, then `environ` (None unsets one)."""

    def use(environ: dict, drop=("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID")) -> None:
        for variable in drop:
            monkeypatch.delenv(variable, raising=False)
        for variable, value in environ.items():
            if value is None:
                monkeypatch.delenv(variable, raising=False)
            else:
                monkeypatch.setenv(variable, value)

    return use


def run_cli(cli_environment, environ, drop=("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID")):
    """`python -m trainer.cluster`, run in this process (trainer.cluster.main) with `environ`."""
    from trainer import cluster as cluster_lib

    cli_environment(environ, drop)
    return run_main(lambda argv: cluster_lib.main())


def test_cli_prints_the_resolution_as_json(cli_environment):
    spec = {"cluster": {"workerpool0": ["c:1"], "workerpool1": ["w:1", "w:2"]}, "task": {"type": "workerpool1", "index": 1}}
    result = run_cli(cli_environment, env("CLUSTER_SPEC", spec))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert {k: printed[k] for k in ("task_type", "task_index", "is_chief", "trial", "num_workers", "num_ps", "has_evaluator")} == {
        "task_type": "worker", "task_index": 1, "is_chief": False, "trial": None,
        "num_workers": 3, "num_ps": 0, "has_evaluator": False}
    assert printed["tf_config"] == {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}}


def test_cli_bad_input_exits_2_with_one_line_and_no_traceback(cli_environment):
    result = run_cli(cli_environment, {"TF_CONFIG": "{not json"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("trainer.cluster: TF_CONFIG: not valid JSON")


def test_workers_on_other_machines_are_told_apart_from_local_ones():
    from trainer.runtime.roles import parameter_server

    def cluster_with(workers):
        return resolve({"TF_CONFIG": json.dumps({"cluster": {"chief": ["localhost:1"], "worker": workers, "ps": ["localhost:3"]},
                                                 "task": {"type": "chief", "index": 0}})})

    assert parameter_server.remote_workers(cluster_with(["localhost:2", "127.0.0.1:4"])) == []
    assert parameter_server.remote_workers(cluster_with(["localhost:2", "workerpool1-1:2222"])) == ["workerpool1-1:2222"]


# --- JobSet: the cluster from what Kubernetes gives each pod -----------------------------------

def jobset_pod(replicated_job, index, pods="chief=1,worker=2", jobset="tf", **overrides):
    """Pod `index` of `replicated_job`'s Job, as Kubernetes fills its environment (None: unset)."""
    environ = {"JOBSET_NAME": jobset, "JOBSET_REPLICATED_JOB": replicated_job, "JOBSET_JOB_INDEX": "0",
               "JOBSET_PODS": pods, "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{jobset}-{replicated_job}-0-{index}"}
    environ.update(overrides)
    return {name: value for name, value in environ.items() if value is not None}


def every_jobset_pod(pods, **overrides):
    return [jobset_pod(name, index, pods, **overrides)
            for name, count in (item.split("=") for item in pods.split(",")) for index in range(int(count))]


@pytest.mark.parametrize("pods, num_workers, num_ps, evaluators", [
    ("chief=1,worker=2", 3, 0, 0),  # MultiWorkerMirrored
    ("chief=1,worker=2,evaluator=1", 3, 0, 1),
    ("chief=1,worker=3,ps=2", 4, 2, 0),  # ParameterServer
    ("chief=1,worker=2,ps=1,evaluator=1", 3, 1, 1),
    ("evaluator=1,ps=1,worker=2,chief=1", 3, 1, 1),  # any order
    ("worker=3", 3, 0, 0),  # no chief: worker 0 leads
    ("master=1,worker=1", 2, 0, 0),
])
def test_every_jobset_pod_resolves_the_same_cluster_and_finds_itself_in_it(pods, num_workers, num_ps, evaluators):
    environments = every_jobset_pod(pods)
    clusters = [resolve(environ) for environ in environments]
    assert len({json.dumps(c.tf_config["cluster"], sort_keys=True) for c in clusters}) == 1
    training_cluster = clusters[0].tf_config["cluster"]
    assert "evaluator" not in training_cluster
    assert sum(c.is_chief for c in clusters) == 1
    assert sum(c.task_type == "evaluator" for c in clusters) == evaluators
    assert {(c.num_workers, c.num_ps, c.has_evaluator, c.source) for c in clusters} == {
        (num_workers, num_ps, bool(evaluators), "JobSet")}
    training = [(environ, c) for environ, c in zip(environments, clusters) if c.task_type != "evaluator"]
    assert len({c.task_name for _, c in training}) == len(training) == num_workers + num_ps
    for environ, cluster in training:  # each task's own address is its pod's DNS name
        assert training_cluster[cluster.task_type][cluster.task_index] == f"{environ['HOSTNAME']}.tf:2222"


def test_jobset_pss_with_evaluator_addresses_every_pod_by_its_dns_name():
    cluster = resolve(jobset_pod("worker", 1, "chief=1,worker=2,ps=1,evaluator=1", jobset="cassava"))
    assert cluster.tf_config == {
        "cluster": {"chief": ["cassava-chief-0-0.cassava:2222"],
                    "worker": ["cassava-worker-0-0.cassava:2222", "cassava-worker-0-1.cassava:2222"],
                    "ps": ["cassava-ps-0-0.cassava:2222"]},
        "task": {"type": "worker", "index": 1}}
    evaluator = resolve(jobset_pod("evaluator", 0, "chief=1,worker=2,ps=1,evaluator=1", jobset="cassava"))
    assert (evaluator.task_type, evaluator.is_chief) == ("evaluator", False)
    assert evaluator.tf_config["cluster"] == cluster.tf_config["cluster"]


def test_jobset_without_chief_makes_worker_zero_chief_and_master_becomes_chief():
    assert [resolve(environ).is_chief for environ in every_jobset_pod("worker=2")] == [True, False]
    master = resolve(jobset_pod("master", 0, "master=1,worker=1"))
    assert (master.task_type, master.is_chief) == ("chief", True)
    assert master.tf_config["cluster"]["chief"] == ["tf-master-0-0.tf:2222"]


def test_jobset_subdomain_and_port_overrides():
    cluster = resolve(jobset_pod("worker", 1, JOBSET_SUBDOMAIN="tf-net", JOBSET_PORT="5000"))
    assert cluster.tf_config["cluster"]["worker"] == ["tf-worker-0-0.tf-net:5000", "tf-worker-0-1.tf-net:5000"]


def test_jobset_with_one_training_task_is_a_single_process():
    alone = resolve(jobset_pod("chief", 0, "chief=1"))
    assert (alone.tf_config, alone.source, alone.is_chief) == (None, "JobSet", True)
    with_evaluator = [resolve(environ) for environ in every_jobset_pod("chief=1,evaluator=1")]
    assert with_evaluator[0].tf_config is None and with_evaluator[0].has_evaluator
    assert with_evaluator[1].task_type == "evaluator" and with_evaluator[1].tf_config["cluster"] == {"chief": ["tf-chief-0-0.tf:2222"]}


def test_tf_config_and_cluster_spec_win_over_jobset_variables():
    tf_config = env("TF_CONFIG", {"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}})
    assert resolve({**jobset_pod("worker", 1), **tf_config}).source == "TF_CONFIG"
    cluster_spec = env("CLUSTER_SPEC", {"cluster": {"workerpool0": ["c:1"], "workerpool1": ["w:1"]}, "task": {"type": "workerpool0"}})
    assert resolve({**jobset_pod("worker", 1), **cluster_spec}).source == "CLUSTER_SPEC"


def test_a_plain_indexed_job_pod_is_a_single_process():
    """JOB_COMPLETION_INDEX alone is in every Indexed Job's pods, not only a JobSet's."""
    assert resolve({"JOB_COMPLETION_INDEX": "0", "HOSTNAME": "batch-0"}).source == "none"


JOBSET_ERRORS = [
    (dict(JOBSET_NAME=None), "JOBSET_NAME is not set in this JobSet pod: env valueFrom.fieldRef.fieldPath: "
                             "metadata.labels['jobset.sigs.k8s.io/jobset-name'] gives it"),
    (dict(JOBSET_NAME="", JOBSET_REPLICATED_JOB="", JOBSET_JOB_INDEX=""),  # the env copied into a pod outside a JobSet
     "JOBSET_NAME is empty in this JobSet pod"),
    (dict(JOBSET_REPLICATED_JOB="trainer", HOSTNAME="tf-trainer-0-1"), 'JOBSET_REPLICATED_JOB: replicatedJob "trainer" is not a role'),
    (dict(JOBSET_REPLICATED_JOB="ps", HOSTNAME="tf-ps-0-1"), 'JOBSET_REPLICATED_JOB is "ps", which JOBSET_PODS ("chief=1,worker=2") does not list'),
    (dict(JOBSET_JOB_INDEX="1", HOSTNAME="tf-worker-1-1"), "JOBSET_JOB_INDEX is 1: the trainer takes one Job per role (replicas: 1)"),
    (dict(JOBSET_JOB_INDEX="first"), 'JOBSET_JOB_INDEX is "first", not a Job index'),
    (dict(JOBSET_PODS=None), "JOBSET_PODS is not set in this JobSet pod"),
    (dict(JOBSET_PODS="chief=1,worker=two"), 'JOBSET_PODS: "worker=two" is not REPLICATEDJOB=PODS with PODS at least 1'),
    (dict(JOBSET_PODS="chief=1,worker=0"), 'JOBSET_PODS: "worker=0" is not REPLICATEDJOB=PODS'),
    (dict(JOBSET_PODS="chief=1,master=1,worker=2"), "JOBSET_PODS names the chief twice (chief and master); keep one"),
    (dict(JOBSET_PODS="chief=1,worker=2,worker=2"), "JOBSET_PODS names the worker twice (worker)"),
    (dict(JOBSET_PODS="chief=2,worker=2"), 'JOBSET_PODS ("chief=2,worker=2") gives the chief 2 pods'),
    (dict(JOBSET_PODS="ps=1,evaluator=1", JOBSET_REPLICATED_JOB="ps", JOB_COMPLETION_INDEX="0", HOSTNAME="tf-ps-0-0"),
     'JOBSET_PODS ("ps=1,evaluator=1") has neither a chief nor a worker'),
    (dict(JOB_COMPLETION_INDEX=None), "JOB_COMPLETION_INDEX is not set in this JobSet pod: Kubernetes sets it in every pod of an Indexed Job"),
    (dict(JOB_COMPLETION_INDEX="2", HOSTNAME="tf-worker-0-2"), "JOB_COMPLETION_INDEX is 2, but JOBSET_PODS gives worker 2 pod(s) (indices 0..1)"),
    (dict(HOSTNAME="tf-worker-0-0"), 'HOSTNAME is "tf-worker-0-0", but Kubernetes names pod 1 of Job tf-worker-0 "tf-worker-0-1"'),
    (dict(HOSTNAME="cassava-worker-0-1"), 'HOSTNAME is "cassava-worker-0-1", but Kubernetes names pod 1 of Job tf-worker-0'),
    (dict(HOSTNAME=None), "HOSTNAME is not set in this JobSet pod"),
    (dict(JOBSET_PORT="http"), 'JOBSET_PORT is "http", not a port number'),
]


@pytest.mark.parametrize("overrides, message", JOBSET_ERRORS)
def test_a_jobset_pod_with_a_missing_or_contradictory_value_raises_one_line(overrides, message):
    environ = jobset_pod("worker", 1, **overrides)
    assert resolve(jobset_pod("worker", 1)).task_name == "worker-1"  # the same pod without the fault
    with pytest.raises(ClusterConfigError) as error:
        resolve(environ)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_jobset_variables_in_a_pod_outside_a_jobset_are_not_a_single_process():
    """Only JOBSET_PODS copied into, say, a Deployment: stop, rather than train alone."""
    with pytest.raises(ClusterConfigError, match="^JOBSET_NAME is not set"):
        resolve({"JOBSET_PODS": "chief=1,worker=2", "HOSTNAME": "trainer-5d8f7-abcde"})


def run_jobset_cli(cli_environment, environ):
    """`python -m trainer.cluster` with exactly `environ` as its cluster variables, in this process."""
    from trainer.cluster import JOB_COMPLETION_INDEX, JOBSET_VARIABLES

    drop = ("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID", "HOSTNAME", JOB_COMPLETION_INDEX, *JOBSET_VARIABLES)
    return run_cli(cli_environment, environ, drop)


@pytest.mark.parametrize("overrides, message", JOBSET_ERRORS)
def test_cli_in_a_misconfigured_jobset_pod_prints_one_line_and_exits_2(cli_environment, overrides, message):
    from trainer.cluster import environ_with_hostname

    environ = jobset_pod("worker", 1, **overrides)
    with pytest.raises(ClusterConfigError) as error:  # what the pod sees: HOSTNAME from the kernel when unset
        resolve(environ_with_hostname(environ))
    result = run_jobset_cli(cli_environment, environ)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"trainer.cluster: {error.value}\n"


def test_cli_without_hostname_checks_the_kernels_hostname(cli_environment):
    import socket

    result = run_jobset_cli(cli_environment, jobset_pod("worker", 1, HOSTNAME=None))
    assert result.returncode == 2
    assert result.stderr.startswith(f'trainer.cluster: HOSTNAME is "{socket.gethostname()}", but Kubernetes names pod 1')


# --- Vertex Reduction Server: pool 2 runs Google's reducers, not parameter servers ------------------

REDUCER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"


def vertex_job(pool2_image, snake_case=False):
    """The CustomJobSpec Vertex puts under "job": pools 0 and 1 the trainer, pool 2 `pool2_image`."""
    if snake_case:
        return {"worker_pool_specs": [{"container_spec": {"image_uri": "trainer"}}, {"container_spec": {"image_uri": "trainer"}},
                                      {"container_spec": {"image_uri": pool2_image}}]}
    return {"workerPoolSpecs": [{"containerSpec": {"imageUri": "trainer"}}, {"containerSpec": {"imageUri": "trainer"}},
                                {"replicaCount": "2", "containerSpec": {"imageUri": pool2_image}}]}


REDUCER_CLUSTER_SPEC = {"workerpool0": ["c:2222"], "workerpool1": ["w0:2222", "w1:2222"], "workerpool2": ["r0:2222", "r1:2222"]}
REDUCER_TF_CONFIG = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["r0:2222", "r1:2222"]}


@pytest.mark.parametrize("variable, cluster, task", [
    ("CLUSTER_SPEC", REDUCER_CLUSTER_SPEC, {"type": "workerpool1", "index": 1}),
    ("TF_CONFIG", REDUCER_TF_CONFIG, {"type": "worker", "index": 1}),
])
@pytest.mark.parametrize("job", [
    vertex_job(REDUCER_IMAGE),
    json.dumps(vertex_job(REDUCER_IMAGE)),  # the job as a JSON string
    vertex_job(REDUCER_IMAGE, snake_case=True),
    vertex_job("europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver@sha256:" + "a" * 64),
    vertex_job("asia-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:20260101"),
], ids=["camelCase", "json-string", "snake_case", "europe-digest", "asia-tag"])
def test_reducers_in_pool_2_are_not_parameter_servers(variable, cluster, task, job):
    resolved = resolve(env(variable, {"cluster": cluster, "task": task, "environment": "cloud", "job": job}))
    assert (resolved.task_type, resolved.task_index, resolved.is_chief) == ("worker", 1, False)
    assert (resolved.num_workers, resolved.num_ps, resolved.num_reducers) == (3, 0, 2)
    # MultiWorkerMirrored must not wait for the reducers: they run no TensorFlow server.
    assert resolved.tf_config == {"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]},
                                  "task": {"type": "worker", "index": 1}}
    from trainer.runtime import strategy

    assert strategy.choose("auto", resolved) == "multi_worker_mirrored"


@pytest.mark.parametrize("job", [None, {}, "not json", {"workerPoolSpecs": "x"}, vertex_job("gcr.io/me/trainer:1"),
                                 vertex_job("us-docker.pkg.dev/vertex-ai-restricted/training/reductionserverx:1"),
                                 {"workerPoolSpecs": [{}, {}]}])
def test_pool_2_without_googles_reducer_image_holds_parameter_servers(job):
    spec = {"cluster": REDUCER_CLUSTER_SPEC, "task": {"type": "workerpool2", "index": 1}}
    if job is not None:
        spec["job"] = job
    resolved = resolve(env("CLUSTER_SPEC", spec))
    assert (resolved.task_type, resolved.num_ps, resolved.num_reducers) == ("ps", 2, 0)


@pytest.mark.parametrize("variable, task", [("CLUSTER_SPEC", {"type": "workerpool2", "index": 1}),
                                            ("TF_CONFIG", {"type": "ps", "index": 0})])
def test_a_reducer_task_running_the_trainer_is_one_line(variable, task):
    cluster = REDUCER_CLUSTER_SPEC if variable == "CLUSTER_SPEC" else REDUCER_TF_CONFIG
    with pytest.raises(ClusterConfigError) as error:
        resolve(env(variable, {"cluster": cluster, "task": task, "job": vertex_job(REDUCER_IMAGE)}))
    assert str(error.value).startswith(f"{variable}: task {task['type']} {task['index']} is a Reduction Server reducer")
    assert "\n" not in str(error.value)


def test_reducers_beside_an_evaluator_and_in_a_chief_only_job():
    cluster = {**REDUCER_CLUSTER_SPEC, "workerpool3": ["e:2222"]}
    evaluator = resolve(env("CLUSTER_SPEC", {"cluster": cluster, "task": {"type": "workerpool3", "index": 0},
                                             "job": vertex_job(REDUCER_IMAGE)}))
    assert (evaluator.task_type, evaluator.num_reducers, evaluator.num_ps) == ("evaluator", 2, 0)
    assert set(evaluator.tf_config["cluster"]) == {"chief", "worker"}
    alone = resolve(env("CLUSTER_SPEC", {"cluster": {"workerpool0": ["c:2222"], "workerpool2": ["r:2222"]},
                                         "task": {"type": "workerpool0", "index": 0}, "job": vertex_job(REDUCER_IMAGE)}))
    assert (alone.tf_config, alone.num_reducers) == (None, 1)


def test_cli_on_a_reducer_jobs_worker_prints_num_ps_0(cli_environment):
    result = run_cli(cli_environment, env("CLUSTER_SPEC", {"cluster": REDUCER_CLUSTER_SPEC, "task": {"type": "workerpool1", "index": 0},
                                          "environment": "cloud", "job": vertex_job(REDUCER_IMAGE)}))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert (printed["num_ps"], printed["num_reducers"], printed["num_workers"]) == (0, 2, 3)
    assert "ps" not in printed["tf_config"]["cluster"]


def test_parameter_server_strategy_on_a_reducer_job_is_one_line():
    from trainer.runtime import config

    cluster = resolve(env("TF_CONFIG", {"cluster": REDUCER_TF_CONFIG, "task": {"type": "chief", "index": 0},
                                        "job": vertex_job(REDUCER_IMAGE)}))
    with pytest.raises(config.ConfigError) as error:
        config.parse(["--strategy", "parameter_server"], {}, cluster, CassavaTask())
    assert str(error.value).startswith("--strategy parameter_server: this job's worker pool 2 holds 2 Reduction Server "
                                       "reducer(s), not parameter servers")
    assert "\n" not in str(error.value)
