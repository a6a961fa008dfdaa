"""trainer.run around real processes: a plain MultiWorkerMirrored script (tests/fixtures/autopackaging,
which knows nothing of this project) trained by two processes whose cluster is described as a
platform describes it; signals, crashes and exit codes; and trainer.process.stopping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, clean_env, run_module
from trainer.process import ports, stopping

SCRIPT = REPO / "tests" / "fixtures" / "autopackaging" / "task.py"
REDUCER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
# What the images set (Dockerfile.cpu). No TF_USE_LEGACY_KERAS: the script is Keras 3 with its own
# loop, as a user writes one that trains across workers.
IMAGE_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1"}


def runner(*command: str, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer.run", "--", *command], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_vertex_cluster_spec_with_reducers_trains_the_plain_script_on_two_replicas(tmp_path):
    """Vertex gives a two-replica job CLUSTER_SPEC (workerpool0/1) and, in pool 2, Reduction Server
    reducers that run no TensorFlow: the runner makes a TF_CONFIG without them, or the strategy would
    wait for them forever."""
    chief_port, worker_port, reducer_port = ports.free_ports(3, "localhost")
    job = {"workerPoolSpecs": [{}, {}, {"containerSpec": {"imageUri": REDUCER_IMAGE}}]}
    cluster = {"workerpool0": [f"localhost:{chief_port}"], "workerpool1": [f"localhost:{worker_port}"],
               "workerpool2": [f"localhost:{reducer_port}"]}
    model_dir = tmp_path / "model"
    processes = {}
    for pool in ("workerpool0", "workerpool1"):
        spec = {"cluster": cluster, "task": {"type": pool, "index": 0}, "job": job}
        env = clean_env(**IMAGE_ENV, CLUSTER_SPEC=json.dumps(spec), AIP_MODEL_DIR=str(model_dir),
                        TMPDIR=str(tmp_path))
        processes[pool] = runner(sys.executable, str(SCRIPT), env=env)
    results = {pool: process.communicate(timeout=600) for pool, process in processes.items()}
    for pool, (out, err) in results.items():
        assert processes[pool].returncode == 0, (pool, out[-2000:], err[-3000:])
        assert "num_replicas_in_sync 2" in out.splitlines(), (pool, out[-2000:])
    assert "saved to AIP_MODEL_DIR" in results["workerpool0"][0]
    assert "saved to a temporary directory" in results["workerpool1"][0]
    assert (model_dir / "saved_model.pb").exists()


def test_trainer_launch_runs_the_plain_script_through_the_runner_on_every_task(tmp_path):
    """`trainer.launch -- COMMAND`: each task's TF_CONFIG from the launcher, the runner inside."""
    model_dir = tmp_path / "model"
    result = run_module("trainer.launch", "--replicas", "2", "--work-dir", str(tmp_path / "work"), "--timeout", "500",
                        "--", sys.executable, "-m", "trainer.run", "--", sys.executable, str(SCRIPT),
                        env=clean_env(**IMAGE_ENV, AIP_MODEL_DIR=str(model_dir)), timeout=560)
    assert result.returncode == 0, result.stdout[-4000:]
    for task in ("chief-0", "worker-0"):
        assert f"[{task}] num_replicas_in_sync 2" in result.stdout.splitlines(), result.stdout[-4000:]
    assert (model_dir / "saved_model.pb").exists()


ONE_FILE_SCRIPT = """
import sys
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
path = sys.argv[1] + "/only-00000.tfrecord"
with tf.io.TFRecordWriter(path) as writer:
    for index in range(64):
        writer.write(str(index).encode())
dataset = tf.data.Dataset.list_files(path, shuffle=False).interleave(tf.data.TFRecordDataset).batch(8)
if sys.argv[2] == "DATA":
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
print("batches", sum(1 for _ in strategy.experimental_distribute_dataset(dataset)), flush=True)
"""


def test_a_dataset_of_fewer_files_than_workers_fails_with_one_line_of_the_runtimes_saying_what_to_change(tmp_path):
    """tf.distribute's default sharding (AUTO) shards files by file and fails at the first batch with
    fewer files than workers (Keras' fit goes the same way); the setting the runtime's line names
    makes the same job run."""
    script = tmp_path / "one_file.py"
    script.write_text(ONE_FILE_SCRIPT)
    outputs = {}
    for policy in ("AUTO", "DATA"):
        (tmp_path / policy).mkdir()
        outputs[policy] = run_module("trainer.launch", "--replicas", "2", "--work-dir", str(tmp_path / "work"), "--timeout",
                                     "300", "--", "python", "-m", "trainer.run", "--", "python", str(script),
                                     str(tmp_path / policy), policy, env=clean_env(TF_CPP_MIN_LOG_LEVEL="1"), timeout=400)
    failed, ran = outputs["AUTO"], outputs["DATA"]
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "Could not apply FILE based sharding" in failed.stdout
    said = [line for line in failed.stdout.splitlines() if "trainer.run: the command failed:" in line]
    assert said == ["[chief-0] trainer.run: the command failed: the dataset has fewer files than the job has workers, so "
                    "TensorFlow could not give each worker files of its own: shard by record "
                    "(options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA, "
                    "then dataset.with_options(options)), or write at least as many files as workers"], failed.stdout[-3000:]
    assert ran.returncode == 0 and "[chief-0] batches 8" in ran.stdout.splitlines(), ran.stdout[-3000:]


PROGRESS_SCRIPT = """
import json, os
task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
print("Epoch 1/1", flush=True)
print("\\r1/4 [======>.......................] - ETA: 0s - loss: 1.3093\\b\\b\\r4/4 [==============================] - 0s", flush=True)
print(f"{task} done", flush=True)
"""


def test_the_launcher_shows_the_chiefs_progress_lines_and_counts_the_workers(tmp_path):
    """A MultiWorkerMirrored worker's Keras progress lines repeat the chief's: the launcher leaves
    them out, says how many, and keeps every other line of the worker's."""
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS_SCRIPT)
    result = run_module("trainer.launch", "--replicas", "3", "--", "python", str(script), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    assert "[chief-0] Epoch 1/1" in lines and not [line for line in lines if line.startswith("[worker-") and "Epoch" in line]
    assert "[worker-0] worker done" in lines and "[worker-1] worker done" in lines
    # Universal newlines split a bar at its carriage returns: Epoch and two bars a worker, 6 in all.
    assert ("[launch] hid 6 progress lines of the workers, which repeat the chief's (--all-logs shows them)" in lines), lines
    shown = run_module("trainer.launch", "--replicas", "2", "--all-logs", "--", "python", str(script), timeout=120)
    assert "[worker-0] Epoch 1/1" in shown.stdout.splitlines()


def test_a_jobset_pod_gets_a_tf_config_and_the_output_directories():
    """One JobSet pod's view (two pods of a JobSet need two hosts: every pod listens on one port)."""
    env = clean_env(JOBSET_NAME="mine", JOBSET_REPLICATED_JOB="worker", JOBSET_JOB_INDEX="0",
                    JOBSET_PODS="chief=1,worker=1", JOB_COMPLETION_INDEX="0", HOSTNAME="mine-worker-0-0")
    process = runner("python", "-c", "import os; print(os.environ['TF_CONFIG']); print(os.environ['AIP_MODEL_DIR'])",
                     env=env)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    tf_config, model_dir = out.splitlines()
    assert json.loads(tf_config) == {"cluster": {"chief": ["mine-chief-0-0.mine:2222"], "worker": ["mine-worker-0-0.mine:2222"]},
                                     "task": {"type": "worker", "index": 0}}
    assert model_dir == "output/model"


WAITS_FOR_SIGTERM = """
import signal, sys, time
def stopped(signum, frame):
    print("child got SIGTERM", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, stopped)
print("ready", flush=True)
time.sleep(600)
"""


def test_sigterm_reaches_the_command_and_the_runner_exits_143():
    process = runner("python", "-c", WAITS_FOR_SIGTERM, env=clean_env())
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert out == "child got SIGTERM\n"
    assert process.returncode == 143, err  # the script exited 1 after the stop: still a stop


def test_a_plain_scripts_chief_that_loses_its_worker_exits_143_with_one_line(tmp_path):
    """Two MultiWorkerMirrored tasks of a plain script, each under trainer.run as in its own pod:
    the worker is killed between two collectives (tests/fixtures/ending/lost_peer.py), and the
    chief's next one fails uncaught. Python would exit 1, which TFJob's restartPolicy ExitCode
    takes for a bug and fails the job on; the exit hook makes it 143, after the traceback, with
    one line naming the worker (trainer.process.peer_loss)."""
    chief_port, worker_port = ports.free_ports(2)
    cluster = {"chief": [f"localhost:{chief_port}"], "worker": [f"localhost:{worker_port}"]}
    script = str(REPO / "tests" / "fixtures" / "ending" / "lost_peer.py")
    tasks = {role: subprocess.Popen(
        [sys.executable, "-m", "trainer.run", "--", "python", script], cwd=REPO, text=True,
        env=clean_env(SHARED=str(tmp_path), TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": 0}})),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for role in ("chief", "worker")}
    output = {role: process.communicate(timeout=240)[0] for role, process in tasks.items()}
    assert tasks["worker"].returncode == 137, output["worker"][-2000:]
    chief = output["chief"]
    assert "chief summed 2\n" in chief and "chief summed again" not in chief, chief[-3000:]
    assert tasks["chief"].returncode == 143, chief[-3000:]
    last = chief.strip().splitlines()[-1]
    assert last.startswith("trainer.run: lost worker-0 of this multi-worker job (UnavailableError: "), chief[-3000:]
    assert last.endswith("; exit 143, retryable") and "Traceback" in chief


def test_sigterm_reaches_every_process_of_a_shell_line():
    """The signal goes to the command's process group: a shell that waits does not forward it."""
    line = "python -c 'import time; print(\"ready\", flush=True); time.sleep(600)' & wait"
    process = runner("bash", "-c", line, env=clean_env())
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 143


def test_killing_the_runner_kills_the_command(tmp_path):
    process = runner("python", "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)", env=clean_env())
    child = int(process.stdout.readline())
    process.kill()
    process.wait()
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}") or _state(child) == "Z", "the command outlived its runner"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_a_crash_arrives_whole_on_stderr_with_the_commands_exit_code():
    deep = "def f(n):\n    return f(n - 1) if n else 1 / 0\nprint('progress', flush=True)\nf(40)\n"
    process = runner("python", "-c", deep, env=clean_env())
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert out == "progress\n"
    direct = subprocess.run([sys.executable, "-c", deep], capture_output=True, text=True, timeout=60)
    assert err == direct.stderr  # line for line what the script printed, in order
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ZeroDivisionError: division by zero", err


def test_a_fatal_line_written_just_before_an_abort_is_not_lost():
    process = runner("python", "-c", "import os; os.write(2, b'F0000 00:00:1.0 6 dataset.cc:12] Check failed: x\\n'); os.abort()",
                     env=clean_env())
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGABRT
    assert err == "F0000 00:00:1.0 6 dataset.cc:12] Check failed: x\n"


def test_an_exit_0_that_left_the_model_directory_empty_is_one_warning_from_the_saving_task_only(tmp_path):
    model_dir = tmp_path / "model"
    process = runner("python", "-c", "print('trained, saved nothing')", env=clean_env(AIP_MODEL_DIR=str(model_dir)))
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out == "trained, saved nothing\n"
    assert err == (f"trainer.run: warning: the command exited 0 and left the model directory empty "
                   f"(AIP_MODEL_DIR={model_dir}); save the trained model there: Vertex AI makes a Model from that "
                   "directory only\n")
    saves = runner("python", "-c", "import os; open(os.environ['AIP_MODEL_DIR'] + '/saved_model.pb', 'w').close()",
                   env=clean_env(AIP_MODEL_DIR=str(tmp_path)))
    assert saves.communicate(timeout=60) == ("", "") and saves.returncode == 0
    worker = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}, "task": {"type": "worker", "index": 0}}
    not_saving = runner("true", env=clean_env(AIP_MODEL_DIR=str(model_dir), TF_CONFIG=json.dumps(worker)))
    assert not_saving.communicate(timeout=60) == ("", "") and not_saving.returncode == 0


def test_python_is_the_runners_own_interpreter_with_the_virtualenv_not_activated(tmp_path):
    """The virtualenv's python called by its path, with a PATH that holds no python of the
    virtualenv: `python` in the command is still that interpreter, with TensorFlow."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AIP_MODEL_DIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "1"}
    (tmp_path / "saved_model.pb").write_bytes(b"")
    result = subprocess.run([sys.executable, "-m", "trainer.run", "--", "python", "-c",
                             "import sys, tensorflow; print(sys.executable)"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sys.executable in result.stdout.splitlines(), result.stdout


def test_the_last_line_without_a_newline_and_a_signal_death_are_kept():
    process = runner("bash", "-c", "printf 'dying now' >&2; kill -SEGV $$", env=clean_env())
    _, err = process.communicate(timeout=60)
    assert process.returncode == 139 and err == "dying now\n"


def test_info_lines_of_stderr_go_to_stdout_and_harmless_ones_are_dropped():
    script = ("import sys; "
              "print('I1125 12:00:00.123456 1 a.cc:1] loading', file=sys.stderr); "
              "print('I0000 00:00:1.0 1 port.cc:1] oneDNN custom operations are on. Off with TF_ENABLE_ONEDNN_OPTS=0.', file=sys.stderr); "
              "print('WARNING:tensorflow:careful', file=sys.stderr)")
    process = runner("python", "-c", script, env=clean_env())
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0
    assert out == "I1125 12:00:00.123456 1 a.cc:1] loading\n"
    assert err == "WARNING:tensorflow:careful\n"


def test_json_entries_in_a_kubernetes_pod():
    process = runner("python", "-c", "import sys; print('WARNING:x:y', file=sys.stderr)",
                     env=clean_env(KUBERNETES_SERVICE_HOST="10.0.0.1"))
    _, err = process.communicate(timeout=60)
    assert json.loads(err) == {"severity": "WARNING", "message": "WARNING:x:y"}


@pytest.mark.parametrize("mode, code, message", [
    (None, 127, "trainer.run: {path}: command not found"),
    (0o644, 126, "trainer.run: {path}: cannot execute: Permission denied"),
    (0o755, 126, "trainer.run: {path}: cannot execute: Exec format error"),  # no #! line
])
def test_a_command_that_cannot_start_is_one_line(tmp_path, mode, code, message):
    path = tmp_path / "notes.txt"
    if mode is not None:
        path.write_text("not a program\n")
        path.chmod(mode)
    process = runner(str(path), env=clean_env())
    message = message.format(path=path)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, err, out) == (code, message + "\n", "")


def test_an_unusable_cluster_is_one_line_and_exit_2():
    process = runner("true", env=clean_env(TF_CONFIG='{"cluster": {"worker": ["w:1"]}, "task": {"type": "boss"}}'))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and err.count("\n") == 1 and err.startswith("trainer.run: error: TF_CONFIG: ")


def test_stopping_gives_a_grace_period_then_kills():
    obeys = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ignores = subprocess.Popen([sys.executable, "-c",
                                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                                "time.sleep(600)"], stdout=subprocess.PIPE)
    ignores.stdout.readline()  # its handler is in place
    stopping.stop([obeys, ignores], grace=2)
    assert obeys.returncode == -signal.SIGTERM and ignores.returncode == -signal.SIGKILL
