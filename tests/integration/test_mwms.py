"""MultiWorkerMirrored training with real processes on localhost, through trainer.launch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import REPO, clean_env, launch_until, run_module, saved_model_op_dtypes

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4"]


def launch(tmp_path, data_root, *task_args, workers=2, timeout=600):
    work = tmp_path / "work"
    result = run_module(
        "trainer.launch", "--workers", str(workers), "--work-dir", str(work), "--timeout", str(timeout - 30), "--",
        "--data-dir", str(data_root), *task_args, timeout=timeout,
    )
    return result, work


def epochs_begun(output: str, task: str = "chief-0") -> list[int]:
    return [int(n) for n in re.findall(rf"^\[{task}\] .*trainer: epoch (\d+)/\d+ begins$", output, re.M)]


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
import trainer, numpy as np, tensorflow as tf
model = tf.keras.models.load_model({str(out / 'model')!r})
predictions = model.predict(np.zeros((3, 32, 32, 3), np.uint8), verbose=0)
print("shape", predictions.shape, "sums", np.round(predictions.sum(axis=1), 3).tolist())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "shape (3, 5) sums [1.0, 1.0, 1.0]" in result.stdout


def test_every_worker_trains_in_the_policy_asked_for_and_the_export_keeps_it(two_worker_run):
    result, _, out, _ = two_worker_run
    for task in ("chief-0", "worker-0"):
        assert re.search(rf"^\[{task}\] .*trainer: precision: mixed_bfloat16 ", result.stdout, re.M), task
    dtypes = saved_model_op_dtypes(out / "model")
    assert dtypes["Conv2D"] == ["bfloat16"] and dtypes["Softmax"] == ["float32"]


def test_no_worker_temp_dir_is_left(two_worker_run):
    result, work, out, _ = two_worker_run
    # The worker saved its copy (the save is a collective) into its own temp dir...
    assert re.search(r"^\[worker-0\] .*saved this worker's copy to .*/worker-0/tmp/model-worker-0-", result.stdout, re.M)
    # ...and removed it; nothing of the worker's is left beside the chief's outputs either.
    assert os.listdir(work / "worker-0" / "tmp") == []
    assert sorted(os.listdir(out)) == ["checkpoints", "logs", "model"]
    leftovers = [os.path.join(d, n) for d, dirs, files in os.walk(out) for n in dirs + files if "workertemp" in n]
    assert leftovers == []
    assert {"checkpoint", "epoch-0001.index", "epoch-0002.index"} <= set(os.listdir(out / "checkpoints"))


def test_only_the_chief_reported_hypertune_metrics(two_worker_run):
    _, work, _, _ = two_worker_run
    lines = (work / "chief-0" / "hypertune" / "output.metrics").read_text().splitlines()
    reports = [json.loads(line) for line in lines]
    assert [r["global_step"] for r in reports] == ["1", "2"]
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in reports)
    assert not (work / "worker-0" / "hypertune").exists()


def test_two_workers_train_the_real_resnet50(tmp_path, data_root):
    model_dir = tmp_path / "model"
    result, work = launch(
        tmp_path, data_root, "--dataset", "synthetic:64", "--epochs", "2", "--steps-per-epoch", "2",
        "--image-size", "64", "--weights", "none", "--model-dir", str(model_dir),
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert "strategy=multi_worker_mirrored replicas=2 global_batch=128" in result.stdout
    assert (model_dir / "saved_model.pb").exists()
    assert os.listdir(work / "worker-0" / "tmp") == []


def test_preempted_job_resumes_at_the_epoch_it_reached(tmp_path, data_root):
    args = ["--workers", "2", "--work-dir", str(tmp_path / "work"), "--",
            "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "3",
            "--steps-per-epoch", "150", *SMALL_RUN, "--model-dir", str(tmp_path / "out" / "model")]
    # Preemption: SIGTERM to the launcher stops every task at once, mid-epoch.
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                               lambda so_far, launcher: launcher.send_signal(signal.SIGTERM))
    assert epochs_begun(first) == [1, 2], first[-3000:]
    assert "epoch 2/3 ends" not in first and code != 0
    assert not (tmp_path / "out" / "model" / "saved_model.pb").exists()

    second = subprocess.run([sys.executable, "-m", "trainer.launch", *args], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert epochs_begun(second.stdout) == [2, 3], "the rerun did not resume at epoch 2"
    assert (tmp_path / "out" / "model" / "saved_model.pb").exists()


def test_a_failing_task_stops_the_job(tmp_path, data_root):
    """The chief cannot write its model dir and exits 2; the worker would wait for it forever."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    result, _ = launch(tmp_path, data_root, "--dataset", "synthetic:64", *SMALL_RUN,
                       "--model-dir", str(blocked / "model"), timeout=300)
    assert result.returncode == 2
    assert re.search(r"^\[chief-0\] trainer.task: error: cannot write to .*blocked/model", result.stdout, re.M)
    assert "chief-0 failed with exit code 2: stopping every task" in result.stdout
