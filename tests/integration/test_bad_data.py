"""Messy data through the real entry point: cassava.task skips what it cannot decode, names it,
and stops with one line and exit 2 when there is too much of it or a file is broken."""

from __future__ import annotations

import numpy as np

import trainer  # noqa: F401
import tensorflow as tf

from helpers import clean_env, run_module
from cassava import records

SMALL_RUN = ["--epochs", "1", "--steps-per-epoch", "2", "--image-size", "32", "--architecture", "small",
             "--weights", "none", "--per-replica-batch-size", "4"]


def write_dataset(directory, bad: int, shards: int = 2) -> str:
    rng = np.random.default_rng(0)
    good = [tf.io.encode_jpeg(rng.integers(0, 255, size=(48, 48, 3), dtype=np.uint8)).numpy() for _ in range(16)]
    examples = [(image, i % 5, f"good-{i}") for i, image in enumerate(good)]
    examples += [(good[0][: len(good[0]) // 2], 1, f"broken-{i}") for i in range(bad)]
    records.write_shards(examples, str(directory), "train", shards)
    return f"tfrecord:{directory}/train-*.tfrecord"


def train(tmp_path, dataset: str, *args):
    # Python's fault handler: a crash (one SIGSEGV in a 3-worker rehearsal, never reproduced)
    # leaves the stack of every thread on stderr, which the assertions print, instead of nothing.
    return run_module("cassava.task", "--dataset", dataset, *SMALL_RUN, "--model-dir", str(tmp_path / "model"), *args,
                      env=clean_env(PYTHONFAULTHANDLER="1"))


def test_a_corrupt_image_is_skipped_with_its_id_and_training_goes_on(tmp_path):
    result = train(tmp_path, write_dataset(tmp_path / "data", bad=1))
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'trainer: skipping undecodable image "broken-0"' in result.stderr
    assert (tmp_path / "model" / "saved_model.pb").exists()


def test_too_many_corrupt_images_stop_the_job_with_one_line_and_exit_2(tmp_path):
    # The count runs as the images stream through, so the job must read past the 4th: 6 steps
    # of 4 is more than the 16 good images of one pass.
    result = train(tmp_path, write_dataset(tmp_path / "data", bad=4), "--max-bad-examples", "3",
                   "--steps-per-epoch", "6")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("cassava.task: error:")]
    assert errors == ["cassava.task: error: more than 3 undecodable images in one pass over this task's data "
                      "(--max-bad-examples); the images skipped are named above"]
    assert "Traceback" not in result.stderr


def test_a_truncated_file_is_named_before_training_starts(tmp_path):
    dataset = write_dataset(tmp_path / "data", bad=0)
    path = tmp_path / "data" / records.shard_name("train", 1, 2)
    path.write_bytes(path.read_bytes()[:-500])
    result = train(tmp_path, dataset)
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("cassava.task: error:")]
    assert len(errors) == 1 and f"{path} is truncated or corrupt (DataLossError" in errors[0], result.stderr[-2000:]
    assert "epoch 1/1 begins" not in result.stdout and "Traceback" not in result.stderr


def one_error_line(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("cassava.task: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return errors[0]


def test_a_label_beyond_cassavas_five_without_dataset_json_stops_before_training(tmp_path):
    rng = np.random.default_rng(1)
    examples = [(tf.io.encode_jpeg(rng.integers(0, 255, size=(40, 40, 3), dtype=np.uint8)).numpy(), i % 7, f"id-{i}")
                for i in range(14)]
    paths, _ = records.write_shards(examples, str(tmp_path / "data"), "train", 2)
    result = train(tmp_path, f"tfrecord:{tmp_path}/data/train-*.tfrecord")
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-3000:]
    assert one_error_line(result).startswith(f"cassava.task: error: {paths[0]}: label 6 is outside the 5 classes")
    assert "epoch 1/1 begins" not in result.stdout


def test_validation_data_of_other_classes_is_refused(tmp_path):
    dataset = write_dataset(tmp_path / "train", bad=0)
    write_dataset(tmp_path / "other", bad=0)
    records.write_metadata(str(tmp_path / "other"), ["a", "b", "c", "d", "e"], "train", 16, 2)
    result = train(tmp_path, dataset, "--eval-dataset", f"tfrecord:{tmp_path}/other/train-*.tfrecord")
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-3000:]
    assert "has classes a, b, c, d, e, but --dataset" in one_error_line(result)


def write_described(directory, labels) -> list[str]:
    """Shards with a dataset.json that describes each file (what cassava.prepare writes)."""
    rng = np.random.default_rng(2)
    examples = [(tf.io.encode_jpeg(rng.integers(0, 255, size=(40, 40, 3), dtype=np.uint8)).numpy(), label, f"id-{i}")
                for i, label in enumerate(labels)]
    paths, count = records.write_shards(examples, str(directory), "train", 2)
    records.write_metadata(str(directory), records.CASSAVA_CLASS_NAMES, "train", count, len(paths), paths)
    return paths


def test_a_truncated_described_file_is_named_from_its_size_before_training(tmp_path):
    paths = write_described(tmp_path / "data", [i % 5 for i in range(16)])
    with open(paths[1], "r+b") as handle:
        handle.truncate(len(open(paths[1], "rb").read()) - 500)
    result = train(tmp_path, f"tfrecord:{tmp_path}/data/train-*.tfrecord")
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-3000:]
    line = one_error_line(result)
    assert f"{paths[1]} is truncated or corrupt (" in line and "dataset.json recorded" in line
    assert "epoch 1/1 begins" not in result.stdout


def test_a_label_outside_the_classes_in_a_described_file_stops_the_job_when_read(tmp_path):
    # Start-up reads no data when dataset.json describes the files: the input pipeline finds the label.
    paths = write_described(tmp_path / "data", [i % 5 for i in range(15)] + [9])
    result = train(tmp_path, f"tfrecord:{tmp_path}/data/train-*.tfrecord", "--steps-per-epoch", "4")
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-3000:]
    assert one_error_line(result).startswith(f"cassava.task: error: {paths[1]}: label 9 is outside the 5 classes")
