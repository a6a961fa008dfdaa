"""tests/cpu_use.py, on a /proc written into a folder: the kinds, the CPU each is given between two
samples, the machine's busy time, and the summary's lines."""

from __future__ import annotations

from pathlib import Path

import cpu_use


def write_process(proc: Path, pid: int, argv: list[str], ticks: tuple[int, int], start: int = 100,
                  name: str = "x") -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cmdline").write_bytes(b"".join(word.encode() + b"\0" for word in argv))
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime ...
    fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(ticks[0]), str(ticks[1]),
              "0", "0", "20", "0", "1", "0", str(start), "0"]
    replace(folder / "stat", f"{pid} ({name}) " + " ".join(fields) + "\n")


def write_machine(proc: Path, busy: int, idle: int) -> None:
    # cpu user nice system idle iowait irq softirq
    proc.mkdir(parents=True, exist_ok=True)
    replace(proc / "stat", f"cpu  {busy} 0 0 {idle} 0 0 0\ncpu0 0 0 0 0 0 0 0\n")


def replace(path: Path, text: str) -> None:
    """Whole or not at all, as the kernel's files read: the sampler's thread may read it meanwhile."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    staged.replace(path)


def test_a_command_line_is_counted_as_its_program_its_module_or_its_script():
    assert cpu_use.kind_of(["/repo/.venv/bin/python", "-m", "cassava.task", "--epochs", "1"]) == "python -m cassava.task"
    assert cpu_use.kind_of(["python3", "-u", "/tmp/x/benchmarks/train_step.py", "--steps", "1"]) == \
        "python benchmarks/train_step.py"
    assert cpu_use.kind_of(["python", "-c", "import tensorflow as tf\nprint(tf.__version__)"]) == \
        "python -c import tensorflow as tf"
    assert cpu_use.kind_of(["/repo/.venv/bin/python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == \
        "python -m pytest"
    assert cpu_use.kind_of([".venv/bin/python", "-m", "pytest", "-n", "auto"]) == "python -m pytest"
    assert cpu_use.kind_of(["podman", "--log-level", "warning", "system", "service", "--time=0", "unix:///s"]) == \
        "podman system service"
    assert cpu_use.kind_of(["/usr/bin/podman", "build", "-f", "Dockerfile.cpu", "-t", "run:test", "."]) == "podman build"
    assert cpu_use.kind_of(["/usr/local/bin/docker-registry", "serve", "config.yml"]) == "docker-registry"
    assert cpu_use.kind_of([]) == "kernel threads"


def test_each_kind_gets_the_cpu_its_processes_used_between_samples_and_nothing_from_before(tmp_path):
    proc = tmp_path / "proc"
    write_process(proc, 10, ["python", "-m", "cassava.task"], (500, 100))  # ran before the first sample
    write_process(proc, 11, ["podman", "push", "image"], (50, 50))
    tally = cpu_use.Tally(proc)
    tally.add(cpu_use.read_snapshot(proc))
    assert tally.ticks == {}  # the baseline

    write_process(proc, 10, ["python", "-m", "cassava.task"], (530, 110))  # 40 more
    write_process(proc, 11, ["podman", "push", "image"], (50, 50))  # none more
    write_process(proc, 12, ["python", "-m", "cassava.task"], (20, 5))  # new: all of its 25
    tally.add(cpu_use.read_snapshot(proc))
    assert tally.ticks == {"python -m cassava.task": 65}

    # pid 11 ended and its number went to a new process: counted from zero as what it is now.
    write_process(proc, 11, ["/usr/bin/buildah", "commit"], (7, 3), start=900)
    tally.add(cpu_use.read_snapshot(proc))
    assert tally.ticks == {"python -m cassava.task": 65, "buildah commit": 10}
    # Processes by kind: the ones that used CPU while sampled (pid 11's push used none).
    assert tally.processes == {"python -m cassava.task": 2, "buildah commit": 1}


def test_a_process_that_ends_between_reading_the_list_and_its_files_is_left_out(tmp_path):
    proc = tmp_path / "proc"
    write_process(proc, 10, ["python", "-m", "cassava.task"], (5, 5))
    (proc / "20").mkdir()  # listed, but its stat is gone
    (proc / "30").mkdir()
    (proc / "30" / "stat").write_text("30 (cut")  # cut short
    (proc / "self").mkdir()
    assert cpu_use.read_snapshot(proc) == {10: (100, 10)}


def test_the_summary_gives_each_kinds_minutes_and_share_then_what_the_samples_hold_of_the_busy_time(tmp_path):
    ticks = {f"kind {index}": 600 * (index + 1) for index in range(cpu_use.SHOWN + 2)}
    lines = cpu_use.summary(ticks, 100, busy_start=(1_000, 10_000), busy_end=(1_000 + 200_000, 10_000 + 240_000),
                            cores=2)
    sampled = sum(ticks.values())
    top = f"kind {cpu_use.SHOWN + 1}"
    assert lines[0] == f"{ticks[top] / 6000:8.1f} CPU-min  {ticks[top] / sampled:4.0%}  {top}"
    assert len(lines) == cpu_use.SHOWN + 2
    counted = cpu_use.summary(ticks, 100, (1_000, 10_000), (201_000, 250_000), 2, processes={top: 4})
    assert counted[0] == lines[0] + f"  (4 processes, {ticks[top] / 100 / 4:.1f} CPU s each)"
    assert counted[1:] == lines[1:]  # a kind with no count says none
    assert lines[-2].endswith("  2 other kinds")  # kind 0 and kind 1, the two least
    assert lines[-1].startswith(f"sampled {sampled / 6000:.1f} CPU-min; the machine was busy 33.3 CPU-min of 40.0 "
                                f"(83% of 2 cores), so the samples hold {sampled / 200_000:.0%} of it")


def test_the_sampler_counts_what_runs_while_it_samples(tmp_path):
    proc = tmp_path / "proc"
    write_machine(proc, busy=1_000, idle=1_000)
    write_process(proc, 10, ["python", "-m", "cassava.task"], (10, 0))
    sampler = cpu_use.Sampler(proc, period=0.01).start()
    write_process(proc, 10, ["python", "-m", "cassava.task"], (70, 10))
    write_machine(proc, busy=1_090, idle=1_010)
    sampler.stop()
    assert sampler.tally.ticks == {"python -m cassava.task": 70}
    assert "the machine was busy" in sampler.lines()[-1] and "(90% of" in sampler.lines()[-1]


def test_a_machine_without_proc_is_not_sampled(tmp_path):
    assert not cpu_use.available(tmp_path / "proc")
    write_machine(tmp_path / "proc", busy=1, idle=1)
    assert cpu_use.available(tmp_path / "proc")
