"""docs/your-own-code.md's level 1, run as a new user runs it: the page's commands as written, from
a copy of the repository's layout, with the virtualenv NOT activated (its python called by its
path, a PATH that holds none of it). The level-1 example (examples/level1/task.py) trains as one
process and as a 2-replica MultiWorkerMirrored job, and its export answers through the prediction
server's code; the issue's own command (`trainer.launch --workers 2 -- python -m trainer.run --
python task.py`) runs too."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from helpers import REPO
from quiet_end import errors_after_training

PAGE = REPO / "docs" / "your-own-code.md"
MARKER = "<!-- tested as written: tests/integration/test_level1_doc.py -->"
# What a shell without the virtualenv activated has: no .venv/bin on PATH, no PYTHONPATH.
NOT_ACTIVATED = {"PATH": "/usr/bin:/bin"}


def documented_commands() -> list[str]:
    text = PAGE.read_text()
    assert MARKER in text, "docs/your-own-code.md no longer marks its level-1 commands"
    block = re.match(r"\s*```\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block, "the marker must come right before a fenced block"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture
def layout(tmp_path):
    """The repository's layout, as a clone has it, in a directory of the test's own (the commands
    write output/ there, not in the checkout)."""
    for name in (".venv", "trainer", "serving", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def run_as_written(command: str, cwd, home) -> subprocess.CompletedProcess:
    return subprocess.run(shlex.split(command), cwd=cwd, env={**NOT_ACTIVATED, "HOME": str(home)},
                          capture_output=True, text=True, timeout=600)


def test_the_page_runs_the_example_on_one_and_two_replicas_and_serves_its_export(layout, tmp_path_factory):
    commands = documented_commands()
    assert [c.split()[:3] for c in commands] == [[".venv/bin/python", "-m", "trainer.run"],
                                                 [".venv/bin/python", "-m", "trainer.launch"],
                                                 [".venv/bin/python", "-m", "serving.predict"]]
    home = tmp_path_factory.mktemp("home")
    alone, together, predicted = (run_as_written(command, layout, home) for command in commands)
    for result in (alone, together, predicted):
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "epoch 2/2: loss" in alone.stdout and "(1 replicas)" in alone.stdout, alone.stdout[-2000:]
    assert "saved to output/model" in alone.stdout.splitlines()
    # Two replicas trained together; the chief alone printed progress and kept the export.
    epochs = re.findall(r"^\[(\S+)\] epoch \d/2: loss \S+ \((\d) replicas\)$", together.stdout, re.M)
    assert epochs == [("chief-0", "2"), ("chief-0", "2")], together.stdout[-3000:]
    assert "[chief-0] saved to output/model" in together.stdout.splitlines()
    assert not re.search(r"^\[launch\] --workers", together.stdout, re.M)  # the page says --replicas
    # Both left together after their collective save: no task logged an error once training had ended.
    assert errors_after_training(together.stdout) == [], together.stdout[-3000:]
    # The export, served: y = 1 + x . (1, -2, 3, 0.5) for the two instances of the example's file.
    rows = [line.split("\t") for line in predicted.stdout.splitlines()]
    assert [source for source, _ in rows] == ["examples/level1/instances.jsonl:1", "examples/level1/instances.jsonl:2"]
    answers = [json.loads(answer) for _, answer in rows]
    assert abs(answers[0] - 2.0) < 0.5 and abs(answers[1] + 1.0) < 0.5, answers
    assert (layout / "output" / "model" / "saved_model.pb").is_file()


def test_the_issues_command_runs_with_the_virtualenv_not_activated(layout, tmp_path_factory):
    """`python -m trainer.launch --workers 2 -- python -m trainer.run -- python task.py`, the
    virtualenv's python by its absolute path: every `python` after it is that interpreter."""
    venv_python = REPO / ".venv" / "bin" / "python"
    result = subprocess.run([str(venv_python), "-m", "trainer.launch", "--workers", "2", "--", "python", "-m", "trainer.run",
                             "--", "python", "examples/level1/task.py", "--epochs", "1", "--steps-per-epoch", "5"],
                            cwd=layout, env={**NOT_ACTIVATED, "HOME": str(tmp_path_factory.mktemp("home"))},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[chief-0] epoch 1/1: loss" in result.stdout and "(2 replicas)" in result.stdout, result.stdout[-3000:]
    # The older spelling of --replicas still runs 2 replicas, and says what to write.
    assert re.search(r"^\[launch\] --workers 2 without --ps: 2 training replicas, the chief included, as before; write "
                     r"--replicas 2", result.stdout, re.M), result.stdout[:2000]
    assert result.stdout.rstrip().endswith("[launch] exit code 0")
