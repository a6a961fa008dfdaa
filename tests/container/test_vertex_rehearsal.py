"""`submit_job.py local`: CustomJobs and tuning jobs run on this machine as Vertex AI runs them,
one container of the real CPU image per replica, with gs:// served by the local Cloud Storage server.

Each test runs the command as a user would, in an environment without the engine's settings (the
runner finds them itself, as every project script does), and reads what it prints: replica,
severity, line.
"""

from __future__ import annotations

import http.server
import json
import re
import signal
import socket
import subprocess
import threading

import pytest

from containers import SMALL_TRAINING, leftovers, user_env
from helpers import REPO, backups_reported, resumed_at, run_module, run_processes, write_image_folder
from quiet_end import errors_after_training

PYTHON = str(REPO / ".venv" / "bin" / "python")
# Each replica makes its own synthetic data on its own disk, as it would on its own VM.
TRAINING = [*SMALL_TRAINING, "--data-dir", "/tmp/data"]


def dry_run(*args: str, image: str) -> dict:
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", *args[:args.index("--")], "--dry-run",
                             "--image-uri", image, *args[args.index("--"):]],
                            cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def run_local(engine, tmp_path, spec: dict | None, *args: str, timeout: float = 900, env=None) -> subprocess.CompletedProcess:
    tool, _ = engine
    command = [PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool]
    if spec is not None:
        (tmp_path / "job.json").write_text(json.dumps(spec))
        command += ["--spec", str(tmp_path / "job.json")]
    result = subprocess.run([*command, *args], cwd=REPO, env=env or user_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert not result.stderr.strip() or result.returncode, result.stderr[-2000:]
    return result


def lines(output: str, source: str, severity: str | None = None) -> list[str]:
    """The text of `source`'s lines (a replica, or local-run), optionally of one severity."""
    found = []
    for line in output.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] == source and (severity is None or parts[1] == severity):
            found.append(parts[2] if len(parts) == 3 else "")
    return found


def summary(output: str) -> dict[str, tuple[list[int], int]]:
    """replica -> (its exit codes, its restarts), from the run's closing lines."""
    rows = re.findall(r"^local-run\s+NOTICE\s+(?:trial \d+: )?(workerpool\d-\d+): exit codes ([\d,-]+); restarts (\d+)$",
                      output, re.M)
    return {name: ([int(c) for c in codes.split(",") if c != "-"], int(restarts)) for name, codes, restarts in rows}


def test_mwms_job_from_a_dry_run_spec_reads_from_gcs_files_and_writes_to_the_bucket(engine, cpu_image, tmp_path):
    """Chief + 2 workers as `vertex --dry-run` prints them. The data is staged into a bucket and
    read through /gcs/ (Cloud Storage FUSE on Vertex); the outputs go to gs:// through AIP_*."""
    prepared = tmp_path / "prepared"
    made = run_module("cassava.prepare", "--source", f"folder:{write_image_folder(tmp_path / 'images')}",
                      "--output", str(prepared), "--shards", "6")
    assert made.returncode == 0, made.stderr[-2000:]
    spec = dry_run("vertex", "--workers", "2", "--base-output-dir", "gs://vx-mwms/job", "--",
                   *SMALL_TRAINING, "--dataset", "tfrecord:/gcs/vx-mwms/data/train-*.tfrecord", "--epochs", "2", image=cpu_image)
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"),
                       "--stage", f"{prepared}=gs://vx-mwms/data")
    assert result.returncode == 0, result.stdout[-4000:]
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    assert "data: train_examples=40 sharding=FILE" in chief, chief[-3000:]  # 6 files from /gcs/, 3 workers
    kept = tmp_path / "kept" / "vx-mwms" / "job"
    assert (kept / "model" / "saved_model.pb").exists()
    assert (kept / "checkpoints" / "epoch-2.index").exists()
    assert [p.name for p in (kept / "logs" / "train").iterdir() if p.name.startswith("events.out.tfevents.")]
    # Each replica was told its Vertex role, and the output directories under the base.
    assert any(line.endswith("role: worker-1, strategy: multi_worker_mirrored, model dir: gs://vx-mwms/job/model/")
               for line in lines(result.stdout, "workerpool1-1", "INFO")), result.stdout[-4000:]
    assert "replicas=3" in chief
    # A Keras 3 Task, trained by the runtime's loop on three workers that end with the same weights.
    run = json.loads((kept / "model" / "run.json").read_text())
    assert (run["versions"]["keras"], run["strategy"], run["replicas_in_sync"]) == ("3.15.1", "multi_worker_mirrored", 3), run
    weights = {replica: re.findall(r"trainer: trained 2 epochs of \d+ steps; weights ([0-9a-f]+) ", "\n".join(lines(result.stdout, replica)))
               for replica in ("workerpool0-0", "workerpool1-0", "workerpool1-1")}
    assert len(set(map(tuple, weights.values()))) == 1 and len(weights["workerpool0-0"]) == 1, weights
    # Progress is INFO (stdout); nothing the trainer logs as progress reads as an error.
    assert any("trainer: epoch 2/2 ends: accuracy=" in line for line in lines(result.stdout, "workerpool0-0", "INFO"))
    errors = [line for r in ("workerpool0-0", "workerpool1-0", "workerpool1-1")
              for line in lines(result.stdout, r, "ERROR")]
    assert not [line for line in errors if "trainer: epoch" in line or "trainer: role" in line], errors
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]  # a quiet end (trainer.library.ending)
    assert summary(result.stdout)["workerpool0-0"] == ([0], 0)
    assert set(summary(result.stdout)) == {"workerpool0-0", "workerpool1-0", "workerpool1-1"}
    assert lines(result.stdout, "local-run", "INFO")[-1].startswith("JOB_STATE_SUCCEEDED")
    assert sum("not emulated" in line for line in lines(result.stdout, "local-run")) == 1
    assert leftovers(engine) == []


def test_parameter_server_job_with_an_evaluator(engine, cpu_image, tmp_path):
    spec = dry_run("vertex", "--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator",
                   "--base-output-dir", "gs://vx-pss/job", "--", *TRAINING, "--epochs", "2", image=cpu_image)
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"))
    assert result.returncode == 0, result.stdout[-4000:]
    rows = summary(result.stdout)
    assert set(rows) == {"workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0", "workerpool3-0"}
    assert rows["workerpool0-0"] == ([0], 0)
    kept = tmp_path / "kept" / "vx-pss" / "job"
    assert (kept / "model" / "saved_model.pb").exists() and (kept / "checkpoints" / "epoch-2.index").exists()
    assert any("role: evaluator" in line for line in lines(result.stdout, "workerpool3-0", "INFO")), result.stdout[-4000:]
    assert any("role: ps-0" in line for line in lines(result.stdout, "workerpool2-0", "INFO"))
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]
    assert leftovers(engine) == []


def test_a_preempted_worker_restarts_the_job_which_resumes_from_its_backup(engine, cpu_image, tmp_path):
    spec = dry_run("vertex", "--workers", "1", "--base-output-dir", "gs://vx-spot/job", "--",
                   *TRAINING, "--epochs", "3", "--steps-per-epoch", "6", image=cpu_image)
    assert spec["jobSpec"]["scheduling"]["restartJobOnWorkerRestart"] is True
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"),
                       "--preempt", "workerpool1-0@/epoch 2/3 begins/")
    assert result.returncode == 0, result.stdout[-5000:]
    notes = lines(result.stdout, "local-run")
    assert any(n.startswith("preempting (Spot VM) workerpool1-0: SIGTERM now") for n in notes), notes
    assert "workerpool1-0 was preempted (STOCKOUT): restarting the whole job on new machines (Spot restart 1 of 6)" in notes
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    # The job came back at the step of the last backup saved before the preemption.
    before, after = chief.split("resumed from backup", 1)
    assert backups_reported(before, task=None), before[-3000:]
    assert resumed_at(chief, task=None) == backups_reported(before, task=None)[-1]
    assert resumed_at(chief, task=None)[0] >= 2
    assert "another job" not in chief  # the restart found its own state (trainer.runtime.ownership)
    assert "epoch 3/3 ends" in after
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]
    assert (tmp_path / "kept" / "vx-spot" / "job" / "model" / "saved_model.pb").exists()
    rows = summary(result.stdout)
    assert rows["workerpool1-0"][1] == 1 and rows["workerpool0-0"][1] == 1, rows
    assert rows["workerpool0-0"][0][-1] == 0
    assert leftovers(engine) == []


HANDWRITTEN_POOL = {"machineSpec": {"machineType": "e2-standard-4"}, "replicaCount": 1}
# A replica that only waits to be stopped, and stops on SIGTERM as a trainer does. (A plain `sleep`
# as a container's first process ignores SIGTERM, so each stop waited out the 10 s grace.)
WAITS = ["sh", "-c", "trap 'exit 143' TERM; sleep 600 & wait"]


def test_a_configuration_error_fails_the_job_at_once_with_its_one_line(engine, cpu_image, tmp_path):
    """A non-zero exit is a "User code exception", a permanent error: Vertex shuts the job down."""
    spec = {"displayName": "bad-flag", "jobSpec": {"workerPoolSpecs": [
        {**HANDWRITTEN_POOL, "containerSpec": {"imageUri": cpu_image, "args": [*TRAINING, "--epochs", "0"]}},
        {**HANDWRITTEN_POOL, "containerSpec": {"imageUri": cpu_image, "command": WAITS}}]}}
    result = run_local(engine, tmp_path, spec)
    assert result.returncode == 2, result.stdout[-3000:]
    error = "python -m cassava.task: error: argument --epochs: must be positive, got 0 (--help lists the flags)"
    assert summary(result.stdout)["workerpool0-0"] == ([2], 0)
    assert summary(result.stdout)["workerpool1-0"][1] == 0  # stopped, not restarted
    assert lines(result.stdout, "workerpool0-0") == [error]
    assert lines(result.stdout, "local-run", "ERROR")[-1] == (
        f"JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 2. Last error: {error}")
    assert not [n for n in lines(result.stdout, "local-run") if "restarting" in n]
    assert leftovers(engine) == []


def test_a_crash_that_could_be_transient_restarts_the_whole_job(engine, base_image, tmp_path):
    """SIGSEGV (exit 139) is one of the "exit codes that could be transient": the job is retried."""
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": base_image, "command": ["sh", "-c", "echo crashing >&2; sh -c 'kill -SEGV $$'; exit $?"]}}]}}
    result = run_local(engine, tmp_path, spec, "--job-retries", "2")
    assert result.returncode == 139, result.stdout[-3000:]
    assert summary(result.stdout) == {"workerpool0-0": ([139] * 3, 2)}
    notes = lines(result.stdout, "local-run", "WARNING")
    assert [n.rsplit("(", 1)[1] for n in notes if "restarting the whole job" in n] == ["retry 1 of 2)", "retry 2 of 2)"]
    # The last stderr line is the shell's own report of the signal ("Segmentation fault").
    failure = lines(result.stdout, "local-run", "ERROR")[-1]
    assert failure.startswith("JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 139. Last error: "), failure
    assert failure.endswith("(possibly transient); the job was already restarted 2 times"), failure
    assert leftovers(engine) == []


def sh_job(image: str, chief: str, worker: str, **scheduling) -> dict:
    job = {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {"imageUri": image, "command": ["sh", "-c", chief]}},
                               {**HANDWRITTEN_POOL, "containerSpec": {"imageUri": image, "command": ["sh", "-c", worker]}}]}
    return {"jobSpec": {**job, **({"scheduling": scheduling} if scheduling else {})}}


# Each run of a replica says which machine (container) it is on: the disk it finds is new or kept.
ANNOUNCE = "test -e /tmp/been-here && echo same disk || echo new disk; touch /tmp/been-here; echo host $(hostname); "


@pytest.mark.parametrize("restart_all", [False, True])
def test_maintenance_brings_a_replica_back_on_another_machine_under_its_name(engine, base_image, tmp_path, restart_all):
    # (A shell that is a container's first process ignores SIGTERM unless it traps it.)
    spec = sh_job(base_image, ANNOUNCE + "trap 'exit 143' TERM; sleep 12 & wait",
                  ANNOUNCE + "echo ready; trap 'exit 143' TERM; sleep 600 & wait",
                  **({"restartJobOnWorkerRestart": True} if restart_all else {}))
    result = run_local(engine, tmp_path, spec, "--maintenance", "workerpool1-0@/ready/")
    assert result.returncode == 0, result.stdout[-3000:]
    worker = lines(result.stdout, "workerpool1-0", "INFO")
    assert worker[:2] == ["new disk", "host workerpool1-0"] and worker[3:5] == ["new disk", "host workerpool1-0"], worker
    chief = lines(result.stdout, "workerpool0-0", "INFO")
    notes = lines(result.stdout, "local-run", "WARNING")
    if restart_all:  # every replica restarts with it; the chief keeps its machine
        assert "workerpool1-0 restarted on another machine: restarting every replica (restartJobOnWorkerRestart)" in notes
        assert chief == ["new disk", "host workerpool0-0", "same disk", "host workerpool0-0"], chief
    else:  # only the worker: the chief runs on
        assert "workerpool1-0 restarted on another machine" in notes
        assert chief == ["new disk", "host workerpool0-0"], chief
    assert lines(result.stdout, "local-run", "INFO")[-1].startswith("JOB_STATE_SUCCEEDED")
    assert leftovers(engine) == []


def test_a_worker_that_finishes_first_stays_finished(engine, base_image, tmp_path):
    spec = sh_job(base_image, "sleep 8; echo chief done", "echo worker done")
    result = run_local(engine, tmp_path, spec)
    assert result.returncode == 0, result.stdout[-3000:]
    assert summary(result.stdout) == {"workerpool0-0": ([0], 0), "workerpool1-0": ([0], 0)}


@pytest.mark.parametrize("pool", [0, 1])
def test_an_image_the_engine_cannot_find_ends_the_job_at_once_with_one_line(engine, cpu_image, tmp_path, pool):
    missing = "localhost/cassava-no-such-image:missing"
    pools = [{**HANDWRITTEN_POOL, "containerSpec": {"imageUri": cpu_image, "command": WAITS}},
             {**HANDWRITTEN_POOL, "containerSpec": {"imageUri": cpu_image, "command": WAITS}}]
    pools[pool]["containerSpec"]["imageUri"] = missing
    result = run_local(engine, tmp_path, {"jobSpec": {"workerPoolSpecs": pools}})
    assert result.returncode == 125, result.stdout[-3000:]
    [failed] = lines(result.stdout, "local-run", "ERROR")
    assert failed.startswith(f"JOB_STATE_FAILED: workerpool{pool}-0: the engine could not run {missing}: "), failed
    assert len(failed) > len(f"JOB_STATE_FAILED: workerpool{pool}-0: the engine could not run {missing}: ") + 10  # its message
    assert not [n for n in lines(result.stdout, "local-run") if "restarting" in n]
    assert leftovers(engine) == []


def test_a_command_that_cannot_start_is_an_engine_error_not_the_replicas(engine, cpu_image, tmp_path):
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": ["no-such-command-in-the-image"]}}]}}
    result = run_local(engine, tmp_path, spec)
    assert result.returncode == 125, result.stdout[-3000:]
    [failed] = lines(result.stdout, "local-run", "ERROR")
    assert failed.startswith(f"JOB_STATE_FAILED: workerpool0-0: the engine could not run {cpu_image}: ") and \
        "no-such-command-in-the-image" in failed, failed
    assert lines(result.stdout, "workerpool0-0") == []  # the engine's complaint is not shown as the replica's
    assert summary(result.stdout)["workerpool0-0"][1] == 0
    assert leftovers(engine) == []


def test_two_tuning_trials_are_ranked_by_their_reported_metric(engine, cpu_image, tmp_path):
    result = run_local(engine, tmp_path, None, "--seed", "3", "--keep", str(tmp_path / "kept"),
                       "hptune", "--image-uri", cpu_image, "--workers", "1", "--max-trials", "2",
                       "--parallel-trials", "2", "--batch-sizes", "4,8", "--learning-rate-range", "1e-4,1e-1",
                       "--base-output-dir", "gs://vx-tune/study", "--", *TRAINING, "--epochs", "2")
    assert result.returncode == 0, result.stdout[-5000:]
    ranked = re.findall(r"^local-run\s+NOTICE\s+(\d)\. trial (\d): accuracy=(\S+) learning-rate=(\S+) "
                        r"per-replica-batch-size=(\d+) JOB_STATE_SUCCEEDED$", result.stdout, re.M)
    assert [r[0] for r in ranked] == ["1", "2"] and {r[1] for r in ranked} == {"1", "2"}, result.stdout[-3000:]
    values = [float(r[2]) for r in ranked]
    assert values == sorted(values, reverse=True)
    for _, trial, value, rate, batch in ranked:
        # Each trial's chief got its values as Vertex passes them, and its outputs under BASE/TRIAL/.
        chief = "\n".join(lines(result.stdout, f"trial-{trial}/workerpool0-0"))
        assert f"({batch} per replica)" in chief and f"model dir: gs://vx-tune/study/{trial}/model/" in chief
        last_epoch = re.findall(r"epoch 2/2 ends: .*val_accuracy=(\S+) ", chief)
        assert last_epoch and abs(float(last_epoch[-1]) - float(value)) < 1e-4
        assert (tmp_path / "kept" / "vx-tune" / "study" / trial / "model" / "saved_model.pb").exists()
        assert 1e-4 <= float(rate) <= 1e-1
    assert leftovers(engine) == []


def test_a_handwritten_custom_job_runs_unchanged_with_vertex_environment(engine, cpu_image, tmp_path):
    """Not made by submit_job.py: integer replicaCount, a command that replaces the entrypoint,
    env of its own, no restartJobOnWorkerRestart. The command prints what Vertex told it."""
    show = ["sh", "-c", "env | grep -E '^(CLUSTER_SPEC|TF_CONFIG|AIP_|CLOUD_ML_|OWN_SETTING)' | sort; "
                        "python -m cassava.task \"$@\" && cd /gcs/vx-own/run && find . -type f | sort", "trainer"]
    container = {"imageUri": cpu_image, "command": show, "args": [*TRAINING, "--epochs", "1"],
                 "env": [{"name": "OWN_SETTING", "value": "kept"}]}
    spec = {"displayName": "by-hand", "jobSpec": {
        "workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": container},
                            {**HANDWRITTEN_POOL, "containerSpec": container}],
        "baseOutputDirectory": {"outputUriPrefix": "gs://vx-own/run"}}}
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"))
    assert result.returncode == 0, result.stdout[-4000:]
    told = dict(line.split("=", 1) for line in lines(result.stdout, "workerpool1-0", "INFO") if "=" in line
                and line.split("=", 1)[0].isupper())
    cluster = json.loads(told["CLUSTER_SPEC"])
    assert cluster["cluster"] == {"workerpool0": ["workerpool0-0:2222"], "workerpool1": ["workerpool1-0:2222"]}
    assert cluster["task"] == {"type": "workerpool1", "index": 0} and cluster["job"] == spec["jobSpec"]  # a dict, as the Distributed training page shows it
    assert json.loads(told["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert (told["AIP_MODEL_DIR"], told["AIP_CHECKPOINT_DIR"], told["AIP_TENSORBOARD_LOG_DIR"]) == (
        "gs://vx-own/run/model/", "gs://vx-own/run/checkpoints/", "gs://vx-own/run/logs/")
    assert told["CLOUD_ML_JOB_ID"].isdigit() and told["CLOUD_ML_PROJECT_ID"].isdigit() and told["OWN_SETTING"] == "kept" and "CLOUD_ML_TRIAL_ID" not in told
    assert (tmp_path / "kept" / "vx-own" / "run" / "model" / "saved_model.pb").exists()
    # What the trainer wrote to gs:// is there under /gcs/, as the chief lists it after training.
    under_gcs = [line for line in lines(result.stdout, "workerpool0-0", "INFO") if line.startswith("./")]
    assert {"./model/saved_model.pb", "./checkpoints/epoch-1.index"} <= set(under_gcs), under_gcs
    assert any(line.startswith("./logs/train/events.out.tfevents.") for line in under_gcs), under_gcs
    kept = {"./" + p.relative_to(tmp_path / "kept" / "vx-own" / "run").as_posix()
            for p in (tmp_path / "kept" / "vx-own" / "run").rglob("*") if p.is_file()}
    assert set(under_gcs) == kept
    assert leftovers(engine) == []


def interrupted_run(engine, tmp_path, spec: dict, when: str, count: int = 1) -> str:
    """Runs the spec and sends Ctrl-C once `count` lines containing `when` have shown; returns the rest."""
    tool, _ = engine
    (tmp_path / "job.json").write_text(json.dumps(spec))
    runner = subprocess.Popen([PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool, "--spec",
                               str(tmp_path / "job.json")], cwd=REPO, env=user_env(), stdout=subprocess.PIPE, text=True)
    try:
        seen = 0
        for line in runner.stdout:
            seen += when in line
            if seen == count:
                runner.send_signal(signal.SIGINT)
                break
        rest = runner.stdout.read()
        # Replicas get their grace (10 s) to stop; nothing waits for them to finish their work.
        assert runner.wait(timeout=120) == 130, rest[-3000:]
    finally:
        if runner.poll() is None:
            runner.kill()
    return rest


def fake_gcs_servers() -> set[str]:
    """Those outside this test run: a runner's server that outlived it belongs to init; the servers of
    the run's other workers (helpers.run_processes) come and go beside this test."""
    ours = {str(pid) for pid in run_processes()}
    return set(subprocess.run(["pgrep", "-f", "fake-gcs-server"], capture_output=True, text=True).stdout.split()) - ours


def test_ctrl_c_removes_every_container_network_and_server(engine, cpu_image, tmp_path):
    servers_before = fake_gcs_servers()
    spec = dry_run("vertex", "--workers", "1", "--base-output-dir", "gs://vx-stop/job", "--",
                   *TRAINING, "--epochs", "50", image=cpu_image)
    rest = interrupted_run(engine, tmp_path, spec, "trainer: epoch 1/50 begins")
    assert "interrupted: stopping and removing the job's containers and networks" in rest
    assert leftovers(engine) == []
    assert fake_gcs_servers() <= servers_before  # the runner's own server is gone


def test_ctrl_c_during_tuning_stops_the_running_trials_instead_of_waiting_for_them(engine, base_image, tmp_path):
    busy = "echo started; trap 'exit 143' TERM; sleep 900 & wait"
    spec = {"displayName": "study", "maxTrialCount": 4, "parallelTrialCount": 2,
            "studySpec": {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}], "parameters": [
                {"parameterId": "learning-rate", "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}}]},
            "trialJobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
                "imageUri": base_image, "command": ["sh", "-c", busy]}}]}}
    rest = interrupted_run(engine, tmp_path, spec, " INFO    started", count=2)
    assert "interrupted: stopping and removing the job's containers and networks" in rest
    assert "trial 3:" not in rest  # no trial starts once interrupted
    assert leftovers(engine) == []


PROBE = """
import os, socket, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["https_proxy"])
print("proxy", proxy.hostname, proxy.port, flush=True)

def connect(target):
    with socket.create_connection((proxy.hostname, proxy.port), timeout=30) as client:
        client.sendall(f"CONNECT {target} HTTP/1.1\\r\\n\\r\\n".encode())
        return client.recv(4096).split(b" ")[1].decode()

service = int(sys.argv[1])
print("through the proxy to this machine's loopback service:", connect(f"127.0.0.1:{service}"), flush=True)
print("through the proxy to the metadata server:", connect("169.254.169.254:80"), flush=True)
try:
    socket.create_connection((proxy.hostname, service), timeout=10).close()
    print("directly to the service: open", flush=True)
except OSError:
    print("directly to the service: closed", flush=True)
idle = socket.create_connection((proxy.hostname, proxy.port))  # connects and sends nothing
import tensorflow as tf
print("gs:// while a client sits idle:", tf.io.gfile.GFile("gs://vx-probe/staged.txt").read(), flush=True)
time.sleep(10)  # while the test knocks from outside the job's network (it does on the first line)
"""


def test_from_inside_a_replica_the_proxy_reaches_cloud_storage_and_nothing_of_this_machine(engine, cpu_image, tmp_path):
    """The images a rehearsal runs are not trusted: through the proxy they reach Cloud Storage,
    not a service that listens on this machine's loopback, nor the metadata server; an idle client
    stalls nobody; and a client from outside the job's networks is refused."""
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    staged = tmp_path / "staged.txt"
    staged.write_text("answered")
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": ["python", "-c", PROBE, str(service.server_address[1])]}}]}}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    tool, _ = engine
    runner = subprocess.Popen([PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool, "--spec",
                               str(tmp_path / "job.json"), "--stage", f"{staged}=gs://vx-probe"],
                              cwd=REPO, env=user_env(), stdout=subprocess.PIPE, text=True)
    outside = None
    try:
        output = []
        for line in runner.stdout:
            output.append(line)
            found = re.search(r"INFO +proxy (\S+) (\d+)$", line)
            if found:
                gateway, port = found.group(1), int(found.group(2))
                outside = outside_client(gateway, port)
        output.append(runner.stdout.read())
        assert runner.wait(timeout=300) == 0, "".join(output)[-3000:]
    finally:
        if runner.poll() is None:
            runner.kill()
        service.shutdown()
        service.server_close()
    output = "".join(output)
    said = lines(output, "workerpool0-0", "INFO")
    assert "through the proxy to this machine's loopback service: 403" in said, said
    assert "through the proxy to the metadata server: 403" in said
    assert "directly to the service: closed" in said
    assert "gs:// while a client sits idle: answered" in said
    notes = lines(output, "local-run", "WARNING")
    assert any(n.startswith(f"refused CONNECT 127.0.0.1:{service.server_address[1]} from ") for n in notes), notes
    if outside is not None:
        address, reply = outside
        assert reply == b"", reply  # closed before anything was read
        assert any(n.startswith(f"refused a connection to the Cloud Storage proxy from {address}") for n in notes), notes
    assert leftovers(engine) == []


def outside_client(gateway: str, port: int) -> tuple[str, bytes] | None:
    """Knocks on the job network's proxy from an address of this machine outside that network, as
    a host of the local network would: (the address, what the proxy answered)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # the address that faces the network (no packet is sent)
        address = probe.getsockname()[0]
    finally:
        probe.close()
    if address.startswith("127."):
        return None
    with socket.create_connection((gateway, port), timeout=30, source_address=(address, 0)) as client:
        client.sendall(b"CONNECT storage.googleapis.com:443 HTTP/1.1\r\n\r\n")
        return address, client.recv(4096)


@pytest.mark.parametrize("bad", ["workerpool9-0@10", "workerpool1-0@soon", "workerpool1-5@10"])
def test_a_wrong_preemption_is_one_line_and_exit_2(engine, tmp_path, bad):
    spec = dry_run("vertex", "--workers", "1", "--", image="unused:latest")
    result = run_local(engine, tmp_path, spec, "--preempt", bad)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("submit_job: error: --preempt")


def test_scheduling_timeout_ends_the_job(engine, cpu_image, tmp_path):
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": WAITS}}], "scheduling": {"timeout": "3s"}}}
    result = run_local(engine, tmp_path, spec, timeout=300)
    assert result.returncode == 124, result.stdout[-3000:]
    assert lines(result.stdout, "local-run", "ERROR")[-1] == "JOB_STATE_FAILED: the job ran past scheduling.timeout (3s)"
    assert leftovers(engine) == []


def test_real_cloud_storage_mounts_the_users_credentials_as_gcloud_local_run_does(engine, cpu_image, tmp_path):
    """--real-gcs: no local server and no proxy; the Application Default Credentials file is
    mounted where `gcloud ai custom-jobs local-run` mounts it. (Nothing here reaches Google.)"""
    tool, _ = engine
    key = tmp_path / "adc.json"
    key.write_text('{"type": "authorized_user", "note": "test"}')
    show = "cat \"$GOOGLE_APPLICATION_CREDENTIALS\"; echo; echo proxy=${https_proxy:-none}; test -d /gcs && echo gcs || echo no-gcs"
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": ["sh", "-c", show]}}]}}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool, "--real-gcs",
                             "--spec", str(tmp_path / "job.json")], cwd=REPO, capture_output=True, text=True,
                            env=user_env(GOOGLE_APPLICATION_CREDENTIALS=str(key)), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert lines(result.stdout, "workerpool0-0", "INFO") == [key.read_text(), "proxy=none", "no-gcs"]
    assert "Cloud Storage: Google's, with your Application Default Credentials" in result.stdout
    assert leftovers(engine) == []


@pytest.mark.parametrize("path", ["transient exit", "Spot preemption", "maintenance"])
def test_disable_retries_turns_off_every_restart_and_retry(engine, base_image, tmp_path, path):
    """scheduling.disableRetries: the event that would restart the job, or a replica, fails it."""
    crash = "echo ready; sh -c 'kill -SEGV $$'; exit $?" if path == "transient exit" else \
        "echo ready; trap 'exit 143' TERM; sleep 600 & wait"
    spec = sh_job(base_image, "trap 'exit 143' TERM; sleep 600 & wait", crash,
                  disableRetries=True, restartJobOnWorkerRestart=True)
    option = {"Spot preemption": ["--preempt", "workerpool1-0@/ready/"],
              "maintenance": ["--maintenance", "workerpool1-0@/ready/"]}.get(path, [])
    result = run_local(engine, tmp_path, spec, *option)
    code = 139 if path == "transient exit" else 143
    assert result.returncode == code, result.stdout[-3000:]
    assert summary(result.stdout)["workerpool1-0"] == ([code], 0)  # never started again
    assert not [n for n in lines(result.stdout, "local-run") if "restarting" in n or "on another machine" in n], result.stdout
    failed = lines(result.stdout, "local-run", "ERROR")[-1]
    assert failed.startswith("JOB_STATE_FAILED: ") and failed.endswith("(scheduling.disableRetries)"), failed
    assert leftovers(engine) == []


def test_an_mwms_job_with_reduction_server_trains_with_mwms_beside_stand_in_reducers(engine, cpu_image, tmp_path):
    """Worker pool 2 runs Google's reduction-server image, which cannot be pulled here: the
    reducers run as stand-ins, and the chief and worker, told the cluster Vertex tells them
    (reducers under `ps`), train with MultiWorkerMirrored without waiting for them."""
    spec = dry_run("vertex", "--workers", "1", "--machine-type", "a2-highgpu-1g", "--accelerator-type", "NVIDIA_TESLA_A100",
                   "--accelerator-count", "1", "--reduction-server", "2", "--", *TRAINING, image=cpu_image)
    assert "reductionserver" in spec["jobSpec"]["workerPoolSpecs"][2]["containerSpec"]["imageUri"]
    result = run_local(engine, tmp_path, spec)
    assert result.returncode == 0, result.stdout[-5000:]
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    assert "role: chief-0, strategy: multi_worker_mirrored" in chief and "replicas=2" in chief, chief[-3000:]
    notes = lines(result.stdout, "local-run")
    assert any(n.startswith("workerpool2-0, workerpool2-1: Reduction Server reducers (") and "stand-ins" in n
               for n in notes), notes
    assert lines(result.stdout, "workerpool2-0") == [] and lines(result.stdout, "workerpool2-1") == []
    assert set(summary(result.stdout)) == {"workerpool0-0", "workerpool1-0", "workerpool2-0", "workerpool2-1"}
    assert summary(result.stdout)["workerpool2-0"][1] == 0
    assert lines(result.stdout, "local-run", "INFO")[-1].startswith("JOB_STATE_SUCCEEDED")
    assert leftovers(engine) == []
