"""The fares example's data: its generator, its CSV checks and its input pipeline's sharding."""

from __future__ import annotations

import argparse
import re
import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "examples" / "fares"))

from fares import data, generate  # noqa: E402
from fares import task as fares_task  # noqa: E402
from trainer.tasks import DataError  # noqa: E402

HEADER = ",".join(data.COLUMNS)


def test_the_generator_writes_the_same_files_for_the_same_seed_and_others_for_another(tmp_path):
    first = generate.generate(str(tmp_path / "a"), files=3, rows=50, eval_rows=10, seed=7)
    again = generate.generate(str(tmp_path / "b"), files=3, rows=50, eval_rows=10, seed=7)
    other = generate.generate(str(tmp_path / "c"), files=3, rows=50, eval_rows=10, seed=8)
    assert first == again == other == {"train-00000-of-00003.csv": 17, "train-00001-of-00003.csv": 17,
                                       "train-00002-of-00003.csv": 16, "eval-00000-of-00001.csv": 10}
    for name in first:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    assert (tmp_path / "a" / "_SUCCESS").read_text().splitlines()[0] == "train-00000-of-00003.csv 17"


def test_generated_fares_follow_the_meter_within_the_noise(tmp_path):
    generate.generate(str(tmp_path), files=1, rows=400, eval_rows=1, seed=0)
    lines = (tmp_path / "train-00000-of-00001.csv").read_text().splitlines()
    assert lines[0] == HEADER
    trips = [data.parse_row(line.split(","), f"line {n}") for n, line in enumerate(lines[1:], 2)]
    errors = [t.fare - generate.fare(t.distance_km, t.passengers, t.hour, t.payment_type, t.pickup_zone) for t in trips]
    assert abs(sum(errors) / len(errors)) < 0.3  # noise around the meter, not a bias
    spread = max(t.fare for t in trips) - min(t.fare for t in trips)
    assert spread > 20 * generate.NOISE  # the features explain far more than the noise


def test_a_row_parses_into_its_typed_columns():
    trip = data.parse_row(["6.827", "2", "23", "app", "airport", "31.5"], "f.csv:2")
    assert trip == data.Trip(6.827, 2, 23, "app", "airport", 31.5)


@pytest.mark.parametrize("fields, message", [
    (["6.8", "two", "23", "app", "airport", "31.5"], "f.csv:2: invalid literal for int() with base 10: 'two'"),
    (["6.8", "2", "24", "app", "airport", "31.5"], "f.csv:2: hour must be 0-23, got 24"),
    (["6.8", "2", "3", "bitcoin", "airport", "31.5"], "f.csv:2: payment_type 'bitcoin' is not one of card, cash, app"),
    (["6.8", "2", "3", "app", "airport"], "f.csv:2: expected 6 fields (distance_km,passengers,hour,payment_type,"
                                          "pickup_zone,fare), got 5"),
    (["nan", "2", "3", "app", "airport", "1"], "f.csv:2: distance_km is nan"),
])
def test_a_bad_row_is_one_line_naming_file_and_line(fields, message):
    with pytest.raises(DataError) as raised:
        data.parse_row(fields, "f.csv:2")
    assert str(raised.value) == message


def test_a_bad_header_is_a_data_error_naming_the_file():
    with pytest.raises(DataError) as raised:
        data.summarize_lines([("gs://b/train.csv", ["distance,passengers,fare", "1,1,1"])])
    assert str(raised.value) == f"gs://b/train.csv:1: the header is distance,passengers,fare; expected {HEADER}"


def test_an_empty_file_is_a_data_error():
    with pytest.raises(DataError, match=r"^x.csv: the file is empty; expected the header "):
        data.summarize_lines([("x.csv", [])])


def test_the_summary_counts_rows_and_measures_the_columns():
    rows, means, variances = data.summarize_lines([
        ("a.csv", [HEADER, "1.0,1,0,card,downtown,5.0", ""]),
        ("b.csv", [HEADER, "3.0,3,12,cash,airport,15.0"]),
    ])
    assert rows == 2
    assert means == {"distance_km": 2.0, "passengers": 2.0, "fare": 10.0}
    assert variances == {"distance_km": 1.0, "passengers": 1.0, "fare": 25.0}


def test_hidden_units_flag():
    assert fares_task.hidden_units("64,32") == (64, 32)
    for bad in ("64,0", "64,x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            fares_task.hidden_units(bad)


@pytest.mark.parametrize("text, error", [("1", "must be at least 0 and below 1, got 1"), ("-0.1", "got -0.1"),
                                         ("nan", "got nan"), ("x", "expected a number, got 'x'")])
def test_a_fraction_flag_is_at_least_0_and_below_1(text, error):
    """The one [0, 1) check: fares' --dropout and cassava's --batch-norm-momentum."""
    from trainer import cli

    assert cli.fraction("0") == 0.0 and cli.fraction("0.99") == 0.99
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(error)):
        cli.fraction(text)


def _lines_read(files, pipelines: int) -> list[list[bytes]]:
    import tensorflow as tf

    read = []
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index)
        read.append(list(data.lines_of(files, context, shuffle_files=False, seed=None).as_numpy_iterator()))
    return read


@pytest.mark.parametrize("files, pipelines", [(1, 2), (3, 2), (2, 3)])
def test_each_input_pipeline_reads_its_own_share_of_the_rows(tmp_path, files, pipelines):
    """By file when there are enough files, else by line; either way disjoint and complete."""
    import trainer  # noqa: F401  (first: legacy Keras)

    generate.generate(str(tmp_path), files=files, rows=30, eval_rows=1, seed=0)
    paths = sorted(str(p) for p in tmp_path.glob("train-*.csv"))
    every_row = [line.encode() for path in paths for line in open(path).read().splitlines()[1:]]
    read = _lines_read(paths, pipelines)
    assert all(read), read
    assert sorted(row for share in read for row in share) == sorted(every_row)
    assert HEADER.encode() not in [row for share in read for row in share]


def test_a_csv_field_tf_data_cannot_parse_becomes_one_line(tmp_path):
    import trainer  # noqa: F401
    import tensorflow as tf

    (tmp_path / "bad.csv").write_text(f"{HEADER}\n1.0,one,3,card,downtown,5.0\n")
    (tmp_path / "short.csv").write_text(f"{HEADER}\n1.0,1,3,card,5.0\n")
    short = data.dataset([str(tmp_path / "short.csv")], 4, tf.distribute.InputContext(), training=False, seed=None)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(short)
    assert data.is_bad_csv(raised.value) == f"a row has 5 fields, expected 6 ({','.join(data.COLUMNS)})"
    batches = data.dataset([str(tmp_path / "bad.csv")], 4, tf.distribute.InputContext(), training=False, seed=None)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(batches)
    line = fares_task.FaresTask().describe_error(raised.value, None)
    assert line == ("a row of the CSV files cannot be read (passengers is not a valid int64: one); check "
                    "--train-files and --eval-files"), line
    assert fares_task.FaresTask().describe_error(ValueError("other"), None) is None


def test_the_example_uses_only_the_runtimes_public_interface():
    """What a user's package may import of the runtime; anything else would be a back door."""
    import ast

    from unit.test_layout import public_names

    public = {"trainer"} | {f"trainer.{module}" for module in public_names()}  # trainer/__init__.py's table
    used = set()
    for path in (REPO / "examples" / "fares" / "fares").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trainer":
                used |= {node.module} if node.module != "trainer" else {f"trainer.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                used |= {a.name for a in node.names if a.name.split(".")[0] == "trainer"}
    assert used and used <= public, sorted(used - public)
