"""The Kubeflow SDK (kubeflow 0.5.0) without a cluster: its own TrainerClient and Kubernetes backend,
with a recorder in place of the kubernetes client's CustomObjectsApi that answers from the runtimes
given and records what the SDK creates. Shared by the unit test of the SDK and the integration test
that runs the command it makes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "kubernetes.md"


class Answer:
    """What the kubernetes client returns for `async_req=True`: a thread's result."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


class RecordedCluster:
    """The CustomObjectsApi calls KubernetesBackend makes for list/get runtime and train, answered
    from the runtimes given; created objects are recorded."""

    def __init__(self, runtimes):
        self.runtimes = {runtime["metadata"]["name"]: copy.deepcopy(runtime) for runtime in runtimes}
        self.created = []

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, async_req=False):
        from kubernetes.client import ApiException

        return Answer(error=ApiException(status=404, reason="Not Found"))  # no namespaced TrainingRuntime

    def get_cluster_custom_object(self, group, version, plural, name, async_req=False):
        from kubernetes.client import ApiException

        assert (group, version, plural) == ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")
        if name not in self.runtimes:
            return Answer(error=ApiException(status=404, reason="Not Found"))
        return Answer(self.runtimes[name])

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, async_req=False):
        assert (group, version, plural) == ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
        self.created.append((namespace, json.loads(json.dumps(body))))  # as the client serializes it
        return Answer(body)


def offline_client(cluster: RecordedCluster, namespace: str = "default"):
    """A TrainerClient whose Kubernetes backend talks to `cluster`: the backend object as its
    __init__ leaves it, without the kubeconfig and the version check its __init__ does first."""
    from kubeflow.trainer.api.trainer_client import TrainerClient  # the class, even where a test replaces the name
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend

    backend = KubernetesBackend.__new__(KubernetesBackend)
    backend.custom_api, backend.core_api, backend.namespace = cluster, None, namespace
    client = TrainerClient.__new__(TrainerClient)
    client.backend = backend
    return client


def created_trainjob(cluster: RecordedCluster) -> dict:
    [(namespace, body)] = cluster.created
    return {**body, "metadata": {**body["metadata"], "namespace": namespace}}


def docs_block(marked_by: str) -> str:
    """The Python block of docs/kubernetes.md marked `<!-- tested as written: MARKED_BY -->`."""
    match = re.search(rf"<!-- tested as written: {re.escape(marked_by)} -->\n```python\n(.*?)```", PAGE.read_text(), re.S)
    assert match, f"docs/kubernetes.md has no Python block marked tested as written by {marked_by}"
    return match.group(1)
