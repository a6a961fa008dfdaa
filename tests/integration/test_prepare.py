"""cassava.prepare writes balanced TFRecord shards that training reads back."""

import collections
import json
import re
import subprocess

import numpy as np
import pytest

import trainer  # noqa: F401
import tensorflow as tf

from cassava import data, prepare, records, sources
from cassava.spec import DatasetSpec
from helpers import REPO, clean_env


def read_back(pattern):
    split = sources.load(DatasetSpec("tfrecord", pattern), None, "train")
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=False, cache=False)
    ids = {}
    for batch in data.records(split, tf.distribute.InputContext(), False).batch(8):
        ids.update(zip((i.decode() for i in batch["id"].numpy()), batch["label"].numpy().tolist()))
    assert sum(label.shape[0] for _, label in data.make_dataset(split, options)) == split.num_examples
    return split, ids


def test_image_folder_becomes_balanced_shards(tmp_path):
    rng = np.random.default_rng(0)
    for name, count, extension in (("cmd", 5, "jpg"), ("healthy", 4, "png")):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(count):
            image = rng.integers(0, 255, size=(40, 50, 3), dtype=np.uint8)
            encoded = tf.io.encode_jpeg(image) if extension == "jpg" else tf.io.encode_png(image)
            (tmp_path / "images" / name / f"{i}.{extension}").write_bytes(encoded.numpy())
    (tmp_path / "images" / "healthy" / "notes.txt").write_text("not an image")
    assert prepare.main(["--source", f"folder:{tmp_path / 'images'}", "--output", str(tmp_path / "out"), "--shards", "4"]) == 0
    counts = [sum(s.examples for s in records.scan_files([str(p)])) for p in sorted((tmp_path / "out").glob("train-*"))]
    assert counts == [3, 2, 2, 2]
    split, ids = read_back(str(tmp_path / "out" / "train-*.tfrecord"))
    assert split.num_examples == 9
    # Two classes, in sorted order; PNGs were re-encoded as JPEG and decode like the rest.
    assert collections.Counter(ids.values()) == {0: 5, 1: 4}
    assert ids["healthy/3.png"] == 1


def test_tfds_cassava_is_rewritten_split_by_split(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=10):
        assert prepare.main(["--source", "tfds:cassava", "--data-dir", str(tmp_path / "tfds"),
                             "--output", str(tmp_path / "out"), "--shards", "3"]) == 0
    _, ids = read_back(str(tmp_path / "out" / "train-*.tfrecord"))
    assert len(ids) == 10 and set(ids.values()) <= set(range(5))


def test_bad_source_is_a_one_line_error(tmp_path, capsys):
    assert prepare.main(["--source", f"folder:{tmp_path / 'missing'}", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cassava.prepare: error:") and err.count("\n") == 1


def write_folder(root, images: dict[str, bytes]):
    for relative, content in images.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)


def jpeg(seed: int, size=(40, 50)) -> bytes:
    return tf.io.encode_jpeg(np.random.default_rng(seed).integers(0, 255, size=(*size, 3), dtype=np.uint8)).numpy()


def test_unreadable_images_are_skipped_named_and_counted(tmp_path, capsys):
    good = jpeg(1)
    write_folder(tmp_path / "images", {"cmd/ok.jpg": good, "cmd/cut.jpg": good[: len(good) // 2],
                                       "healthy/ok.jpg": jpeg(2), "healthy/text.png": b"this is not a PNG"})
    assert prepare.main(["--source", f"folder:{tmp_path / 'images'}", "--output", str(tmp_path / "out"), "--shards", "2"]) == 0
    out = capsys.readouterr().out
    assert "prepare: train: skipping cmd/cut.jpg: not a readable image" in out
    assert "prepare: train: skipping healthy/text.png: not a readable image" in out
    assert "prepare: train: 2 examples in 2 files under" in out and "; 2 unreadable images skipped" in out
    _, ids = read_back(str(tmp_path / "out" / "train-*.tfrecord"))
    assert ids == {"cmd/ok.jpg": 0, "healthy/ok.jpg": 1}


def test_nothing_readable_exits_2(tmp_path, capsys):
    write_folder(tmp_path / "images", {"cmd/a.jpg": b"\xff\xd8\xff garbage", "healthy/b.jpg": b"nope"})
    assert prepare.main(["--source", f"folder:{tmp_path / 'images'}", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"cassava.prepare: error: no readable image in folder:{tmp_path / 'images'} (2 unreadable skipped)\n"


def test_progress_is_reported_on_long_runs(tmp_path):
    lines = []
    examples = [(jpeg(i, (8, 8)), 0, f"id-{i}") for i in range(5)]
    tally = prepare.Tally()
    assert len(list(prepare.readable(examples, "train", tally, say=lines.append, progress_seconds=0))) == 5
    assert lines[-1].startswith("prepare: train: 5 examples written, 0 skipped (") and lines[-1].endswith("/s)")


def test_a_truncated_tfrecord_file_is_named_before_training(tmp_path):
    paths, _ = records.write_shards([(jpeg(i), 0, f"id-{i}") for i in range(6)], str(tmp_path), "train", 2)
    data_bytes = open(paths[1], "rb").read()
    open(paths[1], "wb").write(data_bytes[:-100])  # a half-finished upload
    with pytest.raises(sources.DataError, match=rf"^--dataset tfrecord:.*: {paths[1]} is truncated or corrupt \(DataLossError"):
        sources.load(DatasetSpec("tfrecord", str(tmp_path / "train-*.tfrecord")), None, "train")


def corrupt_split(tmp_path, bad: int):
    good = jpeg(0)
    examples = [(jpeg(i), i % 5, f"good-{i}") for i in range(6)]
    examples += [(good[: len(good) // 3], 0, f"cut-{i}") for i in range(bad)]
    paths, count = records.write_shards(examples, str(tmp_path), "train", 1)
    return data.Split("train", count, tuple("abcde"), tuple(paths))


def test_undecodable_images_are_skipped_while_training(tmp_path):
    split = corrupt_split(tmp_path, bad=2)
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=False, cache=False, max_bad_examples=2)
    assert sum(label.shape[0] for _, label in data.make_dataset(split, options)) == 6


def test_too_many_undecodable_images_stop_the_pipeline(tmp_path):
    split = corrupt_split(tmp_path, bad=3)
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=False, cache=False, max_bad_examples=2)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(data.make_dataset(split, options))
    assert data.too_many_bad_examples(raised.value)


def test_dataset_json_names_the_classes_in_label_order_and_counts_each_split(tmp_path):
    seven = ["apple", "banana", "cherry", "date", "elder", "fig", "grape"]
    write_folder(tmp_path / "train", {f"{name}/{i}.jpg": jpeg(10 * c + i) for c, name in enumerate(seven) for i in range(2)})
    write_folder(tmp_path / "val", {f"{name}/0.jpg": jpeg(100 + c) for c, name in enumerate(seven)})
    out = tmp_path / "out"
    assert prepare.main(["--source", f"folder:{tmp_path / 'train'}", "--output", str(out), "--shards", "3"]) == 0
    assert prepare.main(["--source", f"folder:{tmp_path / 'val'}", "--output", str(out), "--shards", "2",
                         "--split", "validation"]) == 0
    metadata = records.read_metadata(str(out))
    assert metadata.class_names == tuple(seven) and metadata.image_format == "jpeg" and metadata.format_version == 1
    assert {split: (entry["examples"], entry["shards"]) for split, entry in metadata.splits.items()} == {
        "train": (14, 3), "validation": (7, 2)}
    # Each file's count and size, which let training start without reading the data.
    for split, entry in metadata.splits.items():
        assert sum(f["examples"] for f in entry["files"].values()) == entry["examples"]
        for name, described in entry["files"].items():
            assert described["bytes"] == (out / name).stat().st_size
            assert described["examples"] == sum(s.examples for s in records.scan_files([str(out / name)]))
    split, ids = read_back(str(out / "train-*.tfrecord"))
    assert split.class_names == tuple(seven) and split.num_classes == 7
    assert ids["grape/1.jpg"] == 6


def test_a_folder_of_other_classes_is_refused_before_anything_is_overwritten(tmp_path, capsys):
    write_folder(tmp_path / "a", {"cat/0.jpg": jpeg(0), "dog/0.jpg": jpeg(1)})
    write_folder(tmp_path / "b", {"ant/0.jpg": jpeg(2), "bee/0.jpg": jpeg(3), "cow/0.jpg": jpeg(4)})
    out = tmp_path / "out"
    assert prepare.main(["--source", f"folder:{tmp_path / 'a'}", "--output", str(out), "--shards", "1"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert prepare.main(["--source", f"folder:{tmp_path / 'b'}", "--output", str(out), "--shards", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "describes classes cat, dog, not ant, bee, cow" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_label_outside_the_described_classes_names_the_file(tmp_path):
    paths, _ = records.write_shards([(jpeg(i), i % 3, f"id-{i}") for i in range(6)], str(tmp_path), "train", 2)
    records.write_metadata(str(tmp_path), ["a", "b"], "train", 6, 2)  # labels go up to 2: three classes
    with pytest.raises(sources.DataError) as raised:
        sources.load(DatasetSpec("tfrecord", str(tmp_path / "train-*.tfrecord")), None, "train")
    assert str(raised.value).startswith(f"{paths[0]}: label 2 is outside the 2 classes (from {tmp_path}/dataset.json: a, b)")


def test_shards_without_dataset_json_are_cassava_and_a_sixth_class_is_named(tmp_path):
    records.write_shards([(jpeg(i), i % 5, f"id-{i}") for i in range(5)], str(tmp_path / "ok"), "train", 1)
    split = sources.load(DatasetSpec("tfrecord", str(tmp_path / "ok" / "*.tfrecord")), None, "train")
    assert split.class_names == ("cbb", "cbsd", "cgm", "cmd", "healthy")
    paths, _ = records.write_shards([(jpeg(i), i, f"id-{i}") for i in range(7)], str(tmp_path / "seven"), "train", 2)
    with pytest.raises(sources.DataError, match=rf"^{paths[0]}: label 6 is outside the 5 classes \(cassava's, as no dataset.json"):
        sources.load(DatasetSpec("tfrecord", str(tmp_path / "seven" / "*.tfrecord")), None, "train")


def test_a_dataset_json_from_a_newer_format_is_refused(tmp_path):
    records.write_shards([(jpeg(0), 0, "id-0")], str(tmp_path), "train", 1)
    (tmp_path / "dataset.json").write_text(json.dumps({"format_version": 99, "class_names": ["a"]}))
    with pytest.raises(sources.DataError, match=r"format version 99 is newer than this trainer reads \(1\)"):
        sources.load(DatasetSpec("tfrecord", str(tmp_path / "*.tfrecord")), None, "train")


def test_run_local_sh_generates_its_data_once_with_nothing_on_stderr(tmp_path):
    """The data generation scripts/run_local.sh runs before its workers start, run as it is written
    there (with HOME elsewhere, so the cache it fills is the test's)."""
    script = (REPO / "scripts" / "run_local.sh").read_text()
    command = re.search(r"^  (TF_CPP_MIN_LOG_LEVEL=1 \.venv/bin/python -m trainer\.run -- python -c '.*?')$", script,
                        re.M | re.S).group(1)
    assert "synthetic.ensure(sources.DEFAULT_CACHE_DIR" in command
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=clean_env(HOME=str(tmp_path)),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    made = list((tmp_path / ".cache" / "cassava-trainer").glob("synthetic-v*-n*-seed0"))
    assert len(made) == 1 and len(list(made[0].glob("train-*"))) == 8, made
