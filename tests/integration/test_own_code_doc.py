"""docs/your-own-code.md's worked example, run as the page writes it: its `linefit.py` saved where
the page says (a directory of the test's own stands in for /tmp/linefit), its two commands run
from the repository's root. A level-2 task that is nothing but the public interface trains under
MultiWorkerMirrored and ParameterServer strategies and saves from the chief only."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from helpers import REPO, clean_env
from quiet_end import errors_after_training

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "your-own-code.md"


def worked_example() -> tuple[str, list[str]]:
    """(linefit.py's text, the commands that run it), as the page shows them."""
    text = PAGE.read_text()
    section = text[text.index("### A complete worked example"):]
    script = re.search(r"Save this as `/tmp/linefit/linefit.py`.*?```python\n(.*?)```", section, re.S).group(1)
    commands = [line for line in re.search(r"train it on one machine.*?```\n(.*?)```", section, re.S).group(1).splitlines()
                if line.strip()]
    return script, commands


def test_the_page_holds_a_script_and_two_commands():
    script, commands = worked_example()
    assert "class LineFit(Task)" in script and "fit.run(LineFit())" in script
    assert len(commands) == 2 and all("trainer.launch" in c and "/tmp/linefit/linefit.py" in c for c in commands)


def test_the_worked_example_trains_as_written(tmp_path):
    script, commands = worked_example()
    (tmp_path / "linefit.py").write_text(script)
    outputs, shared = [], tmp_path / "checkpoints"  # both jobs' default: beside their model dirs
    mwms_files = {}
    for command in commands:
        words = shlex.split(command.replace("/tmp/linefit", str(tmp_path)))
        assignments = dict(word.split("=", 1) for word in words if re.match(r"^[A-Z_]+=", word))
        argv = [word for word in words if not re.match(r"^[A-Z_]+=", word)]
        result = subprocess.run(argv, cwd=REPO, env=clean_env(**assignments), capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        outputs.append(result.stdout)
        mwms_files = mwms_files or {path.name: path.read_bytes() for path in shared.iterdir() if path.is_file()}
    mwms, pss = outputs
    # Both learned the line: the chief's last epoch is far below the first (y has variance ~15).
    for output in outputs:
        losses = [float(x) for x in re.findall(r"\[chief-0\] .* epoch \d/3 ends: .*?\bloss=([0-9.]+)", output)]
        assert len(losses) == 3 and losses[-1] < 0.2 * losses[0], output[-3000:]
    # The chief alone saves; the worker ends with the same weights.
    assert not re.search(r"^\[worker-0\] .* saved", mwms, re.M), mwms[-3000:]
    fingerprints = set(re.findall(r"^\[(?:chief|worker)-0\] .* trained 3 epochs of \d+ steps; weights (\w+)", mwms, re.M))
    assert len(fingerprints) == 1, mwms[-3000:]
    assert re.search(r"^\[evaluator-0\] .* evaluator: epoch 3: .*mean_absolute_error=", pss, re.M), pss[-3000:]
    for model in ("mwms", "pss"):
        assert (tmp_path / model / "saved_model.pb").is_file()
    # The chief alone reported to tuning (trainer.launch gives each task its own metrics file).
    assert "mean_absolute_error" in mwms and "hypertune: no metric" not in mwms + pss
    # One parent directory: the PSS job found the MWMS job's checkpoints and kept its own apart,
    # and its evaluator evaluated only the PSS job's, once its chief had trained them.
    own = re.search(rf"^\[chief-0\] .*trainer: checkpoints: {shared} holds the state of another job \(.*--model-dir "
                    rf"{tmp_path}/mwms\); this job \(.*--model-dir {tmp_path}/pss\) keeps its own in ({shared}/jobs/\w+)$",
                    pss, re.M)
    assert own, pss[-3000:]
    assert {path.name: path.read_bytes() for path in shared.iterdir() if path.is_file()} == mwms_files
    assert {"epoch-3.index", "job.json"} <= set(mwms_files)
    assert re.search(rf"^\[evaluator-0\] .*evaluator: watching {own.group(1)} for epochs up to 3$", pss, re.M), pss[-3000:]
    assert pss.index("trainer: epoch 1/3 ends") < pss.index("evaluator: epoch "), pss[-3000:]
    # Whichever task left first, no task logged an error once training had ended (trainer.library.ending).
    for output in outputs:
        assert errors_after_training(output) == [], output[-4000:]


def test_the_task_lists_its_flags_with_the_runtimes(tmp_path):
    script, _ = worked_example()
    (tmp_path / "linefit.py").write_text(script)
    result = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(tmp_path / "linefit.py"), "--help"],
                            cwd=REPO, env=clean_env(PYTHONPATH="."), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--rows" in result.stdout and "--per-replica-batch-size" in result.stdout
    assert result.stdout.startswith("usage: linefit.py")
