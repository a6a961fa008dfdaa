"""A user's image built FROM the CPU runtime image (examples/fares/Dockerfile), run as Vertex AI runs a
CustomJob (`submit_job.py local`): two MWMS replicas reading CSV files from the bucket, the chief
preempted mid-epoch, the job restarted whole and resumed at the step of its backup; the chief's
model and its tuning metric end up in the bucket."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from containers import build_image, leftovers, sh
from helpers import BUDGETS, REPO, clean_env

from test_vertex_rehearsal import dry_run, lines, run_local, summary

EXAMPLE = REPO / "examples" / "fares"
FARES_IMAGE = "localhost/fares-trainer-cpu:test"
BUCKET = "vx-fares"
# The runtime writes hypertune's file with open(); pointed into the bucket through /gcs/, the
# chief's reports outlive the container, where the test can read them (a tuning trial's metrics
# file is the rehearsal's own, and a CustomJob's stays in the container).
METRICS_FILE = f"/gcs/{BUCKET}/hypertune/output.metrics"


@pytest.fixture(scope="session")
def fares_image(engine, runtime_cpu_image):
    """examples/fares/Dockerfile built on the CPU runtime image, as a user builds it, with the build
    context holding only the example."""
    started = time.monotonic()
    build_image(engine, "--build-arg", f"BASE_IMAGE={runtime_cpu_image}", "-t", FARES_IMAGE, str(EXAMPLE))
    BUDGETS.append(f"fares image build (on the CPU runtime image): {time.monotonic() - started:.0f}s")
    return FARES_IMAGE


def test_the_fares_dockerfile_passes_hadolint():
    result = sh("hadolint", "--config", ".hadolint.yaml", "examples/fares/Dockerfile", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fares_image_trains_under_vertex_is_preempted_resumes_and_saves_from_the_chief(engine, fares_image, tmp_path):
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "fares.generate", "--out", str(data), "--files", "4", "--rows", "400",
                           "--eval-rows", "100"], cwd=REPO, env=clean_env(PYTHONPATH=f"{REPO}:{EXAMPLE}"),
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    spec = dry_run("vertex", "--workers", "1", "--base-output-dir", f"gs://{BUCKET}/job", "--",
                   "--train-files", f"gs://{BUCKET}/data/train-*.csv", "--eval-files", f"/gcs/{BUCKET}/data/eval-*.csv",
                   "--epochs", "2", "--steps-per-epoch", "60", "--per-replica-batch-size", "16",
                   "--backup-every-steps", "10", image=fares_image)
    chief_pool = spec["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]
    assert "command" not in chief_pool  # the image's ENTRYPOINT runs: trainer.run -- python -m fares.task
    chief_pool["env"] = [{"name": "CLOUD_ML_HP_METRIC_FILE", "value": METRICS_FILE}]
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"), "--stage", f"{data}=gs://{BUCKET}/data",
                       "--preempt", "workerpool0-0@/a restart resumes at epoch 1 step 10$/")
    assert result.returncode == 0, result.stdout[-5000:]

    notes = lines(result.stdout, "local-run")
    assert any(n.startswith("preempting (Spot VM) workerpool0-0: SIGTERM now") for n in notes), notes
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    assert "strategy=multi_worker_mirrored replicas=2 global_batch=32" in chief, chief[-3000:]
    saved = re.search(r"fares.task: preempted \(SIGTERM\): saved a backup; a restart resumes at epoch 1 step (\d+) "
                      r"\(exit 143\)$", chief, re.M)
    assert saved and 10 <= int(saved.group(1)) < 60, chief[-3000:]
    resumed = re.findall(r"trainer: resumed from backup at epoch (\d+) step (\d+)$", chief, re.M)
    assert resumed == [("1", saved.group(1))], chief[-3000:]
    assert "trainer: epoch 2/2 ends: loss=" in chief.split("resumed from backup", 1)[1]
    rows = summary(result.stdout)
    assert rows["workerpool0-0"][0][-1] == 0 and rows["workerpool0-0"][1] == 1, rows

    kept = tmp_path / "kept" / BUCKET
    assert (kept / "job" / "model" / "saved_model.pb").exists()
    # The worker's copy of the model (saving is a collective) stayed on its own disk.
    assert sorted(p.name for p in (kept / "job").iterdir()) == ["checkpoints", "logs", "model"]
    assert not [p for p in (kept / "job").rglob("*") if "workertemp" in p.name or "worker-" in p.name]
    reports = [json.loads(line) for line in (kept / "hypertune" / "output.metrics").read_text().splitlines()]
    last = re.findall(r"epoch 2/2 ends: .*\bval_mae=(\S+) ", chief)
    assert [r["global_step"] for r in reports] == ["1", "2"] and abs(float(reports[-1]["mae"]) - float(last[-1])) < 1e-3
    assert leftovers(engine) == []


def test_the_fares_image_trains_under_parameter_server_with_an_evaluator(engine, fares_image, tmp_path):
    """The same image as a ParameterServer job: a coordinator, 2 workers, 1 parameter server and the
    side-car evaluator, the data in the bucket; the coordinator exports and reports to tuning."""
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "fares.generate", "--out", str(data), "--files", "4", "--rows", "400",
                           "--eval-rows", "100"], cwd=REPO, env=clean_env(PYTHONPATH=f"{REPO}:{EXAMPLE}"),
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    spec = dry_run("vertex", "--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator",
                   "--base-output-dir", f"gs://{BUCKET}/pss", "--",
                   "--train-files", f"/gcs/{BUCKET}/data/train-*.csv", "--eval-files", f"/gcs/{BUCKET}/data/eval-*.csv",
                   "--epochs", "3", "--steps-per-epoch", "100", "--per-replica-batch-size", "16", image=fares_image)
    spec["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] = [
        {"name": "CLOUD_ML_HP_METRIC_FILE", "value": METRICS_FILE}]
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"), "--stage", f"{data}=gs://{BUCKET}/data")
    assert result.returncode == 0, result.stdout[-5000:]

    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    assert "strategy=parameter_server workers=2 ps=1" in chief, chief[-3000:]
    assert "trainer: epoch 3/3 ends: loss=" in chief, chief[-3000:]
    # The evaluator evaluates the epochs' checkpoints as they come, with the job's own metrics. The
    # job ends when its primary replica (the coordinator) exits, as on Vertex, so the evaluation
    # of the last checkpoint races the coordinator's export: the epochs before it are the ones the
    # evaluator must have had time for.
    evaluator = "\n".join(lines(result.stdout, "workerpool3-0"))
    evaluated = [int(epoch) for epoch in re.findall(r"evaluator: epoch (\d): .*\bmae=\d", evaluator)]
    assert evaluated and evaluated == sorted(set(evaluated)) and evaluated[-1] <= 3, evaluator[-3000:]
    assert lines(result.stdout, "workerpool3-0", "ERROR") == [], evaluator[-3000:]  # no torn checkpoint state
    kept = tmp_path / "kept" / BUCKET
    assert (kept / "pss" / "model" / "saved_model.pb").exists()
    reports = [json.loads(line) for line in (kept / "hypertune" / "output.metrics").read_text().splitlines()]
    assert [r["global_step"] for r in reports] == ["1", "2", "3"] and all(float(r["mae"]) > 0 for r in reports)
    assert leftovers(engine) == []
