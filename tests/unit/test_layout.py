"""The layout issue 39 asks for, held by the code itself: the runtime (trainer/) imports nothing
from the examples or the prediction server; the cassava example reaches the runtime only through
its public names, the ones trainer/__init__.py lists; and those are typed and documented."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def public_names() -> dict[str, set[str]]:
    """trainer/__init__.py's table: module -> names."""
    doc = ast.get_docstring(ast.parse((REPO / "trainer" / "__init__.py").read_text()))
    table = {}
    for module, names in re.findall(r"^\| (trainer\.\w+)\s*\| (.+?)\s*\|$", doc, re.M):
        names = re.sub(r"\(.*?\)|;.*", "", names)
        table[module.split(".")[1]] = {name.strip() for name in names.split(",")}
    return table


def trainer_uses(path: Path) -> list[tuple[str, str | None, int]]:
    """(trainer module, name used from it or None for the module itself, line) for every use in a file."""
    tree = ast.parse(path.read_text())
    uses, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "trainer":
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer."):
            for alias in node.names:
                uses.append((node.module.split(".")[1], alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainer."):
                    uses.append((alias.name.split(".")[1], None, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            uses.append((aliases[node.value.id], node.attr, node.lineno))
    return uses


def test_the_runtime_imports_nothing_from_the_examples_or_the_server():
    offenders = []
    for path in sorted((REPO / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {m}" for m in modules
                          if m.split(".")[0] in ("cassava", "serving", "fares", "examples")]
    assert offenders == []


@pytest.mark.parametrize("path", sorted((REPO / "cassava").glob("*.py")), ids=lambda p: p.name)
def test_cassava_uses_only_the_runtimes_public_names(path):
    public = public_names()
    private = [f"{path.name}:{line} trainer.{module}{'.' + name if name else ''}"
               for module, name, line in trainer_uses(path)
               if module not in public or (name is not None and name not in public[module])]
    assert private == []


def test_the_check_sees_a_private_name(tmp_path):
    """The check above can fail: a module reaching into trainer.sync is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text("from trainer import sync, tasks\nsync.run\ntasks.Task\nfrom trainer.plan import make_run\n")
    public = public_names()
    private = [(m, n) for m, n, _ in trainer_uses(probe) if m not in public or (n is not None and n not in public[m])]
    assert ("sync", "run") in private and ("plan", "make_run") in private and ("tasks", "Task") not in private


def test_the_public_names_are_typed_and_documented():
    import importlib

    undocumented, untyped = [], []
    for module_name, names in public_names().items():
        module = importlib.import_module(f"trainer.{module_name}")
        for name in names:
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                if not inspect.getdoc(value):
                    undocumented.append(f"trainer.{module_name}.{name}")
            if inspect.isfunction(value):
                signature = inspect.signature(value)
                if signature.return_annotation is inspect.Signature.empty or any(
                        p.annotation is inspect.Parameter.empty for p in signature.parameters.values()):
                    untyped.append(f"trainer.{module_name}.{name}")
            if inspect.isclass(value) and issubclass(value, object) and name == "Task":
                for method_name, method in vars(value).items():
                    if inspect.isfunction(method) and not method_name.startswith("_"):
                        if not inspect.getdoc(method):
                            undocumented.append(f"Task.{method_name}")
                        if any(p.annotation is inspect.Parameter.empty
                               for p in list(inspect.signature(method).parameters.values())[1:]):
                            untyped.append(f"Task.{method_name}")
    assert undocumented == [] and untyped == []


def test_a_task_sets_the_defaults_of_the_flags_that_depend_on_its_model():
    """--hypertune-metric, --learning-rate and --mixed-precision default to the task's own."""
    import sys

    from cassava.task import CassavaTask
    from trainer.runtime import config
    from trainer.cluster import resolve

    sys.path.insert(0, str(REPO / "examples" / "fares"))
    try:
        from fares.task import FaresTask
    finally:
        sys.path.remove(str(REPO / "examples" / "fares"))
    cassava = config.parse([], {}, resolve({}), CassavaTask())
    fares = config.parse(["--train-files", "x.csv"], {}, resolve({}), FaresTask())
    assert (cassava.hypertune_metric, cassava.mixed_precision) == ("accuracy", "auto")
    # No opt-out for a small dense model: auto times the task's own model (trainer.precision).
    assert (fares.hypertune_metric, fares.mixed_precision) == ("mae", "auto")
    pinned = config.parse(["--train-files", "x.csv", "--mixed-precision", "bfloat16"], {}, resolve({}), FaresTask())
    assert pinned.mixed_precision == "bfloat16"


def runtime_imports() -> dict[str, set[str]]:
    """trainer's modules -> the trainer modules each imports, anywhere in it (inside functions too)."""
    modules = {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path
               for path in (REPO / "trainer").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                imported.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                                for alias in node.names)
        graph[module] = {name for name in imported if name in modules and name != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk (each once, from where the walk met it)."""
    found, state = [], {}

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                found.append(path[path.index(imported):] + [imported])
            elif imported not in state:
                walk(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    return found


def test_no_module_of_the_runtime_imports_itself_back_through_others():
    assert circles(runtime_imports()) == []


def test_the_circle_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_loop_imports_only_keras_and_tensorflow():
    """trainer/library/loop.py can be copied into a project of its own, as docs/keras.md offers."""
    tree = ast.parse((REPO / "trainer" / "library" / "loop.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in imported} <= {"__future__", "typing", "keras", "tensorflow"}, imported


def test_the_runtime_names_no_example_in_its_words():
    """trainer/ is for any model: its docstrings, comments and messages name none of the examples."""
    named = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "trainer").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b(cassava|fares|reviews)\b", line, re.I)]
    assert named == []


def test_the_top_level_modules_are_the_shared_parts_the_public_names_and_the_commands():
    """Everything else lives in the sub-package of its job (trainer/__init__.py says which)."""
    top = {path.stem for path in (REPO / "trainer").glob("*.py")} - {"__init__"}
    shared = {"tasks", "cluster", "exits", "cli", "outputs", "precision"}
    commands = {"run", "launch", "selfcheck", "gpu_stack"}
    assert top == shared | set(public_names()) | commands
