"""`submit_job.py local`: CustomJobs and tuning jobs run on this machine as Vertex AI runs them,
one container of the real CPU image per replica, with gs:// served by the local Cloud Storage server.

Each test runs the command as a user would and reads what it prints: replica, severity, line.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from containers import SMALL_TRAINING, sh
from helpers import REPO, backups_reported, resumed_at, run_module, write_image_folder

PYTHON = str(REPO / ".venv" / "bin" / "python")
# Each replica makes its own synthetic data on its own disk, as it would on its own VM.
TRAINING = [*SMALL_TRAINING, "--data-dir", "/tmp/data"]


def dry_run(*args: str, image: str) -> dict:
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", *args[:args.index("--")], "--dry-run",
                             "--image-uri", image, *args[args.index("--"):]],
                            cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def run_local(engine, tmp_path, spec: dict | None, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    tool, env = engine
    command = [PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool]
    if spec is not None:
        (tmp_path / "job.json").write_text(json.dumps(spec))
        command += ["--spec", str(tmp_path / "job.json")]
    result = subprocess.run([*command, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
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


def leftovers(engine) -> list[str]:
    tool, env = engine
    containers = sh(tool, "ps", "-a", "--format", "{{.Names}}", env=env).stdout.split()
    networks = sh(tool, "network", "ls", "--format", "{{.Name}}", env=env).stdout.split()
    return [name for name in containers + networks if name.startswith("vertex-local-")]


def summary(output: str) -> dict[str, tuple[list[int], int]]:
    """replica -> (its exit codes, its restarts), from the run's closing lines."""
    rows = re.findall(r"^local-run\s+NOTICE\s+(?:trial \d+: )?(workerpool\d-\d+): exit codes ([\d,-]+); restarts (\d+)$",
                      output, re.M)
    return {name: ([int(c) for c in codes.split(",") if c != "-"], int(restarts)) for name, codes, restarts in rows}


def test_mwms_job_from_a_dry_run_spec_reads_from_gcs_files_and_writes_to_the_bucket(engine, cpu_image, tmp_path):
    """Chief + 2 workers as `vertex --dry-run` prints them. The data is staged into a bucket and
    read through /gcs/ (Cloud Storage FUSE on Vertex); the outputs go to gs:// through AIP_*."""
    prepared = tmp_path / "prepared"
    made = run_module("trainer.prepare", "--source", f"folder:{write_image_folder(tmp_path / 'images')}",
                      "--output", str(prepared), "--shards", "6")
    assert made.returncode == 0, made.stderr[-2000:]
    spec = dry_run("vertex", "--workers", "2", "--base-output-dir", "gs://vx-mwms/job", "--",
                   *SMALL_TRAINING, "--dataset", "tfrecord:/gcs/vx-mwms/data/train-*.tfrecord", "--epochs", "2", image=cpu_image)
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"),
                       "--stage", f"{prepared}=gs://vx-mwms/data")
    assert result.returncode == 0, result.stdout[-4000:]
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    assert "train_examples=40 sharding=FILE" in chief, chief[-3000:]  # 6 files from /gcs/, 3 workers
    kept = tmp_path / "kept" / "vx-mwms" / "job"
    assert (kept / "model" / "saved_model.pb").exists()
    assert (kept / "checkpoints" / "epoch-0002.index").exists()
    assert [p.name for p in (kept / "logs" / "train").iterdir() if p.name.startswith("events.out.tfevents.")]
    # Each replica was told its Vertex role, and the output directories under the base.
    assert any(line.endswith("role: worker-1, strategy: multi_worker_mirrored, model dir: gs://vx-mwms/job/model/")
               for line in lines(result.stdout, "workerpool1-1", "INFO")), result.stdout[-4000:]
    assert "replicas=3" in chief
    # Progress is INFO (stdout); nothing the trainer logs as progress reads as an error.
    assert any("trainer: epoch 2/2 ends: accuracy=" in line for line in lines(result.stdout, "workerpool0-0", "INFO"))
    errors = [line for r in ("workerpool0-0", "workerpool1-0", "workerpool1-1")
              for line in lines(result.stdout, r, "ERROR")]
    assert not [line for line in errors if "trainer: epoch" in line or "trainer: role" in line], errors
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
    assert (kept / "model" / "saved_model.pb").exists() and (kept / "checkpoints" / "epoch-0002.index").exists()
    assert any("role: evaluator" in line for line in lines(result.stdout, "workerpool3-0", "INFO")), result.stdout[-4000:]
    assert any("role: ps-0" in line for line in lines(result.stdout, "workerpool2-0", "INFO"))
    assert leftovers(engine) == []


def test_a_preempted_worker_restarts_the_job_which_resumes_from_its_backup(engine, cpu_image, tmp_path):
    spec = dry_run("vertex", "--workers", "1", "--base-output-dir", "gs://vx-spot/job", "--",
                   *TRAINING, "--epochs", "3", "--steps-per-epoch", "6", image=cpu_image)
    assert spec["jobSpec"]["scheduling"]["restartJobOnWorkerRestart"] is True
    result = run_local(engine, tmp_path, spec, "--keep", str(tmp_path / "kept"),
                       "--preempt", "workerpool1-0@/epoch 2/3 begins/")
    assert result.returncode == 0, result.stdout[-5000:]
    notes = lines(result.stdout, "local-run")
    assert any(n.startswith("preempting workerpool1-0: SIGTERM now") for n in notes), notes
    assert any("restarting every replica (restartJobOnWorkerRestart), workerpool1-0 on a new machine" in n
               for n in notes), notes
    chief = "\n".join(lines(result.stdout, "workerpool0-0"))
    # The job came back at the step of the last backup saved before the preemption.
    before, after = chief.split("resumed from backup", 1)
    assert backups_reported(before, task=None), before[-3000:]
    assert resumed_at(chief, task=None) == backups_reported(before, task=None)[-1]
    assert resumed_at(chief, task=None)[0] >= 2
    assert "epoch 3/3 ends" in after
    assert (tmp_path / "kept" / "vx-spot" / "job" / "model" / "saved_model.pb").exists()
    rows = summary(result.stdout)
    assert rows["workerpool1-0"][1] == 1 and rows["workerpool0-0"][1] == 1, rows
    assert rows["workerpool0-0"][0][-1] == 0
    assert leftovers(engine) == []


HANDWRITTEN_POOL = {"machineSpec": {"machineType": "e2-standard-4"}, "replicaCount": 1}


def test_a_configuration_error_is_restarted_as_vertex_would_then_fails_with_its_one_line(engine, cpu_image, tmp_path):
    spec = {"displayName": "bad-flag", "jobSpec": {"workerPoolSpecs": [{
        **HANDWRITTEN_POOL, "containerSpec": {"imageUri": cpu_image, "args": [*TRAINING, "--epochs", "0"]}}]}}
    # Vertex allows 5 restarts of a replica, then 3 of the whole job: 24 runs of about 10 s each
    # here (the engine's start-up). The same rule with 2 and 1 makes 6.
    result = run_local(engine, tmp_path, spec, "--replica-restarts", "2", "--job-retries", "1")
    assert result.returncode == 2, result.stdout[-3000:]
    error = "python -m trainer.task: error: argument --epochs: must be positive, got 0 (--help lists the flags)"
    assert summary(result.stdout) == {"workerpool0-0": ([2] * 6, 5)}
    assert lines(result.stdout, "workerpool0-0") == [error] * 6  # each run, one line
    notes = lines(result.stdout, "local-run")
    assert sum(n.startswith("restarting the whole job (retry 1 of 1)") for n in notes) == 1
    assert sum(n == "workerpool0-0 exited 2: restarting it on the same machine" for n in notes) == 4
    assert lines(result.stdout, "local-run", "ERROR")[-1] == (
        f"JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 2. Last error: {error}")
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
                        "python -m trainer.task \"$@\" && cd /gcs/vx-own/run && find . -type f | sort", "trainer"]
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
    assert cluster["task"] == {"type": "workerpool1", "index": 0} and json.loads(cluster["job"]) == spec["jobSpec"]
    assert json.loads(told["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert (told["AIP_MODEL_DIR"], told["AIP_CHECKPOINT_DIR"], told["AIP_TENSORBOARD_LOG_DIR"]) == (
        "gs://vx-own/run/model/", "gs://vx-own/run/checkpoints/", "gs://vx-own/run/logs/")
    assert told["CLOUD_ML_JOB_ID"].isdigit() and told["OWN_SETTING"] == "kept" and "CLOUD_ML_TRIAL_ID" not in told
    assert (tmp_path / "kept" / "vx-own" / "run" / "model" / "saved_model.pb").exists()
    # What the trainer wrote to gs:// is there under /gcs/, as the chief lists it after training.
    under_gcs = [line for line in lines(result.stdout, "workerpool0-0", "INFO") if line.startswith("./")]
    assert {"./model/saved_model.pb", "./checkpoints/epoch-0001.index"} <= set(under_gcs), under_gcs
    assert any(line.startswith("./logs/train/events.out.tfevents.") for line in under_gcs), under_gcs
    kept = {"./" + p.relative_to(tmp_path / "kept" / "vx-own" / "run").as_posix()
            for p in (tmp_path / "kept" / "vx-own" / "run").rglob("*") if p.is_file()}
    assert set(under_gcs) == kept
    assert leftovers(engine) == []


def test_ctrl_c_removes_every_container_network_and_server(engine, cpu_image, tmp_path):
    tool, env = engine
    servers_before = set(subprocess.run(["pgrep", "-f", "fake-gcs-server"], capture_output=True, text=True).stdout.split())
    spec = dry_run("vertex", "--workers", "1", "--base-output-dir", "gs://vx-stop/job", "--",
                   *TRAINING, "--epochs", "50", image=cpu_image)
    (tmp_path / "job.json").write_text(json.dumps(spec))
    runner = subprocess.Popen([PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool, "--spec",
                               str(tmp_path / "job.json")], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        for line in runner.stdout:
            if "trainer: epoch 1/50 begins" in line:
                runner.send_signal(signal.SIGINT)
                break
        rest = runner.stdout.read()
        assert runner.wait(timeout=120) == 130, rest[-3000:]
    finally:
        if runner.poll() is None:
            runner.kill()
    assert "interrupted: removing the job's containers and networks" in rest
    assert leftovers(engine) == []
    servers_after = set(subprocess.run(["pgrep", "-f", "fake-gcs-server"], capture_output=True, text=True).stdout.split())
    assert servers_after <= servers_before  # the runner's own server is gone


@pytest.mark.parametrize("bad", ["workerpool9-0@10", "workerpool1-0@soon", "workerpool1-5@10"])
def test_a_wrong_preemption_is_one_line_and_exit_2(engine, tmp_path, bad):
    spec = dry_run("vertex", "--workers", "1", "--", image="unused:latest")
    result = run_local(engine, tmp_path, spec, "--preempt", bad)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("submit_job: error: --preempt")


def test_scheduling_timeout_ends_the_job(engine, cpu_image, tmp_path):
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": ["sleep", "600"]}}], "scheduling": {"timeout": "3s"}}}
    result = run_local(engine, tmp_path, spec, timeout=300)
    assert result.returncode == 124, result.stdout[-3000:]
    assert lines(result.stdout, "local-run", "ERROR")[-1] == "JOB_STATE_FAILED: the job ran past scheduling.timeout (3s)"
    assert leftovers(engine) == []


def test_real_cloud_storage_mounts_the_users_credentials_as_gcloud_local_run_does(engine, cpu_image, tmp_path):
    """--real-gcs: no local server and no proxy; the Application Default Credentials file is
    mounted where `gcloud ai custom-jobs local-run` mounts it. (Nothing here reaches Google.)"""
    tool, env = engine
    key = tmp_path / "adc.json"
    key.write_text('{"type": "authorized_user", "note": "test"}')
    show = "cat \"$GOOGLE_APPLICATION_CREDENTIALS\"; echo; echo proxy=${https_proxy:-none}; test -d /gcs && echo gcs || echo no-gcs"
    spec = {"jobSpec": {"workerPoolSpecs": [{**HANDWRITTEN_POOL, "containerSpec": {
        "imageUri": cpu_image, "command": ["sh", "-c", show]}}]}}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    result = subprocess.run([PYTHON, "-m", "scripts.submit_job", "local", "--engine", tool, "--real-gcs",
                             "--spec", str(tmp_path / "job.json")], cwd=REPO, capture_output=True, text=True,
                            env={**env, "GOOGLE_APPLICATION_CREDENTIALS": str(key)}, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert lines(result.stdout, "workerpool0-0", "INFO") == [key.read_text(), "proxy=none", "no-gcs"]
    assert "Cloud Storage: Google's, with your Application Default Credentials" in result.stdout
    assert leftovers(engine) == []
