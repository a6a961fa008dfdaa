"""trainer.cluster over the environments Vertex AI, AI Platform and Kubeflow really set."""

import json
import os
import subprocess
import sys

import pytest

from trainer.cluster import ClusterConfigError, resolve

pytestmark = pytest.mark.unit

from helpers import REPO
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


def run_cli(environ):
    clean = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CLUSTER_SPEC", "CLOUD_ML_TRIAL_ID")}
    return subprocess.run([sys.executable, "-m", "trainer.cluster"], env={**clean, **environ},
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_cli_prints_the_resolution_as_json():
    spec = {"cluster": {"workerpool0": ["c:1"], "workerpool1": ["w:1", "w:2"]}, "task": {"type": "workerpool1", "index": 1}}
    result = run_cli(env("CLUSTER_SPEC", spec))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert {k: printed[k] for k in ("task_type", "task_index", "is_chief", "trial", "num_workers", "num_ps", "has_evaluator")} == {
        "task_type": "worker", "task_index": 1, "is_chief": False, "trial": None,
        "num_workers": 3, "num_ps": 0, "has_evaluator": False}
    assert printed["tf_config"] == {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}}


def test_cli_bad_input_exits_2_with_one_line_and_no_traceback():
    result = run_cli({"TF_CONFIG": "{not json"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("trainer.cluster: TF_CONFIG: not valid JSON")


def test_workers_on_other_machines_are_told_apart_from_local_ones():
    from trainer import train_ps

    def cluster_with(workers):
        return resolve({"TF_CONFIG": json.dumps({"cluster": {"chief": ["localhost:1"], "worker": workers, "ps": ["localhost:3"]},
                                                 "task": {"type": "chief", "index": 0}})})

    assert train_ps.remote_workers(cluster_with(["localhost:2", "127.0.0.1:4"])) == []
    assert train_ps.remote_workers(cluster_with(["localhost:2", "workerpool1-1:2222"])) == ["workerpool1-1:2222"]
