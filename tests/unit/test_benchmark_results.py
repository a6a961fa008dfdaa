"""benchmarks/machine.py: each benchmark's table goes to one file per machine kind, headed by the
machine, the date and the command, so that no figure is read without the CPU it was measured on."""

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import machine  # noqa: E402


def test_kind_slug_names_the_cpu_family_model_and_vector_extensions():
    assert machine.kind_slug("AMD EPYC (family 26, model 2): avx2 avx512f avx512_bf16") == \
        "amd-epyc-family-26-model-2-avx2-avx512f-avx512-bf16"
    assert machine.kind_slug("Intel(R) Xeon(R) CPU @ 2.20GHz (family 6, model 85): avx2 avx512f") == \
        "intel-r-xeon-r-2-20ghz-family-6-model-85-avx2-avx512f"
    assert machine.kind_slug("AMD EPYC 7B13 64-Core Processor (family 25, model 1): avx2") == \
        "amd-epyc-7b13-family-25-model-1-avx2"


def test_write_results_replaces_this_kinds_file_with_heading_date_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cpu_model", lambda: "AMD EPYC (family 25, model 1): avx2")
    first = machine.write_results("input_pipeline", "python benchmarks/input_pipeline.py --quick", "2030-01-02",
                                  "| a |\n|---|\n| 1 |\n", root=str(tmp_path))
    assert first == str(tmp_path / "input_pipeline" / "amd-epyc-family-25-model-1-avx2.md")
    lines = open(first).read().splitlines()
    assert lines[0] == "# input_pipeline on AMD EPYC (family 25, model 1): avx2"
    assert lines[2].startswith("2030-01-02, `python benchmarks/input_pipeline.py --quick`, ")
    assert lines[4:] == ["| a |", "|---|", "| 1 |"]
    # A later run on the same kind replaces the file; another kind gets its own.
    machine.write_results("input_pipeline", "python benchmarks/input_pipeline.py", "2030-01-03", "x", root=str(tmp_path))
    assert open(first).read().splitlines()[2].startswith("2030-01-03, `python benchmarks/input_pipeline.py`, ")
    monkeypatch.setattr(machine, "cpu_model", lambda: "AMD EPYC (family 26, model 2): avx2 avx512f avx512_bf16")
    machine.write_results("input_pipeline", "python benchmarks/input_pipeline.py", "2030-01-03", "y", root=str(tmp_path))
    assert len(list((tmp_path / "input_pipeline").iterdir())) == 2


@pytest.mark.parametrize("argv, expected", [
    (["--quick"], "python benchmarks/input_pipeline.py --quick"),
    (["--data-dir", "/tmp/a b"], "python benchmarks/input_pipeline.py --data-dir '/tmp/a b'"),
    ([], "python benchmarks/input_pipeline.py"),
])
def test_command_line_is_the_command_as_run(argv, expected):
    assert machine.command_line("input_pipeline.py", argv) == expected
