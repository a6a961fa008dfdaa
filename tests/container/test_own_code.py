"""A user's own code on the CPU runtime image: a plain MultiWorkerMirrored script (tests/fixtures/autopackaging/
task.py, which reads only TF_CONFIG and AIP_MODEL_DIR) in the image gcloud's autopackaging builds
FROM ours, whose ENTRYPOINT is `python task.py`, run as a CustomJob written by hand and as the
JobSet `submit_job.py jobset --image-uri` writes for it."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import yaml

from containers import build_image, leftovers, sh, user_env
from helpers import REPO
from test_vertex_rehearsal import PYTHON, lines, run_local, summary

AUTOPACKAGED = "localhost/autopackaged-mwms:test"
FIXTURE = REPO / "tests" / "fixtures" / "autopackaging"
POOL = {"machineSpec": {"machineType": "e2-standard-4"}, "replicaCount": "1"}


@pytest.fixture(scope="module")
def autopackaged_image(engine, runtime_cpu_image):
    """The fixture's Dockerfile (gcloud's lines) built on the tests' CPU runtime image, as `gcloud ai
    custom-jobs local-run` builds it: the folder is the context."""
    build_image(engine, "--build-arg", f"BASE_IMAGE={runtime_cpu_image}", "-f", str(FIXTURE / "Dockerfile"),
                "-t", AUTOPACKAGED, str(FIXTURE))
    return AUTOPACKAGED


def handwritten_job(image: str, bucket: str, container: dict | None = None) -> dict:
    """Chief and one worker, written as a user writes a CustomJob: the image and nothing else."""
    container = {"imageUri": image, **(container or {})}
    return {"displayName": "own-script", "jobSpec": {
        "workerPoolSpecs": [{**POOL, "containerSpec": container}, {**POOL, "containerSpec": container}],
        "baseOutputDirectory": {"outputUriPrefix": f"gs://{bucket}/job"}}}


def test_the_autopackaged_script_trains_on_two_replicas_in_the_vertex_rehearsal(engine, autopackaged_image, tmp_path):
    result = run_local(engine, tmp_path, handwritten_job(autopackaged_image, "own-mwms"), "--keep", str(tmp_path / "kept"))
    assert result.returncode == 0, result.stdout[-4000:]
    for replica in ("workerpool0-0", "workerpool1-0"):
        assert "num_replicas_in_sync 2" in lines(result.stdout, replica, "INFO"), result.stdout[-4000:]
    assert "saved to AIP_MODEL_DIR" in lines(result.stdout, "workerpool0-0", "INFO")
    assert "saved to a temporary directory" in lines(result.stdout, "workerpool1-0", "INFO")
    assert (tmp_path / "kept" / "own-mwms" / "job" / "model" / "saved_model.pb").exists()
    assert summary(result.stdout) == {"workerpool0-0": ([0], 0), "workerpool1-0": ([0], 0)}
    assert leftovers(engine) == []


def test_a_preempted_replica_of_the_script_under_trainer_run_restarts_the_job(engine, autopackaged_image, tmp_path):
    """Spot preemption of the worker mid-epoch: the SIGTERM reaches the script through trainer.run,
    and TensorFlow's coordination service under MultiWorkerMirroredStrategy catches it itself
    (preemption_notifier.cc logs "SIGTERM caught" on the script's stderr) and trains on, so the
    replica ends at the SIGKILL 30 s later; Vertex restarts the whole job on new machines,
    every replica starting the script again. The run is long (minutes), so that it cannot end
    within the grace on any machine, and the test stops the rehearsal (Ctrl-C) once the restarted
    job trains. Each step is followed by a 0.02 s pause (the script's --step-pause), so that the two
    replicas training on through the grace wait more than they compute (their hot loop cost the
    suite about a CPU-min before, issue 53); an epoch still takes 6 s and more, within the 30 s."""
    job = handwritten_job(autopackaged_image, "own-spot", {
        "command": ["python", "-m", "trainer.run", "--"],
        "args": ["python", "task.py", "--epochs", "100", "--steps-per-epoch", "300", "--step-pause", "0.02"]})
    (tmp_path / "job.json").write_text(json.dumps(job))
    runner = subprocess.Popen([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0], "--spec",
                               str(tmp_path / "job.json"), "--preempt", "workerpool1-0@/Epoch 2.100 /"],
                              cwd=REPO, env=user_env(), stdout=subprocess.PIPE, text=True)
    output = []
    try:
        restarted = 0
        for line in runner.stdout:
            output.append(line.rstrip("\n"))
            restarted += line.split(None, 2)[:1] == ["workerpool1-0"] and "Epoch 1/100 " in line
            if restarted == 2:  # the worker trains again, in the restarted job
                runner.send_signal(signal.SIGINT)
                break
        output += runner.stdout.read().splitlines()
        assert runner.wait(timeout=120) == 130, "\n".join(output[-60:])
    finally:
        if runner.poll() is None:
            runner.kill()
    preempting = first_line(output, "local-run", "preempting (Spot VM) workerpool1-0: SIGTERM now")
    restarting = first_line(output, "local-run", "workerpool1-0 was preempted (STOCKOUT): restarting the whole job")
    # The script itself got the signal, relayed by trainer.run at its stderr's severity, and trained on.
    assert preempting < first_line(output, "workerpool1-0", "SIGTERM caught", "ERROR") < restarting, "\n".join(output[-60:])
    assert first_line(output, "workerpool1-0", "Epoch 3/100 ") < restarting
    # stopped by the preemption, not finished: nothing saved before the restart
    assert not [line for line in output[:restarting] if line.startswith("workerpool1-0") and "saved" in line]
    for replica in ("workerpool0-0", "workerpool1-0"):
        assert lines("\n".join(output), replica, "INFO").count("num_replicas_in_sync 2") == 2, "\n".join(output[-60:])
    assert leftovers(engine) == []


def first_line(output: list[str], source: str, text: str, severity: str | None = None) -> int:
    """The number of the first line of `output` from `source` (of `severity`) that holds `text`."""
    for number, line in enumerate(output):
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] == source and (severity is None or parts[1] == severity) and text in parts[2]:
            return number
    raise AssertionError(f"no line of {source} holds {text!r}:\n" + "\n".join(output[-60:]))


def test_the_autopackaged_script_trains_in_the_jobset_submit_job_writes(engine, autopackaged_image, tmp_path):
    """Needs the JobSet writer to give every command its TF_CONFIG and AIP_* (the `rehearsal` branch
    of issue 39): no flag names the image's command."""
    printed = subprocess.run([PYTHON, "-m", "scripts.submit_job", "jobset", "--image-uri", autopackaged_image,
                              "--workers", "1", "--base-output-dir", "/tmp/out"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    manifest = yaml.safe_load(printed)
    for rjob in manifest["spec"]["replicatedJobs"]:
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        assert "command" not in container and not container.get("args"), container
    (tmp_path / "jobset.yaml").write_text(yaml.safe_dump(manifest))
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0], "--jobset",
                             str(tmp_path / "jobset.yaml")], cwd=REPO, env=user_env(), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    name = manifest["metadata"]["name"]
    for pod in (f"{name}-chief-0-0", f"{name}-worker-0-0"):
        assert "num_replicas_in_sync 2" in lines(result.stdout, pod), result.stdout[-4000:]
    assert leftovers(engine) == []


def test_a_preempted_pod_of_the_script_in_the_jobset_restarts_the_jobset(engine, autopackaged_image, tmp_path):
    """The same JobSet with a longer run given as the pods' args (as a user writes them), its worker
    pod preempted (its node lost) once the script trains: the script is the pod's first process
    (`python task.py`, gcloud's ENTRYPOINT), and TensorFlow's own handler catches the SIGTERM and
    trains on until the SIGKILL, after the pods' terminationGracePeriodSeconds (3 s, as a user may
    set it; a pod that finished within its grace would have succeeded, and nothing would restart);
    JobSet restarts the whole JobSet, every pod starts again with the same TF_CONFIG, and the job
    finishes. Its steps pause 0.02 s each (the script's --step-pause), so that its pods mostly wait, and
    an epoch takes 100 steps where it took 300 without the pause, for about as long a run."""
    printed = subprocess.run([PYTHON, "-m", "scripts.submit_job", "jobset", "--name", "own-spot", "--image-uri",
                              autopackaged_image, "--workers", "1", "--base-output-dir", "/tmp/out"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    manifest = yaml.safe_load(printed)
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        pod_spec["containers"][0]["args"] = ["--epochs", "10", "--steps-per-epoch", "100", "--step-pause", "0.02"]
        pod_spec["terminationGracePeriodSeconds"] = 3
    (tmp_path / "jobset.yaml").write_text(yaml.safe_dump(manifest))
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", engine[0],
                             "--preempt", "own-spot-worker-0-0@/Epoch 2.10 /", "--jobset", str(tmp_path / "jobset.yaml")],
                            cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    output = result.stdout.splitlines()
    evicting = first_line(output, "local-run", "evicting own-spot-worker-0-0 (node preempted)")
    recreating = first_line(output, "local-run", "recreates every Job")
    assert "SIGKILL in 3s" in output[evicting]
    assert evicting < first_line(output, "own-spot-worker-0-0", "SIGTERM caught") < recreating, result.stdout[-5000:]
    for pod in ("own-spot-chief-0-0", "own-spot-worker-0-0"):
        assert lines(result.stdout, pod).count("num_replicas_in_sync 2") == 2, result.stdout[-5000:]
    assert leftovers(engine) == []
