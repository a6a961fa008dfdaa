"""The README and docs/ as a reader meets them: short enough to read, every link leading somewhere,
and every command they show accepted by the code it names.

Commands are read from fenced blocks (no language, or sh/bash/shell/console): shell line
continuations are joined, `VAR=value` prefixes and redirections dropped, and lines with an
`<angle-bracket>` placeholder skipped (a synopsis, not a command). Upper-case placeholders such as
PROJECT or BUCKET are kept: they are valid arguments, and the code must accept them as written.
- `scripts/submit_job.py ...` runs in-process through its own `main`: `vertex` and `hptune` with
  `--dry-run` added, `local` with `--print-compose` added (a JobSet rehearsal prints its JobSet
  instead), so each builds and prints its spec without credentials, network or containers, and
  every replica or pod a `--preempt` names must be one of the job's. The arguments after `--`
  parse with cassava.task's parser.
- `python -m cassava.task` and `python -m trainer.launch` parse with their real parsers; the
  project's other modules must exist, and every flag the command gives must be one their `--help`
  lists, with the required ones present; other modules must be installed (`-m pytest`: with the
  test paths it names).
- other Python scripts must exist and declare every flag the command gives (read from their
  argparse calls);
- shell scripts (`scripts/*.sh`, `scripts/supply_chain/*.sh`: any `scripts/**/*.sh`) must exist at
  the path the page gives; `scripts/supply_chain/images.sh` takes one of the subcommands and
  flavours its header documents, `test.sh -m` one of pytest's tiers, `run_local.sh` cassava.task's
  flags.
- `<!-- tested as written: PATH -->` right before a fence names a test file that exists and reads
  the page; `<!-- same as: PATH NAME -->` before a YAML block means the block equals the string
  constant NAME in PATH (so a document the docs show is one a test resolves).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import io
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from scripts.rehearsal.jobset import identity as rehearsal_identity

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250
COMMAND_LANGUAGES = ("", "sh", "bash", "shell", "console")
PYTHON = re.compile(r"(^|/)python(3(\.\d+)?)?$")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")
SHELL_OPERATORS = {">", ">>", "2>", "2>&1", "|", "&&", "||", ";", "&"}
TESTED_AS_WRITTEN = re.compile(r"<!--\s*tested as written:\s*(\S+)\s*-->")
SAME_AS = re.compile(r"<!--\s*same as:\s*(\S+)\s+(\w+)\s*-->")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
PROJECT_PACKAGES = ("trainer", "scripts", "benchmarks", "tests")
IMAGES_SH = "scripts/supply_chain/images.sh"  # the shell script whose header's usage lines are checked


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: str
    before: str  # the line right before the opening fence


@dataclasses.dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    kind: str  # "module", "script" or "shell"
    target: str  # module name or script path
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {self.text}"


def fenced_blocks(page: Path) -> list[Block]:
    blocks, lines = [], page.read_text().splitlines()
    opening = None
    for number, line in enumerate(lines, 1):
        if not line.startswith("```"):
            continue
        if opening is None:
            opening = number
        else:
            before = lines[opening - 2] if opening > 1 else ""
            blocks.append(Block(page, opening, lines[opening - 1][3:].strip(), "\n".join(lines[opening:number - 1]), before))
            opening = None
    assert opening is None, f"{page.name}:{opening}: a fence that is never closed"
    return blocks


def logical_lines(body: str):
    """(offset, line) with shell continuations joined."""
    pending, start = "", 0
    for offset, raw in enumerate(body.splitlines(), 1):
        if not pending:
            start = offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield start, pending + raw
        pending = ""
    if pending:
        yield start, pending


def command_of(page: Path, line: int, text: str) -> Command | None:
    stripped = text.strip()
    if stripped.startswith("$ "):
        stripped = stripped[2:]
    if not stripped or stripped.startswith(("#", "...")) or PLACEHOLDER.search(stripped):
        return None
    words = shlex.split(stripped, comments=True)
    for index, word in enumerate(words):
        if word in SHELL_OPERATORS or word.startswith((">", "2>")):
            words = words[:index]
            break
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    if not words:
        return None
    if PYTHON.search(words[0]) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            return Command(page, line, stripped, "module", words[2], tuple(words[3:]))
        if words[1].endswith(".py"):
            return Command(page, line, stripped, "script", words[1], tuple(words[2:]))
        return None
    if words[0] in ("bash", "sh") and len(words) > 1 and words[1].endswith(".sh"):
        return Command(page, line, stripped, "shell", words[1], tuple(words[2:]))
    if re.match(r"(\./)?scripts/", words[0]):
        return Command(page, line, stripped, "shell" if words[0].endswith(".sh") else "script", words[0], tuple(words[1:]))
    return None


def all_commands() -> list[Command]:
    commands = []
    for page in PAGES:
        for block in fenced_blocks(page):
            if block.language not in COMMAND_LANGUAGES:
                continue
            for offset, text in logical_lines(block.body):
                command = command_of(page, block.line + offset, text)
                if command is not None:
                    commands.append(command)
    return commands


COMMANDS = all_commands()


def split_at_dashes(argv) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def run_parser(parse, argv) -> str:
    """Runs an argparse-style parse; returns "" or what it said when it refused."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(list(argv))
    except SystemExit as stop:
        return f"exit {stop.code}: {err.getvalue().strip()}" if stop.code else ""
    return ""


def trainer_args_error(argv) -> str:
    from cassava.task import CassavaTask
    from trainer import fit

    return run_parser(fit.build_parser(CassavaTask(), "python -m cassava.task").parse_args, argv)


def run_submit_job(argv) -> tuple[int, str, str]:
    from scripts import submit_job

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = submit_job.main(list(argv))
    except SystemExit as stop:
        code = stop.code
    return code, out.getvalue(), err.getvalue()


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(nothing on stderr)"


@functools.lru_cache(maxsize=None)
def module_help(module: str) -> str:
    """`python -m MODULE --help`, from the module's own main in this process (argparse answers
    --help before anything heavy runs)."""
    import importlib

    from helpers import run_main

    package_main = Path(*module.split(".")) / "__main__.py"
    imported = importlib.import_module(f"{module}.__main__" if (REPO / package_main).is_file() else module)
    result = run_main(imported.main, "--help")
    assert result.returncode == 0, f"python -m {module} --help: {result.stderr.strip()[-500:]}"
    return result.stdout


def usage_options(help_text: str) -> tuple[set[str], set[str]]:
    """(every long option in a --help text, the ones its usage line does not bracket)."""
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text))
    usage = help_text.split("\n\n", 1)[0]
    required, depth = set(), 0
    for token in re.findall(r"\[|\]|--[a-z][a-z0-9-]*", usage):
        depth += {"[": 1, "]": -1}.get(token, 0)
        if token.startswith("--") and depth == 0:
            required.add(token)
    return options, required


def images_sh_usage() -> tuple[dict[str, int], set[str]]:
    """images.sh's documented subcommands (with the arguments each takes) and flavours."""
    header = (REPO / IMAGES_SH).read_text().split("set -euo", 1)[0]
    commands, flavours = {}, set()
    for match in re.finditer(rf"^#\s+{re.escape(IMAGES_SH)} (\w+) ([\w|-]+)((?: [A-Z]+)*)", header, re.M):
        commands[match.group(1)] = 1 + len(match.group(3).split())
        flavours.update(match.group(2).split("|"))
    return commands, flavours


def pytest_markers() -> set[str]:
    import tomllib

    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    return {marker.split(":")[0] for marker in markers}


# --- size and links --------------------------------------------------------------------------------

def test_the_readme_has_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference material to docs/"


def github_anchor(heading: str) -> str:
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this test's to check
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_every_docs_page_and_each_exists():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in LINK.findall(README.read_text())
              if target.startswith("docs/")}
    missing = sorted(str(p.relative_to(REPO)) for p in linked if not p.exists())
    assert not missing, f"README.md links docs pages that do not exist: {missing}"
    unlinked = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_rehearsal_page_describes_every_option_of_the_runner():
    from scripts import submit_job

    page = (DOCS / "rehearsal.md").read_text()
    options = {o for action in submit_job.build_local_parser()._actions for o in action.option_strings if o.startswith("--")}
    missing = sorted(o for o in options - {"--help"} if f"`{o}" not in page)
    assert not missing, f"docs/rehearsal.md does not describe {missing} (scripts/submit_job.py local --help)"


def test_ai_platform_is_labelled_as_the_retired_services_format_wherever_it_appears():
    unlabelled = [str(p.relative_to(REPO)) for p in PAGES
                  if "ai-platform" in p.read_text() and not ("retired" in p.read_text() and "2025-04-07" in p.read_text())]
    assert not unlabelled, f"these pages name ai-platform without saying the service was retired on 2025-04-07: {unlabelled}"


# --- the markers before blocks -----------------------------------------------------------------------

MARKED = [(page, match, i) for page in PAGES for i, match in enumerate(TESTED_AS_WRITTEN.finditer(page.read_text()))]


@pytest.mark.parametrize("page, match, _", MARKED, ids=lambda v: str(v.relative_to(REPO)) if isinstance(v, Path) else "")
def test_a_block_marked_tested_as_written_names_a_test_that_reads_it(page, match, _):
    blocks = [b for b in fenced_blocks(page) if TESTED_AS_WRITTEN.search(b.before)]
    assert match.group(0) in [b.before.strip() for b in blocks], \
        f"{page.name}: {match.group(0)} must be the line right before a fenced block"
    test_file = REPO / match.group(1)
    assert test_file.is_file() and test_file.name.startswith("test_"), f"{match.group(1)}: no such test file"
    assert page.name in test_file.read_text(), f"{match.group(1)} does not read {page.name}"


def test_the_readme_marks_its_rehearsal_block_as_tested_as_written():
    assert any(TESTED_AS_WRITTEN.search(b.before) for b in fenced_blocks(README))


SAME = [(block, SAME_AS.search(block.before)) for page in PAGES for block in fenced_blocks(page) if SAME_AS.search(block.before)]


def string_constant(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), f"{name} is not a string"
            return node.value.value
    raise AssertionError(f"{path.relative_to(REPO)} has no {name}")


@pytest.mark.parametrize("block, match", SAME, ids=lambda v: v.group(2) if isinstance(v, re.Match) else v.page.name)
def test_a_document_the_docs_show_is_the_one_a_test_resolves(block, match):
    expected = yaml.safe_load(string_constant(REPO / match.group(1), match.group(2)))
    assert yaml.safe_load(block.body) == expected, \
        f"{block.page.name}:{block.line} differs from {match.group(1)} {match.group(2)}"


def test_the_docs_show_the_hand_written_jobset_a_test_resolves():
    assert any(match.group(2).startswith("HAND_WRITTEN") for _, match in SAME)


# --- the commands ------------------------------------------------------------------------------------

def test_the_pages_show_commands_of_every_kind_this_test_checks():
    # Guards the parsing above: if it stopped finding commands, every check below would pass empty.
    found = {(c.kind, c.target) for c in COMMANDS}
    for expected in [("script", "scripts/submit_job.py"), ("module", "cassava.task"), ("module", "trainer.launch"),
                     ("module", "cassava.prepare"), ("module", "serving.predict"), ("shell", IMAGES_SH),
                     ("shell", "scripts/test.sh")]:
        assert expected in found, f"no {expected[1]} command found in the README or docs/"
    targets = {c.argv[0] for c in COMMANDS if c.target == "scripts/submit_job.py" and c.argv}
    assert {"vertex", "hptune", "jobset", "tfjob", "local"} <= targets, targets


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_the_pages_show_runs_as_written(command):
    if command.kind == "module":
        check_module(command)
    elif command.target.endswith("submit_job.py"):
        check_submit_job(command)
    elif command.kind == "shell":
        check_shell_script(command)
    else:
        check_python_script(command)


def check_module(command: Command) -> None:
    module = command.target
    argv = list(command.argv)
    if module.split(".")[0] not in PROJECT_PACKAGES:
        import importlib.util

        assert importlib.util.find_spec(module) is not None, f"{command}: {module} is not installed in this venv"
        if module == "pytest":
            paths = [a.split("::")[0] for a in argv if not a.startswith("-") and ("/" in a or a.endswith(".py"))]
            missing = [p for p in paths if not (REPO / p).exists()]
            assert not missing, f"{command}: no such test path {missing}"
        return
    path = REPO / Path(*module.split("."))
    assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), f"{command}: no module {module}"
    if module == "cassava.task":
        assert not (error := trainer_args_error(argv)), f"{command}: {error}"
    elif module == "trainer.launch":
        from trainer import launch

        own, task_command = split_at_dashes(argv)
        assert not (error := run_parser(launch.build_parser().parse_args, own)), f"{command}: {error}"
        check_task_command(command, task_command)
    elif module == "trainer.run":
        check_task_command(command, ["python", "-m", module, *argv])
    elif any(a.startswith("--") for a in argv):
        known, required = usage_options(module_help(module))
        given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        assert given <= known, f"{command}: python -m {module} has no {sorted(given - known)}"
        assert required <= given, f"{command}: python -m {module} needs {sorted(required - given)}"


def check_task_command(command: Command, words: list[str]) -> None:
    """What a task runs: `python -m cassava.task FLAGS`, a user's `python SCRIPT.py FLAGS` (the
    project's own scripts must declare the flags), or either under `python -m trainer.run --`."""
    assert words[:1] == ["python"], f"{command}: tasks run {words[:1]}, not python"
    if words[1:3] == ["-m", "trainer.run"]:
        from trainer import run

        own, inner = split_at_dashes(words[3:])
        assert not (error := run_parser(run.build_parser().parse_args, own)), f"{command}: {error}"
        assert inner, f"{command}: trainer.run runs no command"
        return check_task_command(command, inner)
    if words[1:3] == ["-m", "cassava.task"]:
        task_args = words[3:]
        assert not (error := trainer_args_error(task_args)), f"{command}: cassava.task refuses {task_args}: {error}"
        return None
    # A user's script: tests/integration/test_own_code_doc.py and test_level1_doc.py run the pages'
    # scripts as written; one of the project's must declare the flags the command gives.
    assert words[1].endswith(".py"), f"{command}: tasks run {words[1:3]}"
    if (REPO / words[1]).is_file():
        given = {a.split("=", 1)[0] for a in words[2:] if a.startswith("--")}
        unknown = given - declared_options(REPO / words[1])
        assert not unknown, f"{command}: {words[1]} declares no {sorted(unknown)}"
    return None


def declared_options(script: Path) -> set[str]:
    """The option strings a script's argparse calls declare, read from its source: its --help may
    load TensorFlow, seconds too slow for this tier."""
    options = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            options.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
    return options


def check_python_script(command: Command) -> None:
    script = REPO / command.target
    assert script.is_file(), f"{command}: {command.target} does not exist"
    given = {a.split("=", 1)[0] for a in split_at_dashes(command.argv)[0] if a.startswith("--")}
    unknown = given - declared_options(script)
    assert not unknown, f"{command}: {command.target} declares no {sorted(unknown)}"


def check_submit_job(command: Command) -> None:
    argv = list(command.argv)
    assert argv, f"{command}: no target"
    if argv[0] == "local":
        own, _ = split_at_dashes(argv[1:])
        at = next((i for i, a in enumerate(own) if a in ("vertex", "hptune", "jobset", "trainjob")), None)
        options, target = (own[:at], own[at:]) if at is not None else (own, [])
        if target[:1] == ["trainjob"] or "--trainjob" in options:
            # A TrainJob rehearsal: its options parse, its TrainJob prints, and Trainer's rules build
            # the JobSet whose pods --preempt names.
            from scripts import submit_job
            from scripts.rehearsal import jobset, trainjob

            assert not (error := run_parser(submit_job.build_local_parser().parse_args, options)), f"{command}: {error}"
            if target:
                trainer_args = split_at_dashes(argv)[1]
                code, out, err = run_submit_job([*target, *(["--", *trainer_args] if "--" in argv else [])])
                assert code == 0 and "kind: TrainJob" in out, f"{command}: exit {code}: {last_line(err)}"
                built = trainjob.to_jobset(yaml.safe_load(out), trainjob.shipped_runtimes())
                pods = {pod["hostname"] for pod in jobset.jobset_pods(built.jobset)}
                for text in submit_job.build_local_parser().parse_args(options).preempt:
                    assert jobset.parse_eviction(text).replica in pods, f"{command}: {text} names no pod of {sorted(pods)}"
                assert not (error := trainer_args_error(trainer_args)), f"{command}: cassava.task refuses {trainer_args}: {error}"
            return
        if target[:1] == ["jobset"] or "--jobset" in options:
            # A JobSet rehearsal has no compose form: its options parse, and its JobSet prints.
            from scripts import submit_job

            assert not (error := run_parser(submit_job.build_local_parser().parse_args, options)), f"{command}: {error}"
            if target:
                trainer_args = split_at_dashes(argv)[1]
                code, out, err = run_submit_job([*target, *(["--", *trainer_args] if "--" in argv else [])])
                assert code == 0 and "kind: JobSet" in out, f"{command}: exit {code}: {last_line(err)}"
                from scripts.rehearsal import jobset

                pods = {pod["hostname"] for pod in jobset.jobset_pods(yaml.safe_load(out))}
                for text in submit_job.build_local_parser().parse_args(options).preempt:
                    assert jobset.parse_eviction(text).replica in pods, f"{command}: {text} names no pod of {sorted(pods)}"
                assert not (error := trainer_args_error(trainer_args)), f"{command}: cassava.task refuses {trainer_args}: {error}"
            return
        if "--spec" in options or "--real-gcs" in options or "-h" in options or "--help" in options:
            # A spec file the page makes on the way, or credentials: the options must parse.
            from scripts import submit_job

            assert not (error := run_parser(submit_job.build_local_parser().parse_args, options)), f"{command}: {error}"
            return
        code, out, err = run_submit_job(["local", "--print-compose", *argv[1:]])
        assert code == 0 and "services:" in out, f"{command}: exit {code}: {last_line(err)}"
        # The run, not the compose file, checks what --preempt and --maintenance name: check it here.
        from scripts import submit_job
        from scripts.rehearsal import runner, vertex

        parsed = submit_job.build_local_parser().parse_args(options)
        replicas = set(yaml.safe_load(out)["services"])
        for text, kind in [*((t, vertex.SPOT) for t in parsed.preempt), *((t, vertex.MAINTENANCE) for t in parsed.maintenance)]:
            try:
                replica = vertex.parse_preemption(text, kind).replica
            except runner.RehearsalError as error:
                raise AssertionError(f"{command}: {error}") from None
            assert replica in replicas, f"{command}: {text} names no replica of {sorted(replicas)}"
        trainer_args = split_at_dashes(argv)[1]
    else:
        own, trainer_args = split_at_dashes(argv)
        if own[0] in ("vertex", "hptune") and "--dry-run" not in own:
            own.append("--dry-run")
        code, out, err = run_submit_job([*own, *(["--", *trainer_args] if "--" in argv else [])])
        assert code == 0 and out.strip(), f"{command}: exit {code}: {last_line(err)}"
        if "--self-check" in own:
            return  # the arguments after -- are the self-check's (tests/unit/test_jobspec.py checks them)
    assert not (error := trainer_args_error(trainer_args)), f"{command}: cassava.task refuses {trainer_args}: {error}"


def check_shell_script(command: Command) -> None:
    script = REPO / command.target.removeprefix("./")
    assert script.is_file(), f"{command}: {command.target} does not exist"
    argv = list(command.argv)
    if script == REPO / IMAGES_SH:
        commands, flavours = images_sh_usage()
        assert commands and flavours, f"{IMAGES_SH}'s header no longer documents its usage"
        assert argv and argv[0] in commands, f"{command}: images.sh takes {sorted(commands)}"
        assert len(argv) == 1 + commands[argv[0]] and argv[1] in flavours, \
            f"{command}: images.sh {argv[0]} takes {commands[argv[0]]} argument(s), a flavour in {sorted(flavours)} first"
    elif script.name == "test.sh":
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("-m")
        known, _ = parser.parse_known_args(argv)
        assert known.m is None or set(re.split(r"\s+(?:and|or|not)\s+|\s*not\s+", known.m)) - {""} <= pytest_markers(), \
            f"{command}: -m {known.m} is not one of {sorted(pytest_markers())}"
    elif script.name == "run_local.sh":
        assert not (error := trainer_args_error(argv)), f"{command}: {error}"


@pytest.mark.parametrize("text", ["bash scripts/images.sh build tf-runtime-cpu", "scripts/lock.sh",
                                  "bash scripts/supply_chain/images.sh build no-such-image",
                                  "bash scripts/supply_chain/images.sh frobnicate tf-runtime-cpu"])
def test_a_shell_command_at_a_stale_path_or_with_arguments_the_script_refuses_fails_the_check(text):
    command = command_of(README, 1, text)
    assert command is not None and command.kind == "shell", command
    with pytest.raises(AssertionError):
        check_shell_script(command)


SCRIPT_PATH = re.compile(r"(?<![\w/.-])(?:\./)?(scripts/[\w/.-]*[\w/])")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_scripts_path_a_page_names_exists(page):
    """In prose too, not only in commands: a moved script leaves no stale path behind."""
    missing = sorted({m.group(1) for m in SCRIPT_PATH.finditer(page.read_text()) if not (REPO / m.group(1)).exists()})
    assert not missing, f"{page.name} names {missing}, which do not exist"


# --- kubectl lines -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KubectlLine:
    page: Path
    line: int
    text: str
    jobset_command: Command | None  # the page's last `submit_job.py jobset ... > FILE` before it
    written: tuple[str, ...]  # the files the page's commands before it wrote with `>`

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {self.text}"


SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")


def kubectl_lines() -> list[KubectlLine]:
    found = []
    for page in PAGES:
        jobset_command, written = None, []
        for block in fenced_blocks(page):
            if block.language not in COMMAND_LANGUAGES:
                continue
            for offset, text in logical_lines(block.body):
                stripped = text.strip().removeprefix("$ ")
                command = command_of(page, block.line + offset, text)
                if command is not None and command.target.endswith("submit_job.py") and command.argv[:1] in (
                        ("jobset",), ("trainjob",)):
                    jobset_command = command  # a TrainJob's: the JobSet Trainer builds from it
                if command is not None and (redirect := re.search(r"(?<![0-9&])>\s*(\S+)\s*$", stripped)):
                    written.append(redirect.group(1))
                if stripped.startswith("kubectl "):
                    found.append(KubectlLine(page, block.line + offset, stripped, jobset_command, tuple(written)))
    return found


KUBECTL_LINES = kubectl_lines()


@functools.lru_cache(maxsize=None)
def jobset_of(command: Command) -> dict:
    own, trainer_args = split_at_dashes(command.argv)
    code, out, err = run_submit_job([*own, *(["--", *trainer_args] if "--" in command.argv else [])])
    assert code == 0, f"{command}: exit {code}: {last_line(err)}"
    if own[0] == "trainjob":
        from scripts.rehearsal import trainjob

        return trainjob.to_jobset(yaml.safe_load(out), trainjob.shipped_runtimes()).jobset
    return yaml.safe_load(out)


def selected_pods(selector: str, identities: list[dict]) -> list[str]:
    """The hostnames of the pods an equality-based label selector (`k=v,k=v`) picks."""
    pairs = [term.split("=", 1) for term in selector.split(",")]
    assert all(len(pair) == 2 and pair[0] for pair in pairs), f"-l {selector}: only k=v,k=v selectors are checked here"
    return [pod["hostname"] for pod in identities if all(pod["labels"].get(key) == value for key, value in pairs)]


def option_value(words: list[str], *names: str) -> str | None:
    for index, word in enumerate(words):
        for name in names:
            if word == name and index + 1 < len(words):
                return words[index + 1]
            if name.startswith("--") and word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def positionals(words: list[str], verb: str) -> list[str]:
    """kubectl's positional words (after the verb, before `--`), options and their values dropped."""
    takes_value = {"-l", "--selector", "-o", "--output", "-n", "--namespace", "-c", "--container", "--filename"}
    if verb != "logs":  # `kubectl logs -f` follows; elsewhere -f names a file
        takes_value.add("-f")
    result, skip = [], False
    for word in words:
        if word == "--":
            break
        if skip:
            skip = False
        elif word in takes_value:
            skip = True
        elif not word.startswith("-"):
            result.append(word)
    return result


def kubectl_line_errors(line: KubectlLine) -> list[str]:
    """What is wrong with one documented kubectl line, read against the JobSet its page writes."""
    errors = []
    text = line.text
    substitutions = SUBSTITUTION.findall(text)
    outer = shlex.split(SUBSTITUTION.sub("SUBSTITUTED", text), comments=True)
    verb, rest = outer[1], outer[2:]
    manifest = jobset_of(line.jobset_command) if line.jobset_command is not None else None
    identities = rehearsal_identity.pod_identities(manifest) if manifest else []
    jobs = {pod["job"] for pod in identities}
    if verb == "apply":
        target = option_value(rest, "-f", "--filename")
        if target and not re.match(r"[a-z]+://", target) and target not in line.written and not (REPO / target).exists():
            errors.append(f"applies {target}, which no command before it on the page writes and the repository lacks")
        return errors
    if manifest is None:
        return [f"kubectl {verb} names the JobSet's objects, but no `submit_job.py jobset` command comes before it on the page"]
    if verb == "get" and rest[:1] in (["jobset"], ["trainjob"]):
        names = positionals(rest, verb)[1:]
        if names != [manifest["metadata"]["name"]]:  # a TrainJob's JobSet is named as the TrainJob
            errors.append(f"gets {rest[0]} {names}, but the page's {rest[0]} is {manifest['metadata']['name']}")
    if verb in ("exec", "logs"):
        targets = positionals(rest, verb)
        selector = option_value(rest, "-l", "--selector")
        if selector is not None:
            if not selected_pods(selector, identities):
                errors.append(f"-l {selector} selects none of the pods {sorted(p['hostname'] for p in identities)}")
        elif not targets:
            errors.append(f"kubectl {verb} names no pod")
        for target in targets[:1]:
            kind, _, name = target.rpartition("/")
            if target == "SUBSTITUTED":
                for inner in substitutions:
                    words = shlex.split(inner)
                    inner_selector = option_value(words, "-l", "--selector")
                    if words[:3] != ["kubectl", "get", "pod"] or inner_selector is None or option_value(words, "-o", "--output") != "name":
                        errors.append(f"$({inner}): expected `kubectl get pod -o name -l SELECTOR`")
                        continue
                    picked = selected_pods(inner_selector, identities)
                    if len(picked) != 1:
                        errors.append(f"-l {inner_selector} selects {len(picked)} pods ({picked}); kubectl {verb} needs one")
            elif kind == "job":
                if name not in jobs:
                    errors.append(f"job/{name} is not a Job of the JobSet: {sorted(jobs)}")
            elif kind in ("", "pod", "pods", "po"):
                errors.append(f"{target} is a pod's hostname, not its name: a pod is named with 5 more random "
                              f"characters; select it by its labels, or name its Job ({sorted(jobs)})")
        if verb == "exec" and "--" in outer:
            command = outer[outer.index("--") + 1:]
            if command[:2] == ["python", "-m"] and len(command) > 2 and command[2].split(".")[0] in PROJECT_PACKAGES:
                path = REPO / Path(*command[2].split("."))
                if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
                    errors.append(f"runs python -m {command[2]}, which does not exist")
    return errors


def test_the_pages_show_kubectl_lines_this_test_checks():
    verbs = {shlex.split(SUBSTITUTION.sub("X", line.text))[1] for line in KUBECTL_LINES}
    assert {"apply", "exec", "logs", "get"} <= verbs, verbs


@pytest.mark.parametrize("line", KUBECTL_LINES, ids=str)
def test_every_kubectl_line_names_objects_the_documented_jobset_makes(line):
    errors = kubectl_line_errors(line)
    assert not errors, f"{line}: " + "; ".join(errors)


def test_a_pod_named_by_its_hostname_is_refused():
    # The line the docs used to show: the second worker's hostname, which is no pod's name.
    page_command = next(line.jobset_command for line in KUBECTL_LINES if line.jobset_command is not None)
    old = KubectlLine(README, 0, "kubectl exec cassava-worker-0-1 -- python -m trainer.cluster", page_command, ())
    assert any("hostname, not its name" in error for error in kubectl_line_errors(old))
    broad = KubectlLine(README, 0, "kubectl exec $(kubectl get pod -o name -l jobset.sigs.k8s.io/jobset-name=cassava) -- "
                                   "python -m trainer.cluster", page_command, ())
    assert any("needs one" in error for error in kubectl_line_errors(broad))
