"""The reviews example (examples/reviews): a transformer written with keras.ops, which only
Keras 3 expresses and which Keras 3's own fit cannot train across workers, trained by real
processes through trainer.launch: two MultiWorkerMirrored workers preempted mid-epoch by SIGTERM
and resumed at the step, ending with the same weights; then ParameterServer with the side-car
evaluator. It must learn, and its export must read raw text."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import REPO, STORED_AND_USED, clean_env, epochs_begun, launch_until, resumed_at

EXAMPLE = REPO / "examples" / "reviews"


def reviews_env() -> dict:
    return clean_env(PYTHONPATH=f"{REPO}{os.pathsep}{EXAMPLE}")


@pytest.fixture(scope="module")
def reviews_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("reviews-data")
    made = subprocess.run([sys.executable, "-m", "reviews.generate", "--out", str(root), "--files", "4", "--rows", "2000"],
                          cwd=REPO, env=reviews_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return root


def task_flags(root, out, *extra: str) -> list[str]:
    return ["python", "-m", "reviews.task", "--train-files", str(root / "train-*.tsv"),
            "--eval-files", str(root / "eval-*.tsv"), "--per-replica-batch-size", "16", "--model-dir", str(out / "model"),
            *extra]


_READ = """
import json, sys
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](text=tf.constant(sys.argv[2:]))
stored, used = stored_and_used(sys.argv[1])
print(json.dumps({"label": [l.decode() for l in served["label"].numpy()], "stored": stored, "used": used,
                  "probability": [round(float(p), 4) for p in served["probability"].numpy()]}))
""".replace("import tensorflow as tf\n", "import tensorflow as tf\n" + STORED_AND_USED, 1)


def read_reviews(model_dir, *texts: str) -> dict:
    import json

    result = subprocess.run([sys.executable, "-c", _READ, str(model_dir), *texts], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def preempted_and_resumed(tmp_path_factory, reviews_data):
    """Two workers, 3 epochs of 150 steps; SIGTERM reaches worker-0 once epoch 2 has begun."""
    tmp_path = tmp_path_factory.mktemp("reviews-mwms")
    out = tmp_path / "out"
    args = ["--workers", "2", "--work-dir", str(tmp_path / "work"), "--grace-period", "30", "--",
            *task_flags(reviews_data, out, "--epochs", "3", "--steps-per-epoch", "150", "--backup-every-steps", "1000")]
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                               lambda so_far, _: os.kill(int(re.search(r"started worker-0 \(pid (\d+)\)", so_far).group(1)),
                                                         signal.SIGTERM), env=reviews_env())
    second = subprocess.run([sys.executable, "-m", "trainer.launch", *args], cwd=REPO, env=reviews_env(),
                            capture_output=True, text=True, timeout=600)
    return code, first, second, out


def test_a_sigterm_mid_epoch_saves_on_both_workers_and_the_rerun_resumes_at_that_step(preempted_and_resumed):
    code, first, second, out = preempted_and_resumed
    assert code == 143, first[-3000:]
    stops = {task: re.search(rf"^\[{task}\] reviews.task: preempted \(SIGTERM\): saved a backup; a restart resumes at "
                             rf"epoch (\d+) step (\d+) \(exit 143\)$", first, re.M) for task in ("chief-0", "worker-0")}
    assert all(stops.values()), first[-3000:]
    saved = {task: (int(match.group(1)), int(match.group(2))) for task, match in stops.items()}
    assert saved["chief-0"] == saved["worker-0"] and saved["chief-0"][0] == 2
    assert second.returncode == 0, second.stdout[-4000:]
    assert resumed_at(second.stdout) == resumed_at(second.stdout, "worker-0") == saved["chief-0"]
    assert epochs_begun(second.stdout) == [2, 3]


def test_both_workers_end_with_the_same_weights_and_only_the_chief_saves(preempted_and_resumed):
    _, _, second, out = preempted_and_resumed
    fingerprints = {task: re.findall(rf"^\[{task}\] .*trainer: trained 3 epochs of 150 steps; weights (\w+)", second.stdout, re.M)
                    for task in ("chief-0", "worker-0")}
    assert len(fingerprints["chief-0"]) == 1 and fingerprints["chief-0"] == fingerprints["worker-0"], fingerprints
    assert not re.search(r"^\[worker-0\] .*saved model", second.stdout, re.M)
    assert (out / "model" / "saved_model.pb").exists() and (out / "model" / "run.json").exists()


def test_it_learns_and_its_export_reads_raw_text(preempted_and_resumed):
    _, _, second, out = preempted_and_resumed
    accuracy = float(re.search(r"^\[chief-0\] .*trainer: final val_accuracy=(\S+):", second.stdout, re.M).group(1))
    assert accuracy > 0.7, second.stdout[-3000:]  # guessing scores 0.5
    served = read_reviews(out / "model", "the food was great and the staff was friendly",
                          "the food was not great and the staff was rude", "the coffee was never bad and the view was lovely")
    assert served["label"] == ["positive", "negative", "positive"], served
    assert served["stored"] == served["used"] > 0, served  # each weight stored once (trainer.export)
    assert all(0 <= p <= 1 for p in served["probability"])


def test_a_parameter_server_job_with_an_evaluator_trains_it(tmp_path, reviews_data):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", "--ps", "1", "--evaluator", "--work-dir",
         str(tmp_path / "work"), "--", *task_flags(reviews_data, out, "--epochs", "2", "--steps-per-epoch", "20")],
        cwd=REPO, env=reviews_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "strategy=parameter_server workers=2 ps=1" in result.stdout
    assert re.search(r"^\[evaluator-0\] .*evaluator: evaluated the final checkpoint \(epoch 2\)", result.stdout, re.M)
    assert re.search(r"^\[chief-0\] .*trainer: epoch 2/2 ends: accuracy=\S+ auc=\S+ loss=\S+ \(", result.stdout, re.M)
    served = read_reviews(out / "model", "the meal was good")
    assert served["label"][0] in ("positive", "negative")
