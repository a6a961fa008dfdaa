"""A healthy job writes nothing to stderr, which Cloud Logging reads as ERROR; a job that stops
still says why there. Run as the images run it, `python -m trainer.run -- python -m cassava.task`
(trainer.run, the one stderr relay, leaves out TensorFlow's known-harmless lines), with the
variables the images set (read from Dockerfile.cpu), so what passes here is what the image does;
tests/container/test_stderr.py runs the image itself, tests/integration/test_run_command.py the
relay on small commands."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from helpers import REPO, assert_bad_data_stop_said, clean_env, run_module
from trainer.process.ports import free_ports

HEALTHY_RUN = ["--dataset", "synthetic:32", "--epochs", "1", "--image-size", "32", "--architecture", "small",
               "--weights", "none", "--per-replica-batch-size", "4"]
# Lines TensorFlow's C++ runtime writes: severity letter, date, time (absl's and TensorFlow's formats).
RUNTIME_LINE = re.compile(r"^(\[[\w-]+\] )?([IWEF]\d{4} |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )")


def image_environment() -> dict[str, str]:
    """The logging variables Dockerfile.cpu's ENV instructions set, as they set them."""
    text = (REPO / "Dockerfile.cpu").read_text().replace("\\\n", " ")
    environment = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            environment.update(item.split("=", 1) for item in shlex.split(line[4:]))
    wanted = {key: environment.get(key) for key in ("TF_CPP_MIN_LOG_LEVEL",)}
    assert None not in wanted.values(), wanted
    return wanted


# The images' entry point, before the task's own command.
RELAY = [sys.executable, "-m", "trainer.run", "--"]


@pytest.fixture(scope="module")
def two_process_job(tmp_path_factory, data_root):
    """A MultiWorkerMirrored job of two cassava.task processes started as a platform starts them,
    each with its own stdout and stderr."""
    tmp_path = tmp_path_factory.mktemp("quiet")
    chief_port, worker_port = free_ports(2, "localhost")
    cluster = {"chief": [f"localhost:{chief_port}"], "worker": [f"localhost:{worker_port}"]}
    processes = {}
    for role in ("chief", "worker"):
        scratch = tmp_path / role
        scratch.mkdir()
        env = clean_env(**image_environment(), TMPDIR=str(scratch),
                        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": 0}}))
        processes[role] = subprocess.Popen(
            [*RELAY, "python", "-m", "cassava.task", *HEALTHY_RUN, "--data-dir", str(data_root),
             "--model-dir", str(tmp_path / "model")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        outputs = {role: process.communicate(timeout=600) for role, process in processes.items()}
    finally:
        for process in processes.values():
            process.kill()
    return {role: (processes[role].returncode, *outputs[role]) for role in processes}, tmp_path / "model"


def test_a_healthy_two_worker_job_writes_nothing_to_stderr_in_either_task(two_process_job):
    results, model = two_process_job
    for role, (code, stdout, stderr) in results.items():
        assert code == 0, f"{role}:\n{stdout[-2000:]}\n{stderr[-3000:]}"
        assert stderr == "", f"{role} wrote to stderr:\n{stderr}"
    # Both trained together, to the same weights; the chief alone saved.
    assert "replicas=2" in results["chief"][1]
    weights = [re.findall(r"trainer: trained 1 epochs of \d+ steps; weights (\w+)", results[role][1]) for role in ("chief", "worker")]
    assert weights[0] and weights[0] == weights[1], weights
    assert "saved model to" in results["chief"][1] and "saved model to" not in results["worker"][1]
    assert (model / "saved_model.pb").exists()


def test_the_export_saves_no_optimizer_and_loads_back_as_a_saved_model(two_process_job):
    _, model = two_process_job
    script = ("import sys, tensorflow as tf; "
              "names = [n for n, _ in tf.train.list_variables(sys.argv[1] + '/variables/variables')]; "
              "assert not [n for n in names if 'optimizer' in n.lower() or 'iteration' in n.lower()], names; "
              "m = tf.saved_model.load(sys.argv[1]); "
              "print(tuple(m.signatures['serving_pixels'].structured_outputs['probabilities'].shape))")
    result = subprocess.run([sys.executable, "-c", script, str(model)], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "(None, 5)"


def test_a_healthy_launcher_run_shows_no_runtime_line(tmp_path, data_root):
    """trainer.launch relays every task's stdout and stderr as one stream, without the known-
    harmless lines: a healthy job shows none of TensorFlow's C++ lines and no Keras warning."""
    result = run_module("trainer.launch", "--replicas", "2", "--work-dir", str(tmp_path / "work"), "--", "python", "-m", "cassava.task",
                        *HEALTHY_RUN, "--data-dir", str(data_root), "--model-dir", str(tmp_path / "model"),
                        env=clean_env(**image_environment()))
    assert result.returncode == 0, result.stdout[-4000:]
    runtime_lines = [line for line in result.stdout.splitlines() if RUNTIME_LINE.match(line)]
    assert runtime_lines == []
    assert " tensorflow: " not in result.stdout and result.stderr == ""
    # The banner each task's libraries log at load is among the lines hidden, and counted.
    hidden = re.search(r"^\[launch\] hid (\d+) known-harmless TensorFlow lines", result.stdout, re.M)
    assert hidden and int(hidden.group(1)) >= 2, result.stdout[-3000:]


def test_a_bad_flag_is_one_line_on_stderr_through_the_relay():
    result = run_module("trainer.run", "--", "python", "-m", "cassava.task", "--epochs", "many",
                        env=clean_env(**image_environment()))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "python -m cassava.task: error: argument --epochs: expected a whole number, got 'many' (--help lists the flags)"]


def test_a_bad_data_stop_is_its_line_on_stderr_through_the_relay(tmp_path):
    from integration.test_bad_data import SMALL_RUN, write_dataset

    dataset = write_dataset(tmp_path / "data", bad=4)
    result = run_module("trainer.run", "--", "python", "-m", "cassava.task", "--dataset", dataset, *SMALL_RUN,
                        "--model-dir", str(tmp_path / "model"), "--max-bad-examples", "3", "--steps-per-epoch", "6",
                        env=clean_env(**image_environment()))
    assert result.returncode == 2, result.stderr[-3000:]
    assert_bad_data_stop_said(result.stderr)
