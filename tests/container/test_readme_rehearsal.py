"""The README's rehearsal command, run exactly as written, in a user's shell.

The README marks the block with `<!-- tested as written: tests/container/test_readme_rehearsal.py -->`.
It runs in a copy of the project's layout (the real scripts, trainer and .venv, linked), with an
environment that has none of the engine's settings: the command must find them itself, as it does
for a user. The image it names is what `bash scripts/supply_chain/images.sh build cassava-trainer-cpu` tags; here the
tests' cassava CPU image gets that tag for the run, and whatever held it before gets it back.
"""

from __future__ import annotations

import re

from containers import leftovers, run_as_written
from helpers import REPO
from test_vertex_rehearsal import lines, summary

MARKER = "<!-- tested as written: tests/container/test_readme_rehearsal.py -->"


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    assert MARKER in text, "README.md no longer marks its rehearsal command"
    block = re.match(r"\s*```[a-z]*\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block, "the marker must come right before a fenced block"
    return block.group(1)


def test_the_readme_rehearsal_runs_as_written(engine, cpu_image, tmp_path):
    command = readme_block()
    names = set(re.findall(r"localhost/[\w./-]+:[\w.-]+", command))
    assert len(names) == 1, f"the README's rehearsal should name one local image, not {names}"
    readme_image = names.pop()
    for name in ("scripts", "trainer", ".venv", "requirements", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO / name)
    result = run_as_written(engine, cpu_image, readme_image, command, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert not result.stderr.strip(), result.stderr[-2000:]
    # What the README says the run shows: a preempted worker, the whole job back, and the model saved.
    assert any("preempting (Spot VM) workerpool1-0" in line for line in lines(result.stdout, "local-run", "WARNING")), result.stdout[-3000:]
    codes = summary(result.stdout)
    assert codes["workerpool1-0"][1] >= 1 and codes["workerpool0-0"][0][-1] == 0, codes
    kept = tmp_path / "output" / "rehearsal" / "my-bucket" / "runs" / "1" / "model"
    assert (kept / "saved_model.pb").is_file(), sorted(p.name for p in kept.parent.glob("*"))
    assert leftovers(engine) == []
