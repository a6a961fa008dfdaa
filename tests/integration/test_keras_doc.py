"""docs/keras.md's level-1 commands, run as the page writes them, from a copy of the repository's
layout with the virtualenv not activated: a keras.io-style script's `model.fit` on two workers ends
in trainer.run's one line (keras-team/keras#20585) with no traceback and no batch dump, and the
page's change, applied to a copy of the script, trains it on both."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from helpers import REPO

PAGE = REPO / "docs" / "keras.md"
NOT_ACTIVATED = {"PATH": "/usr/bin:/bin"}


def block_after(marker: str) -> str:
    text = PAGE.read_text()
    assert marker in text, f"docs/keras.md no longer has {marker!r}"
    block = re.match(r"\s*```\w*\n(.*?)```", text.split(marker, 1)[1], re.S)
    assert block, "the marker must come right before a fenced block"
    return block.group(1)


def apply_change(source: str, diff: str) -> str:
    """The page's `-`/`+` lines applied to `source`: the removed lines, in a row, become the added."""
    removed = "".join(line[1:] + "\n" for line in diff.splitlines() if line.startswith("-"))
    added = "".join(line[1:] + "\n" for line in diff.splitlines() if line.startswith("+"))
    assert removed and source.count(removed) == 1, "the change's removed lines are not in the script"
    return source.replace(removed, added)


@pytest.fixture
def layout(tmp_path):
    for name in (".venv", "trainer", "serving"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "examples" / "level1").mkdir(parents=True)
    return tmp_path


def run(command: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(shlex.split(command), cwd=cwd, env={**NOT_ACTIVATED, "HOME": str(cwd)},
                          capture_output=True, text=True, timeout=600)


def test_model_fit_on_two_workers_is_one_line_and_the_pages_change_trains_it(layout):
    (command,) = [line for line in block_after("<!-- tested as written: tests/integration/test_keras_doc.py -->")
                  .splitlines() if line.strip()]
    script = layout / "examples" / "level1" / "clicks.py"
    original = (REPO / "examples" / "level1" / "clicks.py").read_text()
    script.write_text(original)

    failed = run(command, layout)
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output[-3000:]
    said = re.findall(r"^\[(chief-0|worker-0)\] trainer\.run: the command failed: (.*)$", output, re.M)
    assert said and all(line == said[0][1] for _, line in said), output[-3000:]
    assert "keras-team/keras#20585" in said[0][1] and "trainer.loop.fit_model(model, dataset" in said[0][1]
    for dump in ("Traceback", "PerReplica", "Attempt to convert a value", "array(["):
        assert dump not in output, dump

    script.write_text(apply_change(original, block_after("<!-- the change, tested: tests/integration/test_keras_doc.py -->")))
    trained = run(command, layout)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-3000:]
    # Keras' own progress bar at verbose=2, from the chief alone: `Epoch N/3`, then the epoch's line.
    epochs = re.findall(r"^\[(\S+)\] Epoch (\d)/3$", output, re.M)
    assert epochs == [("chief-0", "1"), ("chief-0", "2"), ("chief-0", "3")], output[-3000:]
    ends = re.findall(r"^\[(\S+)\] \d+/\d+ - \d+s - \S+/step - auc: (\S+) - loss: \S+$", output, re.M)
    assert [task for task, _ in ends] == ["chief-0"] * 3, output[-3000:]
    assert float(ends[-1][1]) > 0.8  # the clicks follow the site and two numbers: the model finds them
    assert (layout / "output" / "model" / "saved_model.pb").is_file()  # the chief's export, at AIP_MODEL_DIR's default
