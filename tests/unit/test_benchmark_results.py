"""benchmarks/machine.py: each benchmark's table goes to one file per machine kind, headed by the
machine, the date and the command, so that no figure is read without the CPU it was measured on.
benchmarks/rounds.py: a round whose cores changed is flagged, and ratios come from the measure
that survives."""

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


import rounds  # noqa: E402


def sample(rate: float, cores: float, images: int = 100) -> rounds.Sample:
    wall = images / rate
    return rounds.Sample(wall=wall, cpu=cores * wall, images=images, others=0.0, steal=0.0)


def test_a_round_on_half_the_cores_is_flagged_and_the_ratio_comes_from_the_clean_rounds():
    # Round 2: both configurations lost a core (a neighbour took it): half the wall rate, the same
    # CPU per image. The ratio comes from rounds 1 and 3, where nothing was flagged.
    table = {"lab": [sample(10, 2.0), sample(5, 1.0), sample(10, 2.0)],
             "mine": [sample(20, 2.0), sample(10, 1.0), sample(21, 2.0)]}
    assert rounds.flags(table["lab"]) == [False, True, False]
    assert rounds.clean_rounds(table) == [True, False, True]
    comparison = rounds.compare(table, "lab", "mine")
    assert comparison.measure == "wall" and comparison.clean_rounds == 2 and comparison.value == 2.05


def test_when_most_rounds_mix_regimes_the_ratio_comes_from_cpu_per_image():
    # The regime changes within every other round: the wall ratios of rounds 2 and 4 are 4x and
    # 1x where the work is 2x; CPU per image still says 2x.
    table = {"lab": [sample(10, 2.0), sample(5, 1.0), sample(10, 2.0), sample(10, 2.0)],
             "mine": [sample(20, 2.0), sample(20, 2.0), sample(10, 1.0), sample(10, 1.0)]}
    comparison = rounds.compare(table, "lab", "mine")
    assert comparison.clean_rounds < 2 and comparison.measure == "cpu"
    assert abs(comparison.value - 2.0) < 1e-9
    assert "CPU seconds per image" in comparison.describe()


def test_rounds_where_the_two_had_different_cores_give_no_wall_ratio():
    # Every round is steady for each configuration (nothing flagged), but the lab had one core and
    # the other two: the wall ratio would credit the cores, so it comes from CPU per image.
    table = {"lab": [sample(10, 1.0)] * 3, "mine": [sample(30, 2.0)] * 3}
    assert rounds.clean_rounds(table) == [True, True, True]
    comparison = rounds.compare(table, "lab", "mine")
    assert comparison.measure == "cpu" and comparison.clean_rounds == 0
    assert abs(comparison.value - 1.5) < 1e-9 and "same cores" in comparison.describe()


def test_a_sample_is_its_cores_and_rates():
    s = rounds.Sample(wall=2.0, cpu=3.0, images=30, others=0.5, steal=0.0)
    assert (s.rate, s.cpu_per_image, s.cores) == (15.0, 0.1, 1.5)



# --- results files are what report() writes ------------------------------------------------------------

import importlib  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

RESULTS = Path(machine.RESULTS_ROOT)
# Each benchmark's module, whose report(raw) writes a results file's body from its raw data.
REPORTERS = {"time_to_accuracy": "time_to_accuracy", "train_step": "train_step", "serving_load": "serving_load",
             "input_pipeline": "input_pipeline", "pipeline_startup": "pipeline_startup",
             "task_startup": "task_startup", "task_startup_collector": "task_startup",
             "engine_wait": "engine_wait"}
COMMITTED = sorted(str(path.relative_to(RESULTS)) for path in RESULTS.glob("*/*.md"))
WITH_RAW_DATA = [name for name in COMMITTED if (RESULTS / name).with_suffix(".json").exists()]


def rendered(saved: dict) -> str:
    """The results file a benchmark's report() writes from a saved .json."""
    benchmark = saved["heading"]["benchmark"]
    assert benchmark in REPORTERS, f"{benchmark}: no report(raw) known to render its raw data"
    module = importlib.import_module(REPORTERS[benchmark])
    return machine.results_text(saved["heading"], module.report(saved["raw"]))


def test_every_committed_results_file_has_the_raw_data_report_writes_it_from():
    # A results file without its run's raw data could hold anything; figures from machine kinds
    # not re-run since the raw data was kept live in git's history (docs/performance.md).
    assert COMMITTED, "no results committed"
    missing = [name for name in COMMITTED if name not in WITH_RAW_DATA]
    assert not missing, f"results files without the raw data (KIND.json) report() renders them from: {missing}"


@pytest.mark.parametrize("name", WITH_RAW_DATA)
def test_a_committed_results_file_is_exactly_what_report_writes_from_its_raw_data(name):
    path = RESULTS / name
    saved = json.loads(path.with_suffix(".json").read_text())
    assert rendered(saved) == path.read_text(), f"{name} is not what its benchmark's report() writes from {path.stem}.json"


def tta_run(name: str, reached, epochs, sample) -> dict:
    import time_to_accuracy

    return time_to_accuracy.run_record(time_to_accuracy.Run(
        name=name, images_per_epoch=384, epochs=epochs, reached=reached, elapsed=reached or 600.0,
        stopped="" if reached else "stopped after 2 epochs, 600 s", sample=sample))


def test_time_to_accuracys_raw_data_renders_its_results_file_again_byte_for_byte(tmp_path, monkeypatch):
    import argparse

    import time_to_accuracy

    monkeypatch.setattr(machine, "cpu_model", lambda: "AMD EPYC (family 25, model 1): avx2")
    args = argparse.Namespace(images=384, image_size=64, batch=16, workers=2, target=0.7, scratch_target=0.6)
    run = time_to_accuracy.run_of
    fine = {"lab": [run(tta_run("lab", 120.5, [(60.0, 0.4), (120.5, 0.72)], rounds.Sample(120.5, 150.0, 768, 0.0, 0.0)))],
            "trainer": [run(tta_run("trainer (mixed_bfloat16)", 58.0, [(30.0, 0.5), (58.0, 0.78)],
                                    sample(13.3, 1.8, 768)))]}
    scratch = {"lab": [run(tta_run("lab", None, [(300.0, 0.2), (600.0, 0.2)], sample(2.6, 1.2, 1536)))],
               "trainer": [run(tta_run("trainer (mixed_bfloat16)", 92.7, [(50.0, 0.48), (92.7, 0.71)],
                                       sample(16.6, 1.8, 1536)))]}
    # One traced job: the chief's marks (what, seconds, epoch, the steps' span, CPU seconds) and the
    # CPU where each later epoch's steps ended.
    phases = {"epochs": 2, "exit": 0, "wall": 60.0, "cpu": 100.0, "images_per_epoch": 384, "validation_images": 96,
              "marks": [["first line", 4.0, None, None, 6.0], ["precision", 9.0, None, None, 14.0],
                        ["begins", 12.0, 1, None, 19.0], ["ends", 30.0, 1, None, 52.0],
                        ["steps", 30.1, 1, 10.0, 52.1], ["begins", 30.2, 2, None, 52.2], ["ends", 50.0, 2, None, 88.0],
                        ["steps", 50.1, 2, 15.0, 88.1], ["saved", 55.0, None, None, 95.0]],
              "steps_end_cpu": [[2, 80.0]], "backups": [[47.0, 49.0, 84.0, 86.0]]}
    # The lab's job: no precision probe and no export; a wait between its epochs.
    lab_phases = {**phases, "wall": 50.0, "cpu": 80.0, "backups": [],
                  "marks": [["first line", 3.0, None, None, 5.0], ["begins", 10.0, 1, None, 15.0],
                            ["steps", 25.0, 1, 15.0, 40.0], ["ends", 28.0, 1, None, 44.0],
                            ["begins", 31.0, 2, None, 45.0], ["steps", 43.0, 2, 12.0, 70.0],
                            ["ends", 46.0, 2, None, 75.0]],
                  "steps_end_cpu": [[1, 40.0], [2, 70.0]]}
    raw = time_to_accuracy.raw_data(args, "weights made here", fine, scratch, {"trainer": phases, "lab": lab_phases})
    body = time_to_accuracy.report(raw)
    path = Path(machine.write_results("time_to_accuracy", "python benchmarks/time_to_accuracy.py", "2030-01-02", body,
                                      root=str(tmp_path), raw=raw))
    saved = json.loads(path.with_suffix(".json").read_text())
    assert rendered(saved) == path.read_text()
    assert "| 1 | lab | 120.5 s | 2 | 0.40 0.72 |" in path.read_text()
    # The lab had 1.24 cores and the trainer 1.8: not the same cores, so the ratio is of CPU seconds (104 over 150).
    assert body.endswith("summary: trainer_over_lab=0.69 against=lab from=cpu spread=0.69-0.69 rounds=1/1"), body
    # Epoch 2's steps ran from 30.2 s for their own 15.0 s, 27.8 CPU s; the rest of it, to 50.0 s, validated.
    assert "| epoch 2: train steps (their own span) | 15.0 | 27.8 | 1.85 | 0.0362 | 0.0724 |" in body
    # The backup at the end of epoch 2 (47-49 s, 2 CPU s) comes out of its validation window into its own row.
    assert "| epoch 2: validation and epoch-end work | 2.8 | 6.0 | 2.14 | 0.0078 | 0.0625 |" in body
    assert "| backups of the training state (1, for restarts; out of the rows above) | 2.0 | 2.0 | 1.00 | 0.0026 | - |" in body
    assert "| whole job | 60.0 | 100.0 | 1.67 | 0.1302 | |" in body
    # The lab's epoch 2 began 3 s after epoch 1 ended (1 CPU s), stepped 12 s (25 CPU s), validated 3 s (5 CPU s).
    lab_section = body.split("### The lab")[1]
    assert "| epoch 2: between one epoch's end and the next's start | 3.0 | 1.0 | 0.33 | 0.0013 | - |" in lab_section
    assert "| epoch 2: train steps (their own span) | 12.0 | 25.0 | 2.08 | 0.0326 | 0.0651 |" in lab_section
    assert "| epoch 2: validation and epoch-end work | 3.0 | 5.0 | 1.67 | 0.0065 | 0.0521 |" in lab_section
    assert ("CPU seconds per image, the trainer's against the lab's: the whole job 0.1302 against 0.1042 (x1.25); the "
            "later epochs' train steps 0.0724 against 0.0651 (x1.11); their validation, per validation image 0.0625 "
            "against 0.0521 (x1.20).") in body
    # A later run without raw data leaves no stale .json behind to disagree with its .md.
    machine.write_results("time_to_accuracy", "python benchmarks/time_to_accuracy.py", "2030-01-03", body, root=str(tmp_path))
    assert not path.with_suffix(".json").exists()


def tta(reached, cores: float, cpu: float | None = None):
    import time_to_accuracy

    wall = reached or 400.0
    return time_to_accuracy.Run("x", 768, [(wall, 0.72 if reached else 0.2)], reached, wall, "",
                                rounds.Sample(wall, cpu if cpu is not None else cores * wall, 768, 0.0, 0.0))


def test_time_to_accuracy_compares_the_trainer_with_the_fastest_lab_variant_that_reaches_the_target():
    import time_to_accuracy

    recipes = {"lab": [tta(None, 1.8)] * 3,
               "lab-preprocessed": [tta(130.0, 1.8), tta(120.0, 1.8), tta(140.0, 1.8)],
               "trainer": [tta(42.0, 1.8), tta(48.0, 1.8), tta(40.0, 1.8)]}
    assert time_to_accuracy.best_lab(recipes) == "lab-preprocessed"
    result = time_to_accuracy.verdict(recipes["lab-preprocessed"], recipes["trainer"], 0.7)
    assert result.measure == "wall" and not result.bound and result.rounds == "3/3"
    assert abs(result.value - 42.0 / 130.0) < 1e-9 and result.spread == (40.0 / 140.0, 48.0 / 120.0)
    # A round where the lab's run got one core (the trainer two) is left out of the wall ratio;
    # with two of three left, the ratio comes from CPU seconds to the target instead.
    recipes["lab-preprocessed"][1] = tta(220.0, 0.9)
    recipes["lab-preprocessed"][2] = tta(240.0, 0.95)
    result = time_to_accuracy.verdict(recipes["lab-preprocessed"], recipes["trainer"], 0.7)
    assert result.measure == "cpu" and "CPU seconds" in result.text
    # No lab variant reaches the target: the trainer's time is over their limit, and says so.
    none = {"lab": [tta(None, 1.8)] * 2, "lab-preprocessed": [tta(None, 1.8)] * 2, "trainer": [tta(42.0, 1.8)] * 2}
    assert time_to_accuracy.best_lab(none) is None
    assert time_to_accuracy.verdict(none["lab"], none["trainer"], 0.7).bound


def serving_level(concurrency: int, images_per_s: float, others: float) -> dict:
    return {"concurrency": concurrency, "requests": int(images_per_s * 30), "errors": [], "requests_per_s": images_per_s,
            "images_per_s": images_per_s, "p50_ms": 54.0, "p99_ms": 60.0, "server_cpu_per_request": 0.08,
            "clients_cpu_per_request": 0.002, "server_cores": 1.5, "others": others, "load_average": 1.2}


def test_serving_loads_raw_data_renders_its_results_file_and_leaves_rows_taken_beside_others_out(tmp_path, monkeypatch):
    import serving_load

    monkeypatch.setattr(machine, "cpu_model", lambda: "AMD EPYC (family 25, model 1): avx2")
    ceiling = {"images_per_s": 24.0, "cpu_per_image": 0.08, "others": 0.01, "load_average": 0.3}
    raw = {"architecture": "resnet50", "image_size": 300, "tensorflow": "2.21.0", "instances": 1, "seconds": 30.0,
           "soak_seconds": 60.0, "max_batch": 32, "rss_growth_mb": 64.0, "cpus": 2, "load_before": 0.3, "load_after": 2.1,
           # The ceiling after concurrency 8 ran beside a neighbour: concurrency 8 and 32 are both around it.
           "ceilings": [ceiling, ceiling, {**ceiling, "others": 0.9}, ceiling],
           "levels": [serving_level(1, 18.0, 0.02), serving_level(8, 15.6, 0.05), serving_level(32, 18.4, 0.01)],
           "batches": [{"batch": 1, "images_per_s": 15.0, "cpu_per_image": 0.1, "others": 0.0, "load_average": 0.3}],
           "batch_seconds": 7.5, "decoding_cpu_per_request": 0.0011,
           "soak": {**serving_level(32, 18.0, 0.0), "error_count": 0}, "rss": [[1.0, 2 ** 29], [10.0, 2 ** 30], [60.0, 2 ** 30 + 2 ** 20]]}
    assert serving_load.flagged(raw) == [False, True, True]
    body = serving_load.report(raw)
    assert body.endswith("`summary: c1_over_ceiling=0.75 left_out=c8,c32 soak_errors=0 soak_rss_growth_mb=1.0`")
    assert "| server, concurrency 8 | 15.60 | 15.60 | 54 | 60 | 0 | 24.00 | x0.65 | 80.0 | 2.0 | 1.50 | 0.05 | 1.2 | yes |" in body
    path = Path(machine.write_results("serving_load", "python benchmarks/serving_load.py", "2030-01-02", body,
                                      root=str(tmp_path), raw=raw))
    assert rendered(json.loads(path.with_suffix(".json").read_text())) == path.read_text()


# --- a baseline without its Keras ------------------------------------------------------------------

# Flags each benchmark refuses right after the check: were the check missing, main() would return
# 2 with its own line and the test fail on the message, without measuring anything.
REFUSED_NEXT = {"train_step": ["--steps", "0"], "time_to_accuracy": ["--rounds", "0"], "pretrain": ["--steps", "1"]}


@pytest.mark.parametrize("benchmark", sorted(REFUSED_NEXT))
def test_a_benchmark_whose_baseline_needs_tf_keras_exits_2_in_one_line_where_it_is_missing(benchmark, monkeypatch,
                                                                                             capsys):
    # TensorFlow 2.22.0rc0 has no tf-keras: the benchmark says so before it measures anything.
    import importlib.util

    module = importlib.import_module(benchmark)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "tf_keras" else real_find_spec(name, *rest))
    with pytest.raises(SystemExit) as stopped:
        module.main(REFUSED_NEXT[benchmark])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "tf-keras" in err, err
