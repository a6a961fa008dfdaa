"""What only a fresh process shows: the unit tier runs these commands in its own process
(tests/helpers.py's run_main), where TensorFlow may be loaded already and the repository's root is
on sys.path; these run them as a user's shell does."""

from __future__ import annotations

import subprocess
import sys

import yaml

from helpers import REPO, clean_env

CPU = "us-central1-docker.pkg.dev/my-project/trainers/cassava-trainer-cpu:abc123"


def test_parsing_the_flags_does_not_load_tensorflow():
    """cassava.task parses its flags without loading TensorFlow: a bad flag, or --help, answers in
    a moment and prints none of TensorFlow's lines (a fresh process: the test's own may have loaded it)."""
    code = ("import sys, cassava.task, trainer.fit; "
            "trainer.fit.build_parser(cassava.task.CassavaTask()).parse_args(['--epochs', '1']); "
            "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code],
                            cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_printed_jobset_runs_as_a_script_too():
    """`python scripts/submit_job.py` puts scripts/, not the repo root, on sys.path."""
    result = subprocess.run([sys.executable, "scripts/submit_job.py", "jobset", "--image-uri", CPU], cwd=REPO,
                            env={k: v for k, v in clean_env().items() if k != "PYTHONPATH"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "JobSet"
