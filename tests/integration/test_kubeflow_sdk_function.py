"""The Kubeflow SDK's CustomTrainer on the TensorFlow runtime, as docs/kubernetes.md writes it: the
SDK (kubeflow 0.5.0, its own code, no cluster: tests/offline_sdk.py's stand-in for its
Kubernetes API client) makes the TrainJob, whose command is the SDK's `bash -c` around the
function; Trainer v2.3.0's rules make its JobSet; and that command really runs, once per pod, with
the pod's environment (as Kubernetes expands it) and the user's package beside it. The function's
first lines resolve the cluster, so the user's code finds the pod's own TF_CONFIG."""

from __future__ import annotations

import json
import linecache
import os
import subprocess
import sys

from helpers import REPO
from offline_sdk import RecordedCluster, created_trainjob, docs_block, offline_client
from scripts.rehearsal.jobset import pods as jobset_pods
from scripts.rehearsal.trainjob import manifest as manifests, to_jobset

RUNTIMES = {runtime["metadata"]["name"]: runtime for runtime in manifests.shipped_runtimes()}
# The user's package the docs' function imports (`from mine import task`): it prints what its
# process was given.
USER_TASK = "import json, os\n\ndef main():\n    print(json.dumps({'TF_CONFIG': json.loads(os.environ['TF_CONFIG'])}))\n"


def test_the_docs_custom_trainer_function_finds_its_pods_cluster(monkeypatch, tmp_path):
    import kubeflow.trainer

    cluster = RecordedCluster(RUNTIMES.values())
    monkeypatch.setattr(kubeflow.trainer, "TrainerClient", lambda *args, **kwargs: offline_client(cluster))
    # The SDK reads the function's source (inspect.getsource): the block is its file.
    source, filename = docs_block("tests/integration/test_kubeflow_sdk_function.py"), "kubernetes_sdk_example.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), {"__name__": "docs_example"})
    trainjob = created_trainjob(cluster)
    command = trainjob["spec"]["trainer"]["command"]
    assert command[:2] == ["bash", "-c"], command
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "__init__.py").write_text("")
    (tmp_path / "mine" / "task.py").write_text(USER_TASK)
    pods = jobset_pods.jobset_pods(to_jobset(trainjob, list(RUNTIMES.values())).jobset)
    assert len(pods) == 2
    printed = []
    for pod in pods:
        workdir = tmp_path / pod["hostname"]
        workdir.mkdir()
        # What the image gives every process (its venv's python first, the runtime and the user's
        # package importable), then the pod's own environment.
        env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(workdir),
               "PYTHONPATH": f"{REPO}:{tmp_path}", **pod["env"]}
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        printed.append(json.loads(result.stdout.strip().splitlines()[-1])["TF_CONFIG"])
    name = trainjob["metadata"]["name"]
    workers = [f"{name}-node-0-{i}.{name}:2222" for i in range(2)]
    assert printed == [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}} for i in range(2)]
