"""stderr inside the CPU image, which Vertex AI's Cloud Logging shows as ERROR: empty for a healthy
job; one line for a bad flag or a bad-data stop. The image's entrypoint runs as PID 1, as Vertex
AI and Kubernetes run it (no --init), so its stderr relay, trainer.run (the entry point), is PID 1."""

from __future__ import annotations

import os
import re
import subprocess
import uuid

import pytest

from helpers import REPO, assert_bad_data_stop_said

# Containers of their own names, no rehearsal: beside the rehearsals, on any worker (tests/parallel.py).
pytestmark = pytest.mark.no_rehearsal

HEALTHY_RUN = ["--dataset", "synthetic:32", "--epochs", "1", "--image-size", "32", "--architecture", "small",
               "--weights", "none", "--per-replica-batch-size", "4"]


def run(engine, image, *args, volumes=()) -> subprocess.CompletedProcess:
    tool, env = engine
    for volume in volumes:  # the image runs as uid 1000
        os.chmod(volume.split(":")[0], 0o777)
    mounts = [flag for volume in volumes for flag in ("-v", volume)]
    return subprocess.run([tool, "run", "--rm", *mounts, image, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_healthy_job_in_the_cpu_image_writes_nothing_to_stderr(engine, cpu_image, tmp_path):
    result = run(engine, cpu_image, *HEALTHY_RUN, "--model-dir", "/out/model", volumes=[f"{tmp_path}:/out"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr == ""
    assert "saved model to /out/model" in result.stdout
    assert (tmp_path / "model" / "saved_model.pb").exists()


def test_a_bad_flag_in_the_cpu_image_is_one_line_on_stderr(engine, cpu_image):
    result = run(engine, cpu_image, "--epochs", "many")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "python -m cassava.task: error: argument --epochs: expected a whole number, got 'many' (--help lists the flags)"]


def test_a_bad_data_stop_in_the_cpu_image_ends_with_its_one_line(engine, cpu_image, tmp_path):
    from integration.test_bad_data import SMALL_RUN, write_dataset

    write_dataset(tmp_path / "data", bad=4)
    result = run(engine, cpu_image, "--dataset", "tfrecord:/in/data/train-*.tfrecord", *SMALL_RUN,
                 "--model-dir", "/in/model", "--max-bad-examples", "3", "--steps-per-epoch", "6",
                 volumes=[f"{tmp_path}:/in"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert_bad_data_stop_said(result.stderr)


def test_sigterm_to_the_container_reaches_the_trainer_through_the_relay(engine, cpu_image, tmp_path):
    """The engine's SIGTERM (a Spot preemption, a pod's deletion) goes to PID 1, the relay, which
    passes it on: the trainer saves its backup and exits 143, as it does when it is PID 1 itself."""
    tool, env = engine
    name = f"cassava-sigterm-{uuid.uuid4().hex[:8]}"
    os.chmod(tmp_path, 0o777)  # the image runs as uid 1000
    process = subprocess.Popen(
        [tool, "run", "--rm", "--name", name, "-v", f"{tmp_path}:/out", cpu_image, *HEALTHY_RUN,
         "--epochs", "50", "--model-dir", "/out/model"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if "epoch 2/50 begins" in line:
                subprocess.run([tool, "kill", "--signal", "TERM", name], env=env, capture_output=True, timeout=60)
                break
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
        subprocess.run([tool, "rm", "-f", name], env=env, capture_output=True, timeout=60)
    assert process.returncode == 143, "".join(seen)[-2000:] + stdout[-2000:] + stderr[-3000:]
    assert re.search(r"^cassava\.task: preempted \(SIGTERM\): saved a backup", stderr, re.M), stderr[-3000:]
