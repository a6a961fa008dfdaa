"""The prediction server's layout, held by the code itself: serving/ imports nothing of the runtime
(trainer/) or of any example, since the prediction image carries serving/ alone; the code outside
it uses only the public names serving/__init__.py lists; and those exist, typed and documented."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# The project's own code that may use the server (tests are free to reach its insides).
USERS = ("scripts", "benchmarks", "trainer", "cassava", "examples")


def public_names() -> dict[str, set[str]]:
    """serving/__init__.py's table: module -> names."""
    doc = ast.get_docstring(ast.parse((REPO / "serving" / "__init__.py").read_text()))
    table = {}
    for module, names in re.findall(r"^\| (serving\.\w+)\s*\| (.+?)\s*\|$", doc, re.M):
        names = re.sub(r";.*", "", names)
        table[module.split(".")[1]] = {name.strip() for name in names.split(",")}
    return table


def serving_uses(path: Path) -> list[tuple[str, str | None, int]]:
    """(serving module, name used from it or None for the module itself, line) for every use in a file."""
    tree = ast.parse(path.read_text())
    uses, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "serving":
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
                uses.append((alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("serving."):
            for alias in node.names:
                uses.append((node.module.split(".")[1], alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("serving."):
                    uses.append((alias.name.split(".")[1], None, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            uses.append((aliases[node.value.id], node.attr, node.lineno))
    return uses


def private_uses(path: Path) -> list[str]:
    public = public_names()
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    return [f"{shown}:{line} serving.{module}{'.' + name if name else ''}"
            for module, name, line in sorted(serving_uses(path), key=lambda use: use[2])
            if module not in public or (name is not None and name not in public[module])]


def test_serving_imports_nothing_of_the_runtime_or_the_examples():
    offenders = []
    for path in sorted((REPO / "serving").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name}:{node.lineno} {m}" for m in modules
                          if m.split(".")[0] in ("trainer", "cassava", "fares", "examples", "scripts")]
    assert offenders == []


def test_the_projects_code_uses_only_the_servers_public_names():
    paths = [path for folder in USERS for path in sorted((REPO / folder).rglob("*.py"))]
    assert any(serving_uses(path) for path in paths), "no use of serving/ found: this check reads nothing"
    assert [offender for path in paths for offender in private_uses(path)] == []


def test_the_check_sees_a_private_name(tmp_path):
    """The check above can fail: a script reaching into serving.predictor.call_size is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text("from serving import predictor, model\npredictor.call_size\nmodel.load\n"
                     "from serving.images import pixels\n")
    assert private_uses(probe) == ["probe.py:2 serving.predictor.call_size", "probe.py:4 serving.images.pixels"]


def test_the_public_names_exist_and_are_typed_and_documented():
    missing, undocumented, untyped = [], [], []
    table = public_names()
    assert set(table) >= {"server", "predict", "model", "instances", "answers", "predictor"}
    for module_name, names in table.items():
        module = importlib.import_module(f"serving.{module_name}")
        for name in names:
            if not hasattr(module, name):
                missing.append(f"serving.{module_name}.{name}")
                continue
            value = getattr(module, name)
            if (inspect.isfunction(value) or inspect.isclass(value)) and not inspect.getdoc(value):
                undocumented.append(f"serving.{module_name}.{name}")
            if inspect.isfunction(value):
                signature = inspect.signature(value)
                if signature.return_annotation is inspect.Signature.empty or any(
                        p.annotation is inspect.Parameter.empty for p in signature.parameters.values()):
                    untyped.append(f"serving.{module_name}.{name}")
    assert (missing, undocumented, untyped) == ([], [], [])
