"""Where the trainer's lines go, in a real process: Cloud Logging reads every stderr line as ERROR."""

import subprocess
import sys


def test_progress_goes_to_stdout_and_only_warnings_and_errors_to_stderr():
    # Cloud Logging gives stderr lines severity ERROR: progress there would read as errors.
    script = ("import logging; from trainer.runtime import logs; logs.configure(); log = logging.getLogger('trainer'); "
              "log.info('epoch 1/1 begins'); log.warning('disk nearly full'); log.error('lost worker-0')")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert [line.split(" ", 1)[1] for line in result.stdout.splitlines()] == ["trainer: epoch 1/1 begins"]
    assert [line.split(" ", 1)[1] for line in result.stderr.splitlines()] == [
        "trainer: disk nearly full", "trainer: lost worker-0"]
