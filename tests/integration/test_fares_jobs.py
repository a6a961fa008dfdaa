"""The fares example (examples/fares), a user's Task that is not cassava, trained by real
processes through trainer.launch: MultiWorkerMirrored with a preemption and its resume, then
ParameterServer with the side-car evaluator. It must learn (beat always predicting the mean
fare), report to tuning and save from the chief only."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import REPO, STORED_AND_USED, backups_reported, clean_env, epochs_begun, launch_until, resumed_at

EXAMPLE = REPO / "examples" / "fares"
EPOCHS, STEPS, EVERY = 2, 60, 10


def fares_env() -> dict:
    return clean_env(PYTHONPATH=f"{REPO}{os.pathsep}{EXAMPLE}")


def launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.launch", *args], cwd=REPO, env=fares_env(),
                          capture_output=True, text=True, timeout=timeout)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def fares_data(tmp_path_factory):
    """400 training trips in 4 files and 100 for evaluation; and the mean absolute error of always
    predicting the training trips' mean fare on the evaluation trips: what learning must beat."""
    root = tmp_path_factory.mktemp("fares-data")
    made = subprocess.run([sys.executable, "-m", "fares.generate", "--out", str(root), "--files", "4", "--rows", "400",
                           "--eval-rows", "100"], cwd=REPO, env=fares_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    train = [float(row["fare"]) for path in sorted(root.glob("train-*.csv")) for row in read_csv(path)]
    evaluation = [float(row["fare"]) for row in read_csv(root / "eval-00000-of-00001.csv")]
    mean = sum(train) / len(train)
    baseline = sum(abs(fare - mean) for fare in evaluation) / len(evaluation)
    return root, baseline


def task_flags(root, out, *extra: str) -> list[str]:
    return ["python", "-m", "fares.task", "--train-files", str(root / "train-*.csv"),
            "--eval-files", str(root / "eval-*.csv"), "--per-replica-batch-size", "16",
            "--model-dir", str(out / "model"), *extra]


_PREDICT = """
import csv, json, sys
import trainer, tensorflow as tf
rows = list(csv.DictReader(open(sys.argv[2])))
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
columns = {"distance_km": tf.constant([float(r["distance_km"]) for r in rows]),
           "passengers": tf.constant([int(r["passengers"]) for r in rows], tf.int64),
           "hour": tf.constant([int(r["hour"]) for r in rows], tf.int64),
           "payment_type": tf.constant([r["payment_type"] for r in rows]),
           "pickup_zone": tf.constant([r["pickup_zone"] for r in rows])}
fares = serve(**columns)["fare"].numpy().tolist()
inputs = sorted(serve.structured_input_signature[1])
stored, used = stored_and_used(sys.argv[1])
print(json.dumps({"inputs": inputs, "count": len(fares), "stored": stored, "used": used,
                  "mae": sum(abs(f - float(r["fare"])) for f, r in zip(fares, rows)) / len(rows)}))
""".replace("import trainer, tensorflow as tf\n", "import trainer, tensorflow as tf\n" + STORED_AND_USED)


def served_error(model_dir, rows_csv) -> dict:
    """The export loaded as a server would, in a fresh process, asked for the fares of the raw
    rows of `rows_csv` by column name: its inputs, answers and mean absolute error."""
    result = subprocess.run([sys.executable, "-c", _PREDICT, str(model_dir), str(rows_csv)], cwd=REPO, env=fares_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def last_epoch_metric(output: str, name: str) -> float:
    found = re.findall(rf"^\[chief-0\] .*trainer: epoch {EPOCHS}/{EPOCHS} ends: .*\b{name}=(\S+) ", output, re.M)
    assert found, output[-3000:]
    return float(found[-1])


@pytest.fixture(scope="module")
def preempted_mwms(tmp_path_factory, fares_data):
    """Two workers; a Spot-like SIGTERM reaches worker-0 mid-epoch 1, after a backup at step 20,
    30 or 40; then the same command again, as a platform restarts the job."""
    root, _ = fares_data
    tmp_path = tmp_path_factory.mktemp("fares-mwms")
    args = ["--workers", "2", "--work-dir", str(tmp_path / "work"), "--timeout", "270", "--",
            *task_flags(root, tmp_path / "out", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS),
                        "--backup-every-steps", str(EVERY))]
    code, first = launch_until(
        args, r"^\[chief-0\] .*backup saved in \d+\.\ds: a restart resumes at epoch 1 step [234]0$",
        lambda so_far, _: os.kill(int(re.search(r"started worker-0 \(pid (\d+)\)", so_far).group(1)), signal.SIGTERM),
        env=fares_env())
    second = launch(*args)
    return code, first, second, tmp_path


def test_a_preempted_worker_makes_every_task_back_up_mid_epoch_and_exit_retryable(preempted_mwms):
    code, first, _, _ = preempted_mwms
    assert code == 143, first[-3000:]
    saved = set()
    for task in ("chief-0", "worker-0"):
        match = re.search(rf"^\[{task}\] fares.task: preempted \(SIGTERM\): saved a backup; a restart resumes at "
                          rf"epoch (\d+) step (\d+) \(exit 143\)$", first, re.M)
        assert match, first[-3000:]
        saved.add((int(match.group(1)), int(match.group(2))))
    [(epoch, step)] = saved  # both tasks at the same step
    assert epoch == 1 and 20 <= step < STEPS, saved
    assert "saved model to" not in first and "epoch 1/2 ends" not in first


def test_the_rerun_resumes_at_that_step_and_trains_only_the_rest(preempted_mwms):
    _, first, second, _ = preempted_mwms
    assert second.returncode == 0, second.stdout[-4000:]
    saved = re.search(r"^\[chief-0\] fares.task: preempted .* resumes at epoch (\d+) step (\d+)", first, re.M)
    resumed = (int(saved.group(1)), int(saved.group(2)))
    assert resumed_at(second.stdout) == resumed_at(second.stdout, "worker-0") == resumed, second.stdout[-3000:]
    assert epochs_begun(second.stdout) == [1, 2]
    # A backup every 10 steps counts the steps the rerun trained: only those after the resume point.
    total, done = EPOCHS * STEPS, resumed[1]
    positions = [(e - 1) * STEPS + s for e, s in backups_reported(second.stdout)]
    assert positions and min(positions) > done, (done, positions)
    assert len(positions) <= (total - done) // EVERY < total // EVERY, (done, positions)
    assert "replicas=2 global_batch=32 (16 per replica)" in second.stdout


def test_two_workers_learn_far_better_than_the_mean_fare(preempted_mwms, fares_data):
    _, _, second, _ = preempted_mwms
    _, baseline = fares_data
    assert last_epoch_metric(second.stdout, "val_mae") < 0.5 * baseline, (baseline, second.stdout[-2000:])


def test_only_the_chief_reported_mae_to_hypertune(preempted_mwms):
    _, _, second, tmp_path = preempted_mwms
    work = tmp_path / "work"
    reports = [json.loads(line) for line in (work / "chief-0" / "hypertune" / "output.metrics").read_text().splitlines()]
    assert [r["global_step"] for r in reports] == ["1", "2"]
    assert abs(float(reports[-1]["mae"]) - last_epoch_metric(second.stdout, "val_mae")) < 1e-3
    assert not (work / "worker-0" / "hypertune").exists()


def test_only_the_chiefs_model_is_kept_and_it_serves_raw_columns(preempted_mwms, fares_data):
    _, _, second, tmp_path = preempted_mwms
    root, baseline = fares_data
    assert not re.search(r"^\[worker-0\] .*saved model", second.stdout, re.M)
    fingerprints = {task: re.findall(rf"^\[{task}\] .*trainer: trained \d+ epochs of \d+ steps; weights (\w+)", second.stdout, re.M)
                    for task in ("chief-0", "worker-0")}
    assert len(fingerprints["chief-0"]) == 1 and fingerprints["chief-0"] == fingerprints["worker-0"], fingerprints
    assert os.listdir(tmp_path / "work" / "worker-0" / "tmp") == []
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoints", "logs", "model"]
    served = served_error(tmp_path / "out" / "model", root / "eval-00000-of-00001.csv")
    assert served["inputs"] == ["distance_km", "hour", "passengers", "payment_type", "pickup_zone"]
    assert served["count"] == 100 and served["mae"] < 0.5 * baseline, (served, baseline)
    assert served["stored"] == served["used"] > 0, served  # each weight stored once (trainer.export)


@pytest.fixture(scope="module")
def pss_job(tmp_path_factory, fares_data):
    root, _ = fares_data
    tmp_path = tmp_path_factory.mktemp("fares-pss")
    result = launch("--workers", "2", "--ps", "1", "--evaluator", "--work-dir", str(tmp_path / "work"), "--timeout", "270",
                    "--", *task_flags(root, tmp_path / "out", "--epochs", str(EPOCHS)))
    return result, tmp_path


def test_parameter_server_job_with_an_evaluator_trains_and_exports(pss_job, fares_data):
    result, tmp_path = pss_job
    root, _ = fares_data
    assert result.returncode == 0, result.stdout[-4000:]
    assert "strategy=parameter_server workers=2 ps=1 batch per step=16 steps_per_epoch=25" in result.stdout
    assert re.search(r"^\[launch\] task exit codes: chief-0=0 .*evaluator-0=0$", result.stdout, re.M), result.stdout[-2000:]
    served = served_error(tmp_path / "out" / "model", root / "eval-00000-of-00001.csv")
    # The export is the final checkpoint, which the evaluator also scored on the same file: the served
    # model's error is the evaluator's last one. (How far an asynchronous run of 50 steps gets is
    # not asserted here: under load one ended worse than the mean predictor. The MWMS test holds
    # the learning.)
    evaluated = re.findall(r"^\[evaluator-0\] .*evaluator: epoch 2: .*\bmae=(\d+\.\d+)", result.stdout, re.M)
    assert evaluated, result.stdout[-3000:]
    assert abs(served["mae"] - float(evaluated[-1])) <= 0.05 * float(evaluated[-1]) + 1e-3, (served, evaluated)
    reports = (tmp_path / "work" / "chief-0" / "hypertune" / "output.metrics").read_text().splitlines()
    assert [json.loads(line)["global_step"] for line in reports] == ["1", "2"]


def test_the_evaluator_wrote_eval_summaries_for_every_epoch_it_saw_up_to_the_last(pss_job):
    result, tmp_path = pss_job
    assert re.search(r"^\[evaluator-0\] .*evaluator: evaluated the final checkpoint \(epoch 2\)", result.stdout, re.M)
    script = """
import glob, json, sys
import trainer, tensorflow as tf
found = {}
for path in glob.glob(sys.argv[1] + "/events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            found.setdefault(value.tag, []).append(event.step)
print(json.dumps(found))
"""
    read = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out" / "logs" / "eval")], cwd=REPO,
                          env=fares_env(), capture_output=True, text=True, timeout=300)
    assert read.returncode == 0, read.stderr[-2000:]
    tags = json.loads(read.stdout.strip().splitlines()[-1])
    assert {"eval_loss", "eval_mae", "eval_rmse"} <= set(tags) and max(tags["eval_mae"]) == EPOCHS, tags


def test_a_bad_header_stops_the_job_with_one_line_and_exit_2(tmp_path):
    (tmp_path / "train.csv").write_text("km,fare\n1.0,5.0\n")
    result = subprocess.run([sys.executable, "-m", "fares.task", "--train-files", str(tmp_path / "*.csv"),
                             "--model-dir", str(tmp_path / "model")], cwd=REPO, env=fares_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"fares.task: error: {tmp_path / 'train.csv'}:1: the header is km,fare; expected "
        "distance_km,passengers,hour,payment_type,pickup_zone,fare")
    assert "Traceback" not in result.stderr
