"""What goes wrong on Cloud Storage, against the local server (scripts/rehearsal/local_gcs/): missing
and forbidden buckets, 503s short and lasting, a task killed mid-epoch or mid-write. In every
case the job says so in one line and nothing already written is lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import FLOAT32, REPO, backups_reported, clean_env, epochs_begun, launch_until, resumed_at, run_module

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4", *FLOAT32]
# TensorFlow's GCS client retries ten times over about three minutes before it gives up; these
# shorten that budget (the same code path) so a lasting outage shows within seconds.
SHORT_RETRIES = {"GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "50000", "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000",
                 "GCS_RETRY_CONFIG_MAX_RETRIES": "3"}


def error_lines(text: str) -> list[str]:
    return re.findall(r"^(?:\[\S+\] )?cassava\.task: error: (.*)$", text, re.M)


def task(data_root, gcs, bucket: str, *args, extra_env=None):
    return run_module("cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "1",
                      "--steps-per-epoch", "4", *SMALL_RUN, "--model-dir", f"gs://{bucket}/model", *args,
                      env=clean_env(**gcs.environ(), **(extra_env or {})), timeout=400)


def test_a_missing_bucket_is_one_line_naming_the_path_and_exit_2(gcs, data_root):
    result = task(data_root, gcs, "no-such-bucket")
    assert result.returncode == 2, result.stderr[-3000:]
    assert error_lines(result.stderr) == ["gs://no-such-bucket/model: bucket gs://no-such-bucket does not exist "
                                          "(or the job's service account cannot see it)"]


def test_a_forbidden_bucket_is_one_line_naming_the_path_and_exit_2(gcs, data_root):
    gcs.create_bucket("forbidden")
    gcs.fail(403, 10**6, path=r"/b/forbidden(/|\?|$)|^/forbidden/")
    result = task(data_root, gcs, "forbidden")
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert line.startswith("gs://forbidden/model") and "permission denied (HTTP 403" in line, line


def test_a_burst_of_503s_is_retried_and_the_job_finishes(gcs, data_root):
    gcs.create_bucket("flaky")
    burst = gcs.fail(503, 3, path=r"/b/flaky/o.*checkpoints")
    result = task(data_root, gcs, "flaky")
    assert result.returncode == 0, result.stderr[-3000:]
    assert burst.seen == 3  # the server did fail three requests, and the client retried them
    assert "flaky" in gcs.front.buckets and "model/saved_model.pb" in gcs.list("flaky", "model/")


def test_a_lasting_outage_is_one_line_and_the_retryable_exit_code(gcs, data_root):
    gcs.create_bucket("outage")
    # A first job's outputs are there; then, in the middle of a second, every checkpoint write fails.
    # The second (two epochs) is another job, so its checkpoints go under checkpoints/jobs/KEY/.
    task(data_root, gcs, "outage")
    before = gcs.list("outage")
    gcs.fail(503, 10**6, method="POST", path=r"/upload/storage/v1/b/outage/o\?.*name=checkpoints%2F([^&]*%2F)?epoch")
    result = task(data_root, gcs, "outage", "--epochs", "2", extra_env=SHORT_RETRIES)
    assert result.returncode == 143, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert line.startswith("gs://outage/") and "(HTTP 503" in line and "exit 143, retryable" in line, line
    gcs.clear_faults()
    assert set(before) <= set(gcs.list("outage"))  # nothing already written was lost


# A backup is about 25 requests: the data and index under backup-N_temp/, renamed (a copy and a
# delete each on Cloud Storage) to backup-N, then the `checkpoint` state file (written under a
# temporary name and renamed), then the older backup deleted. Where the second backup's writer
# dies, by its k-th request, and whether the state file had been renamed into place by then:
KILL_POINTS = {"data upload": (2, False), "state file rename": (17, False), "old backup deletion": (20, True)}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_task_killed_mid_backup_write_resumes_from_the_last_complete_backup(gcs, data_root, point):
    bucket = "backup-" + point.replace(" ", "-")
    gcs.create_bucket(bucket)
    args = ["cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "2",
            "--steps-per-epoch", "6", *SMALL_RUN, "--model-dir", f"gs://{bucket}/model", "--backup-every-steps", "3"]
    env = clean_env(**gcs.environ())
    process = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    second_backup: list[str] = []

    def kill_at_point(method, path):
        if method == "GET":
            return False
        if "backup-2_temp%2F&" in path or second_backup:
            second_backup.append(path)
        if len(second_backup) == KILL_POINTS[point][0] + 1:
            os.killpg(process.pid, signal.SIGKILL)  # the request it was making never arrives
            return True
        return False

    gcs.on_request(kill_at_point, path="backup", times=10**6, drop=True)
    first = process.communicate(timeout=300)[0]
    assert process.returncode == -signal.SIGKILL, first[-3000:]
    gcs.clear_faults()
    committed = any(re.search(r"/rewriteTo/.*%2Fcheckpoint$", path) for path in second_backup[:-1])
    assert committed == KILL_POINTS[point][1], second_backup  # TensorFlow's write order is as described above
    saved = backups_reported(first, task=None)
    assert saved and saved[0] == (1, 3), first[-3000:]

    second = run_module(*args, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    # Never half a backup: the second if its state file was renamed into place, else the first.
    assert resumed_at(second.stdout, task=None) == ((2, 0) if committed else (1, 3)), (point, second_backup)
    assert "model/saved_model.pb" in gcs.list(bucket, "model/")


def two_worker_args(tmp_path, data_root, bucket: str, every_steps: int) -> list[str]:
    # A chief that lost its worker exits on its own once TensorFlow notices (143), which can take
    # over 20 s on a loaded 2-core CI machine: the 60 s grace period lets that exit, not the
    # launcher's SIGKILL (137), end the task.
    return ["--workers", "2", "--work-dir", str(tmp_path / "work"), "--grace-period", "60", "--", "python", "-m", "cassava.task",
            "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "3", "--steps-per-epoch", "40",
            *SMALL_RUN, "--model-dir", f"gs://{bucket}/model", "--backup-every-steps", str(every_steps)]


def rerun(args, env) -> str:
    second = run_module("trainer.launch", *args, env=env)
    assert second.returncode == 0, second.stdout[-4000:]
    return second.stdout


def started_pid(output: str, task: str) -> int:
    return int(re.search(rf"started {task} \(pid (\d+)\)", output).group(1))


def test_a_worker_killed_mid_epoch_resumes_from_the_bucket_backup(gcs, data_root, tmp_path):
    gcs.create_bucket("killed-worker")
    args, env = two_worker_args(tmp_path, data_root, "killed-worker", 10), clean_env(**gcs.environ())
    code, first = launch_until(args, r"^\[chief-0\] .*backup saved in \d+\.\ds: a restart resumes at epoch 2 step [1-3]\d$",
                               lambda so_far, _: os.killpg(started_pid(so_far, "worker-0"), signal.SIGKILL), env=env)
    assert code == 137, first[-3000:]
    newest = backups_reported(first)[-1]
    assert "task exit codes: chief-0=143 worker-0=137" in first
    second = rerun(args, env)
    assert resumed_at(second) >= newest and resumed_at(second, "worker-0") == resumed_at(second)
    assert epochs_begun(second)[0] == resumed_at(second)[0]
    assert "model/saved_model.pb" in gcs.list("killed-worker", "model/")


def test_sigterm_to_one_worker_backs_up_into_the_bucket_and_the_rerun_resumes_there(gcs, data_root, tmp_path):
    gcs.create_bucket("preempted")
    args, env = two_worker_args(tmp_path, data_root, "preempted", 1000), clean_env(**gcs.environ())
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                               lambda so_far, _: os.kill(started_pid(so_far, "worker-0"), signal.SIGTERM), env=env)
    assert code == 143, first[-3000:]
    match = re.search(r"^\[chief-0\] cassava.task: preempted \(SIGTERM\): saved a backup; a restart resumes at "
                      r"epoch (\d+) step (\d+) \(exit 143\)$", first, re.M)
    assert match, first[-3000:]
    # The chief's backup is in the bucket; every other worker wrote its copy to a scratch directory of its own.
    names = gcs.list("preempted", "checkpoints/")
    assert any(name.startswith("checkpoints/backup/backup-") for name in names), names
    assert not [name for name in names if "worker" in name], names
    assert resumed_at(rerun(args, env)) == (int(match.group(1)), int(match.group(2)))
