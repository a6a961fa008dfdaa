"""The Kubeflow Python SDK (kubeflow 0.5.0) on the TensorFlow runtimes, with no cluster: its own
TrainerClient reads our ClusterTrainingRuntimes and builds the TrainJob it would create, through
its own code from `train()` to the dict it sends. Only the transport is replaced: a recorder stands
in for the kubernetes client's CustomObjectsApi (what KubernetesBackend.__init__ would build from a
kubeconfig, and then ask the cluster for its Trainer version). The TrainJob is then read by the
API's models, turned into its JobSet by Trainer v2.3.0's rules (scripts/rehearsal/trainjob/), and
every pod resolves its cluster. The docs' example (docs/kubernetes.md, marked tested as written)
runs here as it is written."""

from __future__ import annotations

import json
import re

import pytest

from offline_sdk import PAGE, RecordedCluster, created_trainjob, docs_block, offline_client
from scripts.jobspec import trainjob as trainjob_spec
from scripts.rehearsal.jobset import pods as jobset_pods
from scripts.rehearsal.trainjob import manifest as manifests, to_jobset
from trainer.cluster import resolve

RUNTIMES = {runtime["metadata"]["name"]: runtime for runtime in manifests.shipped_runtimes()}
IMAGE = "us-central1-docker.pkg.dev/PROJECT/trainers/mine:v1"


def cluster_of_every_pod(trainjob: dict) -> tuple[dict, list[tuple[str, int]]]:
    """The JobSet's pods, each resolving its cluster from its own env: (the one cluster, the tasks)."""
    built = to_jobset(trainjob, list(RUNTIMES.values()))
    clusters, tasks = set(), []
    for pod in jobset_pods.jobset_pods(built.jobset):
        cluster = resolve(pod["env"])
        clusters.add(json.dumps(cluster.tf_config["cluster"], sort_keys=True))
        tasks.append((cluster.task_type, cluster.task_index))
    [cluster] = clusters
    return json.loads(cluster), tasks


@pytest.mark.parametrize("name, nodes", [("tensorflow-distributed", 1), ("tensorflow-parameter-server", 1)])
def test_the_sdk_reads_each_runtime_as_a_tensorflow_runtime_for_custom_trainers(name, nodes):
    from kubeflow.trainer import TrainerType
    from kubeflow.trainer.constants import constants

    runtime = offline_client(RecordedCluster(RUNTIMES.values())).get_runtime(name)
    assert runtime.name == name and runtime.trainer.framework == "tensorflow"
    assert runtime.trainer.trainer_type == TrainerType.CUSTOM_TRAINER
    assert runtime.trainer.num_nodes == nodes and runtime.trainer.image.endswith("/tf-runtime-cpu:v1")
    assert tuple(runtime.trainer.command) == constants.DEFAULT_COMMAND  # plainML: `python FILE`, no torchrun or mpirun


def test_a_custom_trainer_container_becomes_a_trainjob_whose_pods_form_one_cluster():
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import Name

    cluster = RecordedCluster(RUNTIMES.values())
    name = offline_client(cluster, "ml").train(
        runtime="tensorflow-distributed",
        trainer=CustomTrainerContainer(image=IMAGE, num_nodes=3, env={"TRAINJOB_NUM_NODES": "3"},
                                       resources_per_node={"cpu": 4, "memory": "16Gi"}),
        options=[Name("mine-1")])
    trainjob = created_trainjob(cluster)
    assert name == "mine-1" and trainjob["metadata"] == {"name": "mine-1", "namespace": "ml"}
    trainjob_spec.check_schema(trainjob)
    assert trainjob["spec"]["runtimeRef"] == {"name": "tensorflow-distributed", "kind": "ClusterTrainingRuntime"}
    trainer = trainjob["spec"]["trainer"]
    assert trainer["image"] == IMAGE and trainer["numNodes"] == 3 and "command" not in trainer and "args" not in trainer
    workers, tasks = cluster_of_every_pod(trainjob)
    assert workers == {"worker": [f"mine-1-node-0-{i}.mine-1:2222" for i in range(3)]}
    assert tasks == [("worker", 0), ("worker", 1), ("worker", 2)]
    jobset = to_jobset(trainjob, list(RUNTIMES.values())).jobset
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": 4, "memory": "16Gi"}  # the SDK's requests and limits alike


def test_a_parameter_server_trainjob_from_the_sdk_has_its_chief_workers_ps_and_evaluator():
    from kubeflow.trainer import CustomTrainerContainer

    cluster = RecordedCluster(RUNTIMES.values())
    offline_client(cluster).train(runtime="tensorflow-parameter-server",
                                  trainer=CustomTrainerContainer(image=IMAGE, num_nodes=2, env={"TRAINJOB_NUM_NODES": "2"}))
    trainjob = created_trainjob(cluster)
    assert re.fullmatch(r"[a-z][0-9a-f]{11}", trainjob["metadata"]["name"])  # the SDK's generated name
    tf_cluster, tasks = cluster_of_every_pod(trainjob)
    name = trainjob["metadata"]["name"]
    assert tf_cluster == {"chief": [f"{name}-chief-0-0.{name}:2222"], "ps": [f"{name}-ps-0-0.{name}:2222"],
                          "worker": [f"{name}-node-0-{i}.{name}:2222" for i in range(2)]}
    assert sorted(tasks) == [("chief", 0), ("evaluator", 0), ("ps", 0), ("worker", 0), ("worker", 1)]


def test_a_custom_trainer_function_replaces_the_entry_point_that_resolves_tf_config():
    """CustomTrainer sends the SDK's own `bash -c` command, which takes the place of the image's
    ENTRYPOINT (`python -m trainer.run --`): the function must resolve its cluster itself, as the
    docs' example does (tests/integration/test_kubeflow_sdk_function.py runs that command)."""
    from kubeflow.trainer import CustomTrainer

    def train():
        print("training")

    cluster = RecordedCluster(RUNTIMES.values())
    offline_client(cluster).train(runtime="tensorflow-distributed",
                                  trainer=CustomTrainer(func=train, num_nodes=2, env={"TRAINJOB_NUM_NODES": "2"}))
    trainer = created_trainjob(cluster)["spec"]["trainer"]
    assert trainer["command"][:2] == ["bash", "-c"] and 'python "test_kubeflow_sdk.py"' in trainer["command"][2]
    assert "def train():" in trainer["command"][2]


def test_an_unknown_runtime_is_the_sdks_error_before_anything_is_sent():
    from kubeflow.trainer import CustomTrainerContainer

    cluster = RecordedCluster(RUNTIMES.values())
    with pytest.raises(RuntimeError, match="Failed to get Runtime: tensorflow-nope"):
        offline_client(cluster).train(runtime="tensorflow-nope", trainer=CustomTrainerContainer(image=IMAGE))
    assert cluster.created == []


def test_the_docs_example_creates_a_trainjob_whose_pods_form_one_cluster(monkeypatch, capsys):
    import kubeflow.trainer

    cluster = RecordedCluster(RUNTIMES.values())
    monkeypatch.setattr(kubeflow.trainer, "TrainerClient", lambda *args, **kwargs: offline_client(cluster))
    exec(compile(docs_block("tests/unit/test_kubeflow_sdk.py"), str(PAGE), "exec"), {})
    trainjob = created_trainjob(cluster)
    trainjob_spec.check_schema(trainjob)
    nodes = trainjob["spec"]["trainer"]["numNodes"]
    workers, tasks = cluster_of_every_pod(trainjob)
    assert len(workers["worker"]) == nodes > 1 and tasks == [("worker", i) for i in range(nodes)]
    assert trainjob["metadata"]["name"] in capsys.readouterr().out
