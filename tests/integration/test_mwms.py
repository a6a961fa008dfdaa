"""MultiWorkerMirrored training with real processes on localhost, through trainer.launch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (FLOAT32, REPO, backups_reported, clean_env, epochs_begun, launch_until, resumed_at, run_module,
                     saved_model_op_dtypes, served_predictions, train_graph_op_dtypes)
from quiet_end import errors_after_training

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4", *FLOAT32]


def launch(tmp_path, data_root, *task_args, workers=2, timeout=600):
    work = tmp_path / "work"
    result = run_module(
        "trainer.launch", "--workers", str(workers), "--work-dir", str(work), "--timeout", str(timeout - 30), "--", "python", "-m", "cassava.task",
        "--data-dir", str(data_root), *task_args, timeout=timeout,
    )
    return result, work


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory, data_root):
    tmp_path = tmp_path_factory.mktemp("mwms")
    out = tmp_path / "out"
    result, work = launch(
        tmp_path, data_root, "--dataset", "synthetic:64", "--epochs", "2", *SMALL_RUN,
        "--model-dir", str(out / "model"), "--trace-input-dir", str(tmp_path / "trace"), "--mixed-precision", "bfloat16",
    )
    return result, work, out, tmp_path / "trace"


def test_two_worker_job_succeeds(two_worker_run):
    result, *_ = two_worker_run
    assert result.returncode == 0, result.stdout[-4000:]
    # Both tasks really trained together: the chief reports the global batch of two replicas.
    assert "replicas=2 global_batch=8 (4 per replica)" in result.stdout
    assert epochs_begun(result.stdout, "worker-0") == [1, 2]


def test_workers_consumed_disjoint_examples_covering_the_data(two_worker_run):
    _, _, _, trace = two_worker_run
    chief = (trace / "chief-0.ids").read_text().split()
    worker = (trace / "worker-0.ids").read_text().split()
    assert chief and worker
    assert not set(chief) & set(worker), "both workers trained on the same example"
    # 64 examples in 8 files: each worker reads its 4 files; one epoch of 8 steps x 4 covers them.
    assert set(chief) | set(worker) == {f"train-{i:06d}" for i in range(64)}


def test_final_model_loads_and_predicts(two_worker_run):
    _, _, out, _ = two_worker_run
    script = f"""
import numpy as np, tensorflow as tf
model = tf.saved_model.load({str(out / 'model')!r})
predictions = model.signatures["serving_pixels"](image=tf.zeros((3, 32, 32, 3), tf.uint8))["probabilities"].numpy()
print("shape", predictions.shape, "sums", np.round(predictions.sum(axis=1), 3).tolist())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "shape (3, 5) sums [1.0, 1.0, 1.0]" in result.stdout


def test_every_worker_trains_in_the_policy_asked_for_and_the_export_is_float32(two_worker_run):
    result, _, out, _ = two_worker_run
    for task in ("chief-0", "worker-0"):
        assert re.search(rf"^\[{task}\] .*trainer: precision: mixed_bfloat16 ", result.stdout, re.M), task
    trained = train_graph_op_dtypes(out / "logs" / "train")
    assert trained["Conv2D"] == trained["Conv2DBackpropFilter"] == ["bfloat16"] and trained["Softmax"] == ["float32"]
    exported = saved_model_op_dtypes(out / "model")
    assert exported["Conv2D"] == exported["Softmax"] == ["float32"]


def test_the_served_model_takes_jpeg_bytes_and_answers_with_class_names(two_worker_run):
    _, _, out, _ = two_worker_run
    served = served_predictions(out / "model", count=4)
    assert len(served["probabilities"]) == 4 and all(abs(sum(p) - 1) < 1e-3 for p in served["probabilities"])
    cassava = ["cbb", "cbsd", "cgm", "cmd", "healthy"]
    assert served["class_name"] == [cassava[i] for i in served["class_index"]]


def test_each_epochs_metrics_appear_once_and_workers_only_mark_epochs(two_worker_run):
    result, *_ = two_worker_run
    lines = result.stdout.splitlines()
    for epoch in (1, 2):
        with_metrics = [line for line in lines if re.search(rf"epoch {epoch}/2 ends: .*\bloss=", line)]
        assert len(with_metrics) == 1 and with_metrics[0].startswith("[chief-0] "), with_metrics
        assert re.fullmatch(rf"\[chief-0\] \S+ trainer: epoch {epoch}/2 ends: accuracy=\S+ loss=\S+ "
                            rf"val_accuracy=\S+ val_loss=\S+ \(\d+\.\ds\)", with_metrics[0]), with_metrics[0]
    worker_marks = [line.split(" trainer: ")[1] for line in lines if line.startswith("[worker-0] ") and " trainer: epoch " in line]
    assert worker_marks == ["epoch 1/2 begins", "epoch 1/2 ends", "epoch 2/2 begins", "epoch 2/2 ends"]
    # Keras' own progress lines and TensorFlow's repeated harmless ones are gone; the launcher says so.
    for noise in ("Epoch 1/2", "GeneratorDatasetOp", "absl::InitializeLog", "is slow compared to the batch time",
                  "Traceback"):
        assert noise not in result.stdout, noise
    assert re.search(r"^\[launch\] hid \d+ known-harmless TensorFlow lines", result.stdout, re.M)


def test_both_workers_end_with_the_same_weights(two_worker_run):
    result, *_ = two_worker_run
    fingerprints = {task: re.findall(rf"^\[{task}\] .*trainer: trained 2 epochs of \d+ steps; weights (\w+)", result.stdout, re.M)
                    for task in ("chief-0", "worker-0")}
    assert len(fingerprints["chief-0"]) == 1 and fingerprints["chief-0"] == fingerprints["worker-0"], fingerprints


def test_a_healthy_job_ends_without_an_error_line_in_any_task(two_worker_run):
    """Whichever task leaves first, no task logs a coordination-service error (trainer.library.ending)."""
    result, *_ = two_worker_run
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]


def test_only_the_chief_saves_and_no_worker_scratch_is_left(two_worker_run):
    result, work, out, _ = two_worker_run
    assert re.search(r"^\[chief-0\] .*saved model to .*/out/model \(from .*/checkpoints/epoch-2\)$", result.stdout, re.M)
    assert not re.search(r"^\[worker-0\] .*sav", result.stdout, re.M)
    # The worker wrote its checkpoints (a collective) into scratch directories, each removed at once.
    assert os.listdir(work / "worker-0" / "tmp") == []
    assert sorted(os.listdir(out)) == ["checkpoints", "logs", "model"]
    assert {"checkpoint", "epoch-1.index", "epoch-2.index"} <= set(os.listdir(out / "checkpoints"))
    assert "backup" not in os.listdir(out / "checkpoints")  # removed once training finished


def test_the_chief_records_the_run_beside_the_model(two_worker_run):
    _, _, out, _ = two_worker_run
    record = json.loads((out / "model" / "run.json").read_text())
    assert record["strategy"] == "multi_worker_mirrored" and record["replicas_in_sync"] == 2
    assert record["precision"] == "mixed_bfloat16" and record["task_flags"]["architecture"] == "small"
    # Each epoch's metrics, and apart from them its time and input wait.
    first = record["epochs"][0]
    assert sorted(first) == ["input_wait", "metrics", "seconds"] and sorted(first["metrics"])[:2] == ["accuracy", "loss"]
    assert 0 <= first["input_wait"]["share"] <= 1 and first["input_wait"]["step_seconds"] <= first["seconds"]
    import keras
    import tensorflow as tf

    # The versions the job ran with, this environment's (the pinned 2.21, or a trial lock's 2.22.0rc0).
    assert record["versions"]["tensorflow"] == tf.__version__ and record["versions"]["keras"] == keras.__version__
    assert keras.__version__.startswith("3.")


def test_only_the_chief_reported_hypertune_metrics(two_worker_run):
    _, work, _, _ = two_worker_run
    lines = (work / "chief-0" / "hypertune" / "output.metrics").read_text().splitlines()
    reports = [json.loads(line) for line in lines]
    assert [r["global_step"] for r in reports] == ["1", "2"]
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in reports)
    assert not (work / "worker-0" / "hypertune").exists()


def test_two_workers_train_the_real_resnet50(resnet50_two_worker_job):
    """The real ResNet50 over both workers, then the chief's export: the run's shared ResNet50 job
    (tests/integration/conftest.py), which test_input_wait's healthy job also reads. It was a job of
    its own, one step at 64 images a replica."""
    job = resnet50_two_worker_job
    assert job["returncode"] == 0, job["stdout"][-4000:]
    assert "strategy=multi_worker_mirrored replicas=2 global_batch=16" in job["stdout"]
    assert (Path(job["model_dir"]) / "saved_model.pb").exists()
    assert os.listdir(Path(job["work"]) / "worker-0" / "tmp") == []


def preemptible_args(tmp_path, data_root, every_steps: int):
    return ["--workers", "2", "--work-dir", str(tmp_path / "work"), "--grace-period", "20", "--", "python", "-m", "cassava.task",
            "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "3", "--steps-per-epoch", "150",
            *SMALL_RUN, "--model-dir", str(tmp_path / "out" / "model"), "--backup-every-steps", str(every_steps)]


def rerun(args) -> subprocess.CompletedProcess:
    second = subprocess.run([sys.executable, "-m", "trainer.launch", *args], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    return second


def test_killed_job_resumes_at_the_step_of_its_last_backup(tmp_path, data_root):
    """The machine goes away mid-epoch (SIGTERM to the launcher kills every task at once, no
    time to save): the rerun resumes at the newest step backup, losing fewer than N steps."""
    every = 20
    args = preemptible_args(tmp_path, data_root, every)
    code, first = launch_until(args, r"^\[chief-0\] .*backup saved in \d+\.\ds: a restart resumes at epoch 2 step [3-9]\d$",
                               lambda so_far, launcher: launcher.send_signal(signal.SIGTERM))
    assert code != 0 and "epoch 2/3 ends" not in first, first[-3000:]
    newest = backups_reported(first)[-1]
    assert newest[0] == 2 and newest[1] >= 30
    assert not (tmp_path / "out" / "model" / "saved_model.pb").exists()

    # Meanwhile another job (other flags: 10 steps an epoch) is pointed at the same directories:
    # it trains from scratch in a place of its own and leaves the stopped job's backup as it was.
    backup = tmp_path / "out" / "checkpoints" / "backup"
    stopped = {path.name: path.stat().st_mtime_ns for path in backup.iterdir()}
    other = rerun([arg if arg != "150" else "10" for arg in args])
    assert re.search(r"^\[chief-0\] .*trainer: checkpoints: .*/out/checkpoints holds the state of another job "
                     r"\(--steps-per-epoch 150\); this job \(--steps-per-epoch 10\) keeps its own in .*/out/checkpoints/jobs/\w+$",
                     other.stdout, re.M), other.stdout[-3000:]
    assert resumed_at(other.stdout) is None and resumed_at(other.stdout, "worker-0") is None
    assert {path.name: path.stat().st_mtime_ns for path in backup.iterdir()} == stopped

    second = rerun(args)
    epoch, step = resumed_at(second.stdout)
    assert epoch == 2 and step >= newest[1], (newest, second.stdout[-2000:])  # never earlier than the newest backup
    assert resumed_at(second.stdout, "worker-0") == (epoch, step)
    assert epochs_begun(second.stdout) == [2, 3]
    assert (tmp_path / "out" / "model" / "saved_model.pb").exists()


def test_sigterm_to_one_worker_saves_a_backup_on_every_task_and_exits_retryable(tmp_path, data_root):
    """A Spot preemption: SIGTERM reaches one replica. Every task backs up at the same step and
    exits 143, which Kubeflow's ExitCode policy retries; the rerun resumes exactly there."""
    args = preemptible_args(tmp_path, data_root, 1000)  # no step backup would happen on its own
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                               lambda so_far, _: os.kill(int(re.search(r"started worker-0 \(pid (\d+)\)", so_far).group(1)),
                                                         signal.SIGTERM))
    assert code == 143, first[-3000:]
    saved = {}
    for task in ("chief-0", "worker-0"):
        match = re.search(rf"^\[{task}\] cassava.task: preempted \(SIGTERM\): saved a backup; a restart resumes at "
                          rf"epoch (\d+) step (\d+) \(exit 143\)$", first, re.M)
        assert match, first[-3000:]
        saved[task] = (int(match.group(1)), int(match.group(2)))
    assert saved["chief-0"] == saved["worker-0"] and saved["chief-0"][0] == 2
    assert "task exit codes: chief-0=143 worker-0=143" in first

    second = rerun(args)
    assert resumed_at(second.stdout) == saved["chief-0"]


def test_lost_worker_makes_the_chief_exit_retryable_with_one_line(tmp_path, data_root):
    args = preemptible_args(tmp_path, data_root, 20)
    code, first = launch_until(args, r"^\[chief-0\] .*backup saved in \d+\.\ds: a restart resumes at epoch 2 step \d+$",
                               lambda so_far, _: os.killpg(int(re.search(r"started worker-0 \(pid (\d+)\)", so_far).group(1)),
                                                           signal.SIGKILL))
    assert code == 137, first[-3000:]  # the first failure: worker-0, killed
    newest = backups_reported(first)[-1]
    errors = re.findall(r"^\[chief-0\] cassava.task: error: (.*)$", first, re.M)
    assert len(errors) == 1, first[-3000:]
    assert re.fullmatch(rf"lost worker-0 of this multi_worker_mirrored job \(\w+Error: .+\); a restart resumes at "
                        rf"epoch {newest[0]} step {newest[1]} \(exit 143\)", errors[0]), errors[0]
    assert "task exit codes: chief-0=143 worker-0=137" in first
    assert "Traceback" not in first


def test_a_failing_task_stops_the_job(tmp_path, data_root):
    """The chief cannot write its model dir and exits 2; the worker would wait for it forever."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    result, _ = launch(tmp_path, data_root, "--dataset", "synthetic:64", *SMALL_RUN,
                       "--model-dir", str(blocked / "model"), timeout=300)
    assert result.returncode == 2
    assert re.search(r"^\[chief-0\] cassava.task: error: cannot write to .*blocked/model", result.stdout, re.M)
    assert "chief-0 failed with exit code 2: stopping every task" in result.stdout


def test_weights_that_cannot_be_fetched_fail_in_one_line_in_every_task(tmp_path, data_root):
    """Two replicas, each a process of its own as on two machines, where storage.googleapis.com
    cannot be reached: blocked here on purpose (every https request goes to a proxy port nothing
    listens on; an empty Keras cache). Each fetches before the cluster forms and says so in one
    line naming --weights, exit 2: a configuration error, which no platform retries."""
    from trainer.process import launch as launcher, ports

    cluster, tasks = launcher.plan_cluster(2, 0, False, ports.free_ports(2, "localhost"))
    closed = f"http://127.0.0.1:{ports.free_port()}"
    env = clean_env(https_proxy=closed, HTTPS_PROXY=closed, no_proxy="localhost,127.0.0.1", NO_PROXY="localhost,127.0.0.1",
                    KERAS_HOME=str(tmp_path / "keras"))
    # Through trainer.run, as in the images: stderr is then the task's problems alone, without the
    # lines TensorFlow prints as it loads on some CPUs (trainer/relay.py).
    processes = [subprocess.Popen([sys.executable, "-m", "trainer.run", "--", "python", "-m", "cassava.task", "--data-dir", str(data_root), "--dataset",
                                   "synthetic:64", "--epochs", "1", "--model-dir", str(tmp_path / "out" / "model")],
                                  cwd=REPO, env={**env, "TF_CONFIG": launcher.tf_config(cluster, task)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for task in tasks]
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, out[-2000:] + err[-3000:]
        assert re.fullmatch(r"cassava\.task: error: --weights imagenet: cannot fetch ResNet50's ImageNet weights \(.*"
                            r"Connection refused.*\); give --weights none to train from scratch, or --weights FILE, .*\n",
                            err), err[-3000:]
    assert not list((tmp_path / "keras").rglob("*.h5"))

