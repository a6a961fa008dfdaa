"""A healthy job writes nothing to stderr, which Cloud Logging reads as ERROR; a job that stops
still says why there. Run with the variables the images set (read from Dockerfile.cpu), so what
passes here is what the image does; tests/container/test_stderr.py runs the image itself."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, assert_bad_data_stop_said, clean_env, run_module

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
    wanted = {key: environment.get(key) for key in ("TF_CPP_MIN_LOG_LEVEL", "TRAINER_RELAY_STDERR")}
    assert None not in wanted.values(), wanted
    return wanted


def free_ports(count: int) -> list[int]:
    from trainer.launch import free_ports as ports

    return ports(count)


@pytest.fixture(scope="module")
def two_process_job(tmp_path_factory, data_root):
    """A MultiWorkerMirrored job of two cassava.task processes started as a platform starts them,
    each with its own stdout and stderr."""
    tmp_path = tmp_path_factory.mktemp("quiet")
    chief_port, worker_port = free_ports(2)
    cluster = {"chief": [f"localhost:{chief_port}"], "worker": [f"localhost:{worker_port}"]}
    processes = {}
    for role in ("chief", "worker"):
        scratch = tmp_path / role
        scratch.mkdir()
        env = clean_env(**image_environment(), TMPDIR=str(scratch),
                        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": 0}}))
        processes[role] = subprocess.Popen(
            [sys.executable, "-m", "cassava.task", *HEALTHY_RUN, "--data-dir", str(data_root),
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
    # Both trained together, and both went through the export (the save is a collective).
    assert "replicas=2" in results["chief"][1]
    assert "saved this worker's copy to " in results["worker"][1]
    assert (model / "saved_model.pb").exists()


def test_the_export_saves_no_optimizer_and_loads_back_as_keras(two_process_job):
    _, model = two_process_job
    script = ("import sys, trainer, tensorflow as tf; "
              "names = [n for n, _ in tf.train.list_variables(sys.argv[1] + '/variables/variables')]; "
              "assert not [n for n in names if 'optimizer' in n.lower()], names; "
              "m = tf.keras.models.load_model(sys.argv[1], compile=False); print(m.output_shape)")
    result = subprocess.run([sys.executable, "-c", script, str(model)], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "(None, 5)"


def test_a_healthy_launcher_run_shows_no_runtime_line(tmp_path, data_root):
    """trainer.launch relays every task's stdout and stderr as one stream, without the known-
    harmless lines: a healthy job shows none of TensorFlow's C++ lines and no Keras warning."""
    result = run_module("trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--", "python", "-m", "cassava.task",
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
    result = run_module("cassava.task", "--epochs", "many", env=clean_env(**image_environment()))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "python -m cassava.task: error: argument --epochs: expected a whole number, got 'many' (--help lists the flags)"]


def test_a_bad_data_stop_is_its_line_on_stderr_through_the_relay(tmp_path):
    from integration.test_bad_data import SMALL_RUN, write_dataset

    dataset = write_dataset(tmp_path / "data", bad=4)
    result = run_module("cassava.task", "--dataset", dataset, *SMALL_RUN, "--model-dir", str(tmp_path / "model"),
                        "--max-bad-examples", "3", "--steps-per-epoch", "6", env=clean_env(**image_environment()))
    assert result.returncode == 2, result.stderr[-3000:]
    assert_bad_data_stop_said(result.stderr)


# The relay itself, on a small child: what it keeps, what it drops, and how it ends.

RELAYED = """
import os, signal, sys, time
from trainer import relay
relay.relay_stderr()
"""


def relayed(body: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RELAYED + body], cwd=REPO, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def test_the_relay_drops_only_the_harmless_lines_and_keeps_a_last_line_without_newline():
    process = relayed(r"""
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
os.write(2, b"I0000 00:00:1.0 6 port.cc:153] oneDNN custom operations are on. You may see slightly different\n")
os.write(2, b"W0000 00:00:1.0 6 op_kernel.cc:1780] OP_REQUIRES failed: something real\n")
print("to stdout", flush=True)
os.write(2, b"the end, unterminated")
sys.exit(3)
""")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 3
    assert stdout == b"to stdout\n"
    assert stderr == b"W0000 00:00:1.0 6 op_kernel.cc:1780] OP_REQUIRES failed: something real\nthe end, unterminated"


def test_a_fatal_line_written_just_before_an_abort_is_not_lost():
    process = relayed(r"""
os.write(2, b"F0000 00:00:1.0 6 dataset.cc:12] Check failed: something\n")
os.abort()
""")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGABRT  # the parent dies of the child's signal
    assert stderr == b"F0000 00:00:1.0 6 dataset.cc:12] Check failed: something\n"


def test_sigterm_to_the_relay_reaches_the_job_which_exits_its_own_way():
    process = relayed(r"""
def on_term(signum, frame):
    print("job got SIGTERM", file=sys.stderr, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print(os.getpid(), flush=True)
while True:
    time.sleep(0.1)
""")
    job = int(process.stdout.readline())
    assert job != process.pid
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143
    assert stderr == b"job got SIGTERM\n"


def test_the_job_dies_with_a_relay_killed_by_sigkill():
    process = relayed(r"""
print(os.getpid(), flush=True)
while True:
    time.sleep(0.1)
""")
    job = int(process.stdout.readline())
    process.kill()
    process.wait(timeout=120)
    # A hang guard, not a measure: the kernel kills the job as its parent exits.
    deadline = time.monotonic() + 120
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(job)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_only_the_variable_the_images_set_turns_the_relay_on():
    # Elsewhere (and under trainer.launch) cassava.task runs as the one process it was started as.
    script = "import os; from trainer import relay; relay.relay_stderr_if_asked(os.environ); print(os.getpid())"
    for value, relays in (("1", True), ("0", False), ("", False)):
        process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=clean_env(TRAINER_RELAY_STDERR=value),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        assert (int(stdout) != process.pid) == relays, value
