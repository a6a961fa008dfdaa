"""`submit_job.py local jobset ...`: a JobSet's pods as containers of the real CPU image, with the
hostnames, environment and restart rules Kubernetes and JobSet give them. Nothing tells the trainer
its cluster but what a pod has: each pod must find it by itself (trainer/cluster.py)."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from containers import SMALL_TRAINING, leftovers, user_env
from helpers import REPO, run_module, write_image_folder
from quiet_end import errors_after_training
from test_vertex_rehearsal import lines

PYTHON = str(REPO / ".venv" / "bin" / "python")


def jobset(*args: str, image: str) -> dict:
    split = args.index("--")
    printed = subprocess.run([PYTHON, "-m", "scripts.submit_job", "jobset", "--image-uri", image, *args[:split], *args[split:]],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    return yaml.safe_load(printed)


def run_jobset(manifest: dict, tmp_path, *local_args: str, engine) -> subprocess.CompletedProcess:
    (tmp_path / "jobset.yaml").write_text(yaml.safe_dump(manifest))
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0], *local_args,
                             "--jobset", str(tmp_path / "jobset.yaml")],
                            cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=900)
    return result


def share_model_dir(manifest: dict, claim: str = "models") -> dict:
    """Gives every pod the same ReadWriteMany claim at /models, as a cluster without Cloud Storage
    would share checkpoints with the evaluator."""
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        pod_spec["volumes"] = [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}]
        pod_spec["containers"][0]["volumeMounts"] = [{"name": "models", "mountPath": "/models"}]
    return manifest


def test_a_mwms_jobset_trains_with_each_pod_finding_its_cluster(engine, cpu_image, tmp_path):
    manifest = jobset("--workers", "2", "--", *SMALL_TRAINING, "--model-dir", "/tmp/model", image=cpu_image)
    result = run_jobset(manifest, tmp_path, engine=engine)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    name = manifest["metadata"]["name"]
    roles = {f"{name}-chief-0-0": "chief-0", f"{name}-worker-0-0": "worker-0", f"{name}-worker-0-1": "worker-1"}
    for pod, role in roles.items():
        said = "\n".join(lines(result.stdout, pod))
        assert f"role: {role}, strategy: multi_worker_mirrored" in said, said[-3000:]
    assert "replicas=3" in "\n".join(lines(result.stdout, f"{name}-chief-0-0"))
    # A Keras 3 Task, trained by the runtime's loop: every pod ends with the same weights.
    weights = {pod: re.findall(r"trainer: trained 1 epochs of \d+ steps; weights ([0-9a-f]+) \(every worker's are the same\)",
                               "\n".join(lines(result.stdout, pod))) for pod in roles}
    assert len(set(map(tuple, weights.values()))) == 1 and len(weights[f"{name}-chief-0-0"]) == 1, weights
    assert lines(result.stdout, "local-run", "INFO")[-1].endswith("succeeded (successPolicy met)"), result.stdout[-2000:]
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]  # a quiet end (trainer.library.ending)
    assert leftovers(engine) == []


def test_every_pod_prints_the_same_cluster_with_its_own_address(engine, cpu_image, tmp_path):
    """PSS with an evaluator, each pod running `python -m trainer.cluster` instead of training:
    once from its TF_CONFIG, once from its JobSet variables alone; both say the same."""
    manifest = jobset("--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator", "--", image=cpu_image)
    for rjob in manifest["spec"]["replicatedJobs"]:
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        container["command"] = ["sh", "-c", "python -m trainer.cluster && env -u TF_CONFIG python -m trainer.cluster"]
        container["args"] = []
    manifest["spec"]["successPolicy"] = {"operator": "All"}  # every Job, as each pod exits at once
    result = run_jobset(manifest, tmp_path, engine=engine)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    name = manifest["metadata"]["name"]
    pods = [f"{name}-{role}-0-{i}" for role, count in (("chief", 1), ("worker", 2), ("ps", 1), ("evaluator", 1))
            for i in range(count)]
    both = {pod: [json.loads(line) for line in lines(result.stdout, pod, "INFO")] for pod in pods}
    assert {pod: [p["source"] for p in said] for pod, said in both.items()} == {pod: ["TF_CONFIG", "JobSet"] for pod in pods}
    for pod, (from_tf_config, from_jobset) in both.items():
        # TF_CONFIG never names the evaluator: only the evaluator itself knows of one from it.
        from_jobset["has_evaluator"] = from_tf_config["has_evaluator"] if "evaluator" not in pod else True
        assert {**from_tf_config, "source": "JobSet"} == from_jobset, pod
    printed = {pod: said[1] for pod, said in both.items()}
    clusters = {json.dumps(p["tf_config"]["cluster"], sort_keys=True) for p in printed.values() if p["tf_config"]}
    assert len(clusters) == 1, clusters
    cluster = json.loads(clusters.pop())
    assert cluster["worker"] == [f"{name}-worker-0-{i}.{name}:2222" for i in range(2)]
    assert "evaluator" not in cluster
    assert printed[f"{name}-evaluator-0-0"]["task_type"] == "evaluator"
    assert {p["source"] for p in printed.values()} == {"JobSet"}
    assert printed[f"{name}-worker-0-1"]["tf_config"]["task"] == {"type": "worker", "index": 1}
    assert leftovers(engine) == []


def test_a_pss_jobset_with_its_evaluator_trains_and_evaluates(engine, cpu_image, tmp_path):
    manifest = share_model_dir(jobset("--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator", "--",
                                      *SMALL_TRAINING, "--model-dir", "/models/run", image=cpu_image))
    result = run_jobset(manifest, tmp_path, engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    name = manifest["metadata"]["name"]
    evaluator = "\n".join(lines(result.stdout, f"{name}-evaluator-0-0"))
    assert "role: evaluator" in evaluator, evaluator[-3000:]
    assert "val_accuracy" in evaluator or "accuracy=" in evaluator, evaluator[-3000:]
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]
    assert leftovers(engine) == []


def test_the_runtime_in_a_pod_writes_json_entries_the_log_shows_at_their_own_severity(engine, runtime_cpu_image, tmp_path):
    """Every pod has the kubelet's KUBERNETES_SERVICE_HOST, so the image's entry point, trainer.run,
    writes each line as one JSON entry, as on GKE; the rehearsal shows each as GKE's logging agent
    records it. A warning reads as WARNING there, where Vertex AI shows any stderr line as ERROR,
    and a traceback is one entry."""
    script = ("import logging, os, traceback\n"
              "logging.basicConfig()\n"
              "print('in a pod:', os.environ.get('KUBERNETES_SERVICE_HOST', 'no'))\n"
              "logging.warning('the learning rate is high')\n"
              "try:\n    {}['missing']\nexcept KeyError:\n    traceback.print_exc()\n")
    manifest = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "logs"},
                "spec": {"replicatedJobs": [{"name": "main", "template": {"spec": {"template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "trainer", "image": runtime_cpu_image, "args": ["python", "-c", script]}]}}}}}]}}
    result = run_jobset(manifest, tmp_path, engine=engine)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    shown = [line.split(None, 2)[1:] for line in result.stdout.splitlines() if line.startswith("logs-main-0-0 ")]
    host = next(text for severity, text in shown if text.startswith("in a pod: ")).removeprefix("in a pod: ")
    assert host != "no" and ["INFO", f"in a pod: {host}"] in shown, shown
    assert ["WARNING", "WARNING:root:the learning rate is high"] in shown, shown
    traceback = shown.index(["ERROR", "Traceback (most recent call last):"])
    assert shown[traceback + 1][0] == "ERROR" and shown[traceback + 1][1].startswith("File "), shown
    assert ["ERROR", "KeyError: 'missing'"] in shown[traceback:], shown
    assert not [text for _, text in shown if '"severity"' in text], shown  # no entry shown as raw JSON
    assert leftovers(engine) == []


def test_a_permanent_exit_fails_the_jobset_at_once(engine, base_image, tmp_path):
    """Exit 2 (bad input) matches the FailJob rule: no restart, the pod's code. (Which rule wins
    when Jobs fail together: tests/unit/test_rehearsal_jobset.py.)"""
    manifest = jobset("--workers", "1", "--max-restarts", "3", "--", image=base_image)
    commands = {"worker": "sleep 2; echo bad input >&2; exit 2", "chief": "trap 'exit 0' TERM; sleep 60 & wait"}
    for rjob in manifest["spec"]["replicatedJobs"]:
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        container["command"], container["args"] = ["sh", "-c", commands[rjob["name"]]], []
    result = run_jobset(manifest, tmp_path, engine=engine)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "(PodFailurePolicy)" in result.stdout and "FailJobSet" in result.stdout, result.stdout[-3000:]
    assert "recreates every Job" not in result.stdout
    assert leftovers(engine) == []


def test_a_preempted_worker_restarts_the_jobset_which_resumes(engine, cpu_image, tmp_path):
    """MWMS: the evicted worker's DisruptionTarget counts against backoffLimit 0, its Job fails,
    and JobSet recreates every Job (failurePolicy.maxRestarts); the chief resumes from its backup."""
    # The SIGTERM at epoch 2's start must find steps left to stop at: with 2 a step, the worker
    # finished the job in its grace, and with 6 the job ended before the eviction landed on a
    # machine at load 20. 30 a step leave the eviction the time of 60 small steps.
    manifest = share_model_dir(jobset("--workers", "1", "--max-restarts", "2", "--", *SMALL_TRAINING,
                                      "--epochs", "3", "--steps-per-epoch", "30", "--model-dir", "/models/run",
                                      image=cpu_image))
    name = manifest["metadata"]["name"]
    result = run_jobset(manifest, tmp_path, "--preempt", f"{name}-worker-0-0@/epoch 2/3 begins/", engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    notes = "\n".join(lines(result.stdout, "local-run"))
    assert f"evicting {name}-worker-0-0" in notes and "recreates every Job (RestartJobSet, restart 1 of 2)" in notes, notes
    chief = "\n".join(lines(result.stdout, f"{name}-chief-0-0"))
    assert "resumed from backup at epoch" in chief, chief[-3000:]
    assert leftovers(engine) == []


def test_a_jobset_reads_its_data_through_a_cloud_storage_fuse_volume_and_writes_gs(engine, cpu_image, tmp_path):
    """The pods get the rehearsal's local Cloud Storage, as Vertex replicas do: the data is staged
    into a bucket and read through a Cloud Storage FUSE CSI volume, and the model and checkpoints
    go to gs:// through TensorFlow's own client."""
    prepared = tmp_path / "prepared"
    made = run_module("cassava.prepare", "--source", f"folder:{write_image_folder(tmp_path / 'images')}",
                      "--output", str(prepared), "--shards", "4")
    assert made.returncode == 0, made.stderr[-2000:]
    manifest = jobset("--workers", "1", "--base-output-dir", "gs://js-gcs/run", "--", *SMALL_TRAINING,
                      "--dataset", "tfrecord:/data/leaves/train-*.tfrecord", "--epochs", "2", image=cpu_image)
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        pod_spec["volumes"] = [{"name": "data", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "readOnly": True,
                                                        "volumeAttributes": {"bucketName": "js-gcs"}}}]
        pod_spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    result = run_jobset(manifest, tmp_path, "--stage", f"{prepared}=gs://js-gcs/leaves", "--keep", str(tmp_path / "kept"),
                        engine=engine)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    name = manifest["metadata"]["name"]
    chief = "\n".join(lines(result.stdout, f"{name}-chief-0-0"))
    assert "sharding=FILE" in chief and "model dir: gs://js-gcs/run/model" in chief, chief[-3000:]
    kept = tmp_path / "kept" / "js-gcs" / "run" / "model"
    assert (kept / "saved_model.pb").exists(), sorted(str(p) for p in (tmp_path / "kept").rglob("*"))[:20]
    assert "Cloud Storage: a local server holding gs://js-gcs" in result.stdout
    assert leftovers(engine) == []
