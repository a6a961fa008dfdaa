"""A job's state is its own (trainer.runtime.ownership), with real processes: two trials of a tuning job
given the same flags and directories never resume each other's backup, and each trial's restart
resumes its own at the step. Single processes of the small model: the trials' separation does not
depend on the strategy, and the multi-worker cases are held by test_mwms.py (another job beside a
stopped one) and test_own_code_doc.py (the docs' two commands in one parent directory)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from helpers import FLOAT32, REPO, backups_reported, clean_env, launch_until, resumed_at

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "8", *FLOAT32]


def trial_args(tmp_path, data_root) -> list[str]:
    return ["--data-dir", str(data_root), "--dataset", "synthetic:64", *SMALL_RUN, "--epochs", "2",
            "--steps-per-epoch", "60", "--backup-every-steps", "10", "--model-dir", str(tmp_path / "out" / "model")]


def trial(number: str) -> dict:
    return clean_env(CLOUD_ML_TRIAL_ID=number)


def test_two_trials_of_a_tuning_job_never_resume_each_others_backup(tmp_path, data_root):
    args = trial_args(tmp_path, data_root)
    # Trial 1 is stopped without warning after a backup in its second epoch.
    code, first = launch_until(args, r".*trainer: backup saved in \d+\.\ds: a restart resumes at epoch 2 step [1-9]\d?$",
                               lambda so_far, process: process.send_signal(signal.SIGKILL), env=trial("1"),
                               module="cassava.task")
    assert code == -signal.SIGKILL, first[-3000:]
    stopped_at = backups_reported(first, task=None)[-1]
    # Trial 2, the same command in the same directories, trains from scratch, in its own.
    second = subprocess.run([sys.executable, "-m", "cassava.task", *args], cwd=REPO, env=trial("2"), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert resumed_at(second.stdout, task=None) is None and "another job" not in second.stdout
    checkpoints = tmp_path / "out" / "checkpoints"
    assert (checkpoints / "trial-2" / "epoch-2.index").exists() and not (checkpoints / "trial-1" / "epoch-2.index").exists()
    records = {n: json.loads((checkpoints / f"trial-{n}" / "job.json").read_text()) for n in ("1", "2")}
    assert records["1"]["key"] != records["2"]["key"]
    assert (records["1"]["job"]["trial"], records["2"]["job"]["trial"], records["2"]["state"]) == ("1", "2", "finished")
    # Trial 1 restarted resumes its own backup at its step.
    third = subprocess.run([sys.executable, "-m", "cassava.task", *args], cwd=REPO, env=trial("1"), capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert resumed_at(third.stdout, task=None) == stopped_at
    assert (tmp_path / "out" / "model" / "trial-1" / "saved_model.pb").exists()
