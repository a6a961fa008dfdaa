"""`submit_job.py local --trainjob ...`: a Kubeflow Trainer v2 TrainJob on the TensorFlow runtimes of
manifests/runtimes/, turned into its JobSet by Trainer v2.3.0's rules and run through the JobSet
rehearsal, one container of the real CPU images per pod. Nothing tells a pod its TF_CONFIG: the
runtime gives none, and the image's entry point resolves it from the pod's JobSet labels.

Three runs, each proving what the issue asks of it and more: the cassava example as a two-node
MultiWorkerMirrored TrainJob that is one two-replica job, one of whose pods is preempted, after
which the JobSet restarts as the runtime's failure policy says and training resumes at the step of
its backup; the cassava example as a ParameterServer TrainJob whose evaluator evaluates; and a
user's own image built FROM the runtime image, with its plain script, submitted with the docs'
Kubeflow SDK example (the SDK's own code, no cluster)."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from containers import SMALL_TRAINING, build_image, leftovers, sh, user_env
from helpers import REPO
from test_vertex_rehearsal import lines

PYTHON = str(REPO / ".venv" / "bin" / "python")
OWN_SCRIPT_IMAGE = "localhost/trainjob-own-script:test"


def printed_trainjob(*args: str, image: str) -> dict:
    """What `submit_job.py trainjob` prints, as kubectl would read it."""
    out = subprocess.run([PYTHON, "-m", "scripts.submit_job", "trainjob", "--image-uri", image, *args],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return yaml.safe_load(out)


def run_trainjob(trainjob: dict, tmp_path, *local_args: str, engine) -> subprocess.CompletedProcess:
    (tmp_path / "trainjob.yaml").write_text(yaml.safe_dump(trainjob))
    return subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0], *local_args,
                           "--trainjob", str(tmp_path / "trainjob.yaml")],
                          cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=1200)


def test_a_multiworker_trainjob_is_one_job_that_restarts_when_a_pod_is_preempted_and_resumes(engine, cpu_image, tmp_path):
    """Two nodes of tensorflow-distributed: worker 0 is the chief of one 2-replica job. The second
    pod's node is preempted when epoch 2 begins (DisruptionTarget): the runtime counts it against
    backoffLimit 0, its Job fails, and the JobSet restarts whole (RestartJobSet, 1 of 5); every pod
    comes back under its name and the job resumes from the backup in gs://."""
    trainjob = printed_trainjob("--name", "tj-mwms", "--workers", "1", "--base-output-dir", "gs://tj-mwms/run", "--",
                                *SMALL_TRAINING, "--epochs", "3", "--steps-per-epoch", "6", image=cpu_image)
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    result = run_trainjob(trainjob, tmp_path, "--preempt", "tj-mwms-node-0-1@/epoch 2/3 begins/", engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    notes = "\n".join(lines(result.stdout, "local-run"))
    assert "TrainJob tj-mwms: ClusterTrainingRuntime tensorflow-distributed" in notes, notes
    assert "evicting tj-mwms-node-0-1" in notes and "recreates every Job (RestartJobSet, restart 1 of 5)" in notes, notes
    pods = {"tj-mwms-node-0-0": "worker-0", "tj-mwms-node-0-1": "worker-1"}
    for pod, role in pods.items():
        said = "\n".join(lines(result.stdout, pod))
        assert said.count(f"role: {role}, strategy: multi_worker_mirrored") == 2, said[-3000:]  # before and after
        assert "replicas=2" in said, said[-3000:]
    chief = "\n".join(lines(result.stdout, "tj-mwms-node-0-0"))
    assert re.search(r"resumed from backup at epoch 2 step \d+", chief), chief[-3000:]
    weights = {pod: re.findall(r"weights ([0-9a-f]+) \(every worker's are the same\)", "\n".join(lines(result.stdout, pod)))
               for pod in pods}
    assert len(set(map(tuple, weights.values()))) == 1 and len(weights["tj-mwms-node-0-0"]) == 1, weights
    assert lines(result.stdout, "local-run", "INFO")[-1] == "TrainJob tj-mwms: Complete", result.stdout[-2000:]
    assert leftovers(engine) == []


def test_a_parameter_server_trainjob_trains_and_its_evaluator_evaluates(engine, cpu_image, tmp_path):
    trainjob = printed_trainjob("--name", "tj-pss", "--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator",
                                "--base-output-dir", "gs://tj-pss/run", "--", *SMALL_TRAINING, image=cpu_image)
    result = run_trainjob(trainjob, tmp_path, engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    for pod, role in (("tj-pss-chief-0-0", "chief-0"), ("tj-pss-node-0-1", "worker-1"), ("tj-pss-ps-0-0", "ps-0")):
        assert any(f"role: {role}" in line for line in lines(result.stdout, pod)), (pod, result.stdout[-4000:])
    evaluator = "\n".join(lines(result.stdout, "tj-pss-evaluator-0-0"))
    assert "role: evaluator" in evaluator, evaluator[-3000:]
    assert "val_accuracy" in evaluator or "accuracy=" in evaluator, evaluator[-3000:]
    assert lines(result.stdout, "local-run", "INFO")[-1] == "TrainJob tj-pss: Complete", result.stdout[-2000:]
    assert leftovers(engine) == []


@pytest.fixture(scope="module")
def own_script_image(engine, runtime_cpu_image, tmp_path_factory):
    """A user's image as docs/your-own-code.md writes it: FROM the runtime image, the script copied
    in, only its CMD set (tests/fixtures/autopackaging/task.py, which reads only TF_CONFIG and
    AIP_MODEL_DIR)."""
    folder = tmp_path_factory.mktemp("own-script")
    (folder / "task.py").write_text((REPO / "tests" / "fixtures" / "autopackaging" / "task.py").read_text())
    (folder / "Dockerfile").write_text('ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nWORKDIR /app\nCOPY task.py .\n'
                                       'CMD ["python", "task.py"]\n')
    build_image(engine, "--build-arg", f"BASE_IMAGE={runtime_cpu_image}", "-t", OWN_SCRIPT_IMAGE, str(folder))
    return OWN_SCRIPT_IMAGE


def test_a_users_image_from_the_sdk_example_runs_its_plain_script_as_one_two_replica_job(
        engine, own_script_image, tmp_path, monkeypatch):
    """docs/kubernetes.md's TrainerClient example, run with the SDK's own code and no cluster
    (tests/offline_sdk.py), makes the TrainJob; its image, a registry's in the docs, is the one
    built here. Both pods run the script under the runtime's entry point, in one cluster."""
    import kubeflow.trainer

    from offline_sdk import RecordedCluster, created_trainjob, docs_block, offline_client
    from scripts.rehearsal.trainjob import shipped_runtimes

    cluster = RecordedCluster(shipped_runtimes())
    monkeypatch.setattr(kubeflow.trainer, "TrainerClient", lambda *args, **kwargs: offline_client(cluster))
    exec(compile(docs_block("tests/unit/test_kubeflow_sdk.py"), "docs/kubernetes.md", "exec"), {})
    trainjob = created_trainjob(cluster)
    # The docs' placeholders: a registry's image, and a bucket of yours.
    trainjob["spec"]["trainer"]["image"] = own_script_image
    for entry in trainjob["spec"]["trainer"]["env"]:
        entry["value"] = entry["value"].replace("gs://BUCKET/", "gs://tj-own/")
    name = trainjob["metadata"]["name"]
    result = run_trainjob(trainjob, tmp_path, "--keep", str(tmp_path / "kept"), engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    for pod in (f"{name}-node-0-0", f"{name}-node-0-1"):
        assert "num_replicas_in_sync 2" in lines(result.stdout, pod, "INFO"), result.stdout[-4000:]
    assert "saved to AIP_MODEL_DIR" in lines(result.stdout, f"{name}-node-0-0", "INFO"), result.stdout[-4000:]
    assert (tmp_path / "kept" / "tj-own" / "runs" / name / "model" / "saved_model.pb").exists()
    assert lines(result.stdout, "local-run", "INFO")[-1] == f"TrainJob {name}: Complete", result.stdout[-2000:]
    assert leftovers(engine) == []
