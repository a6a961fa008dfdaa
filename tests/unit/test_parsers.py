"""Every command of the project answers a bad flag with one line (trainer/cli.py, serving/flags.py):
no parser is a plain argparse.ArgumentParser, whose usage block would bury the error."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# The project's own commands. examples/ is left out: a level-1 script is the user's, unchanged.
FOLDERS = ("trainer", "serving", "cassava", "scripts", "benchmarks", "examples/fares")
# The supply chain's stand-alone scripts, which Cloud Build and the image builds run with the
# builder's python and nothing of the project on its path: not converted in this change (the
# images work owns them). Each must still be what this says, so the list cannot go stale.
PLAIN_ARGPARSE: set[str] = set()


def plain_parsers(path: Path) -> list[int]:
    """Lines where `path` makes an argparse.ArgumentParser (or calls ArgumentParser by that name)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else called.id if isinstance(called, ast.Name) else ""
            if name == "ArgumentParser":
                lines.append(node.lineno)
    return lines


def test_no_command_makes_a_plain_argument_parser():
    offenders, plain = [], set()
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            found = plain_parsers(path)
            if relative in PLAIN_ARGPARSE:
                if found:
                    plain.add(relative)
                continue
            offenders += [f"{relative}:{line}" for line in found]
    assert offenders == []
    assert plain == PLAIN_ARGPARSE  # the exceptions are still exceptions


def test_the_check_sees_a_plain_parser(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import argparse\nfrom argparse import ArgumentParser\nargparse.ArgumentParser()\nArgumentParser()\n"
                     "from trainer import cli\ncli.OneLineParser()\n")
    assert plain_parsers(probe) == [3, 4]
