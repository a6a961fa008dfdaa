"""The input pipeline, in process: what goes in comes out, sharded without loss or overlap."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, clean_env

import tensorflow as tf

from cassava import data, records, sources, synthetic
from cassava.spec import DatasetSpec
from trainer import inputs

ALL = ("train",)


def write_split(directory, count, num_shards, split="train"):
    paths, written = records.write_shards(synthetic.examples(count, seed=1, id_prefix=split), str(directory), split, num_shards)
    assert written == count
    expected = {f"{split}-{i:06d}": i % len(synthetic.CLASS_NAMES) for i in range(count)}
    return data.Split(name=split, num_examples=count, class_names=synthetic.CLASS_NAMES, files=tuple(paths)), expected


def drain(dataset, limit=None):
    """(id, label) pairs of a dataset that still carries ids (built with a trace-free pipeline)."""
    pairs = []
    for batch in dataset.take(limit) if limit else dataset:
        pairs.extend(zip((i.decode() for i in batch["id"].numpy()), batch["label"].numpy().tolist()))
    return pairs


def id_batches(split, options, context):
    """The pipeline up to batching, with ids kept: same sharding, decode, cache and shuffle."""
    dataset = data.records(split, context, options.training).map(
        lambda r: {"image": data.decode_resize(r["image"], options.image_size), "label": r["label"], "id": r["id"]})
    if options.cache:
        dataset = dataset.cache()
    return dataset.batch(options.per_replica_batch_size)


@pytest.fixture(scope="module")
def eight_files(tmp_path_factory):
    return write_split(tmp_path_factory.mktemp("eight"), 40, 8)


@pytest.fixture(scope="module")
def three_files(tmp_path_factory):
    return write_split(tmp_path_factory.mktemp("three"), 30, 3)


@pytest.mark.parametrize("cache", [False, True])
def test_labels_and_ids_come_out_as_they_went_in(eight_files, cache):
    split, expected = eight_files
    options = data.PipelineOptions(image_size=32, per_replica_batch_size=4, training=False, cache=cache)
    dataset = data.make_dataset(split, options)
    labels, count = [], 0
    for images, label in dataset:
        assert images.dtype == tf.uint8 and images.shape[1:] == (32, 32, 3)
        labels.extend(label.numpy().tolist())
        count += label.shape[0]
    assert count == 40 and sorted(labels) == sorted(expected.values())
    pairs = drain(id_batches(split, options, tf.distribute.InputContext()))
    assert dict(pairs) == expected and len(pairs) == 40


@pytest.mark.parametrize("fixture, workers, mode", [
    ("eight_files", 2, "FILE"), ("eight_files", 4, "FILE"), ("eight_files", 8, "FILE"),
    ("three_files", 2, "FILE"), ("three_files", 4, "DATA"), ("eight_files", 3, "FILE"),
])
def test_no_example_dropped_or_duplicated_across_workers(request, fixture, workers, mode):
    split, expected = request.getfixturevalue(fixture)
    assert inputs.sharding_mode(split.num_files, workers) == mode
    seen = []
    for worker in range(workers):
        context = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=worker, num_replicas_in_sync=workers)
        options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=False, cache=False)
        seen.append(drain(id_batches(split, options, context)))
    flat = [pair for worker in seen for pair in worker]
    assert len(flat) == len(set(flat)) == len(expected), "an example was dropped or read twice"
    assert dict(flat) == expected
    assert all(worker for worker in seen), "a worker got no data"


@pytest.mark.parametrize("fixture, workers", [("three_files", 4), ("eight_files", 3)])
def test_training_order_still_shards_without_overlap(request, fixture, workers):
    """Training reads files in shuffled, non-deterministic order; record-level sharding must not
    let that give two workers the same record."""
    split, expected = request.getfixturevalue(fixture)
    seen = []
    for worker in range(workers):
        context = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=worker, num_replicas_in_sync=workers)
        seen.extend(i.decode() for i in data.records(split, context, training=True).map(lambda r: r["id"]).as_numpy_iterator())
    assert sorted(seen) == sorted(expected)


def test_training_epoch_covers_the_worker_shard_once(eight_files):
    """Training mode (shuffled, repeated): the first pass is exactly the shard."""
    split, expected = eight_files
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=5, training=True, cache=True,
                                   shuffle_buffer=64, seed=3)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    dataset = data.make_dataset(split, options, context)
    labels = [int(v) for _, label in dataset.take(4) for v in label.numpy()]  # 4 x 5 = this worker's 20
    shard = [expected[i] for i in sorted(expected) if int(i.split("-")[1]) % 8 % 2 == 1]
    assert sorted(labels) == sorted(shard)


def test_cache_on_and_off_give_the_same_examples(eight_files):
    split, _ = eight_files
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=2)
    results = []
    for cache in (False, True):
        options = data.PipelineOptions(image_size=24, per_replica_batch_size=4, training=False, cache=cache)
        dataset = id_batches(split, options, context)
        first = sorted(drain(dataset))
        second = sorted(drain(dataset))  # from the cache when on
        assert first == second
        results.append(first)
    assert results[0] == results[1]


def test_later_passes_cover_the_shard_once_each_in_a_new_order(eight_files):
    """The first pass fills the cache in the order the records were shuffled; each later pass
    reshuffles the cached images: every pass is the whole shard, and not the same order twice."""
    split, expected = eight_files
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=8, training=True, cache=True,
                                   shuffle_buffer=64, seed=5, trace_path=None)
    dataset = data.make_dataset(split, options)
    passes = []
    iterator = iter(dataset)
    for _ in range(3):
        passes.append([int(v) for _ in range(5) for v in next(iterator)[1].numpy()])  # 5 x 8 = all 40
    for labels in passes:
        assert sorted(labels) == sorted(expected.values())
    images = iter(dataset.unbatch().map(lambda image, label: image))
    first, second = ([next(images).numpy().tobytes() for _ in range(40)] for _ in range(2))
    assert sorted(first) == sorted(second) and first != second


def _reference(encoded: bytes, size: int, ratio: int | None) -> np.ndarray:
    """What the pipeline must produce, built here from the decoder the image calls for."""
    image = tf.io.decode_jpeg(encoded, channels=3, ratio=ratio) if ratio else tf.io.decode_image(encoded, channels=3)
    return tf.cast(tf.image.resize(tf.cast(image, tf.float32), (size, size)) + 0.5, tf.uint8).numpy()


@pytest.mark.parametrize("shape, ratio", [((120, 140), 1), ((200, 150), 2), ((330, 420), 4), ((640, 700), 8),
                                          ((300, 330), 4), ((90, 60), "png")])
def test_every_decoder_branch_gives_the_pixels_it_should(tmp_path, shape, ratio):
    """One switch_case picks the decoder (check, format, DCT scale): each branch, through both
    decode_resize and the training path's decoded_batches, against a reference decoded directly
    (the largest ratio that leaves the short side at least 75 px; 300 // 4 is exactly 75)."""
    size = 75
    pixels = np.random.default_rng(shape[0]).integers(0, 255, (*shape, 3), dtype=np.uint8)
    encoded = (tf.io.encode_png(pixels) if ratio == "png" else tf.io.encode_jpeg(pixels, quality=90)).numpy()
    expected = _reference(encoded, size, None if ratio == "png" else ratio)
    np.testing.assert_array_equal(data.decode_resize(tf.constant(encoded), size).numpy(), expected)
    broken = encoded[: len(encoded) // 2]
    records_in = tf.data.Dataset.zip((
        tf.data.Dataset.from_tensor_slices({"image": [broken, encoded], "label": [1, 2], "id": ["broken", "good"]}),
        tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()))
    batches = data.decoded_batches(records_in, lambda record: record, 4, size, deterministic=True)
    out = list(data.checked_batches(batches, max_bad=1, num_classes=5, names=("f",)))
    assert [i for batch in out for i in batch["id"].numpy().tolist()] == [b"good"]
    np.testing.assert_array_equal(out[0]["image"].numpy()[0], expected)


def _records_dataset(tmp_path, examples):
    path = str(tmp_path / "records.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for jpeg, label, example_id in examples:
            writer.write(records.serialize(jpeg, label, example_id))
    return data.Split(name="train", num_examples=len(examples), class_names=synthetic.CLASS_NAMES, files=(path,)), path


@pytest.mark.parametrize("bad_label", [False, True])
def test_an_image_that_fails_to_decode_is_dropped_and_errors_after_it_still_stop_the_pipeline(tmp_path, bad_label,
                                                                                              capfd):
    """An image whose first and last bytes look like a JPEG's but whose inside is not passes the
    check and is dropped when its decode fails (ignore_errors, with TensorFlow's warning); it
    counts against --max-bad-examples like any dropped image. A JPEG cut short inside its header
    is caught by the check: its header must not be read, or the error would drop it unnamed. A
    label outside the classes and too many dropped images still stop the pipeline: they are
    checked after ignore_errors, which would swallow them, and the label first."""
    good = tf.io.encode_jpeg(np.full((40, 50, 3), 120, np.uint8)).numpy()
    hollow = b"\xff\xd8\xff" + bytes(range(256)) * 4 + b"\xff\xd9"
    assert bool(data.looks_decodable(tf.constant(hollow)))  # passes the check, fails the decode
    examples = [(good, 1, "g0"), (hollow, 2, "hollow"), (good, 9 if bad_label else 3, "g2"), (good[:200], 0, "cut"),
                (good, 4, "g4")]
    split, path = _records_dataset(tmp_path, examples)
    options = data.PipelineOptions(image_size=32, per_replica_batch_size=2, training=False, cache=False)
    if bad_label:
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            list(data.make_dataset(split, options))
        assert data.label_outside_classes(raised.value) == (path, 9)
    else:
        labels = [label for batch in data.make_dataset(split, options) for label in batch[1].numpy().tolist()]
        assert labels == [1, 3, 4]  # the hollow image and the cut one dropped, the order kept
        stderr = capfd.readouterr().err
        assert 'trainer: skipping undecodable image "hollow"' in stderr, stderr[-2000:]
        assert 'trainer: skipping undecodable image "cut"' in stderr
    # Two dropped (the hollow image in the first batch, the cut one in the second), one allowed:
    # the bad label, when there is one, is reported before the image over the limit.
    over = dataclasses.replace(options, max_bad_examples=1)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(data.make_dataset(split, over))
    assert data.label_outside_classes(raised.value) == (path, 9) if bad_label else data.too_many_bad_examples(raised.value)
    # None allowed: the hollow image alone is over the limit, before any label is seen.
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(data.make_dataset(split, dataclasses.replace(options, max_bad_examples=0)))
    assert data.too_many_bad_examples(raised.value)


def test_a_batch_whose_every_image_is_dropped_still_counts_them(tmp_path, capfd):
    """Images are decoded a batch's window at a time; a window that yields no image at all must
    still name and count what it dropped."""
    good = tf.io.encode_jpeg(np.full((40, 50, 3), 90, np.uint8)).numpy()
    examples = [(good, 1, "g0"), (good, 2, "g1"), (b"not an image", 0, "b0"), (good[:300], 0, "b1"), (good, 3, "g4")]
    split, _ = _records_dataset(tmp_path, examples)
    options = data.PipelineOptions(image_size=32, per_replica_batch_size=2, training=False, cache=False,
                                   max_bad_examples=2)
    assert [label for batch in data.make_dataset(split, options) for label in batch[1].numpy().tolist()] == [1, 2, 3]
    stderr = capfd.readouterr().err
    assert 'trainer: skipping undecodable image "b0"' in stderr and 'trainer: skipping undecodable image "b1"' in stderr
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(data.make_dataset(split, dataclasses.replace(options, max_bad_examples=1)))
    assert data.too_many_bad_examples(raised.value)


@pytest.mark.parametrize("cache", [False, True])
def test_training_batches_are_full_with_a_static_size_when_images_are_dropped(tmp_path, cache):
    """Training batches keep exactly the batch size, as a static shape, though windows with
    dropped images give short ones; the first pass has each image at most once."""
    rng = np.random.default_rng(3)
    examples = []
    for i in range(14):
        examples.append((tf.io.encode_jpeg(rng.integers(0, 255, (24, 30, 3), dtype=np.uint8)).numpy(), i % 5, f"g{i}"))
        if i % 5 == 2:
            examples.append((b"broken", 0, f"bad{i}"))
    split, _ = _records_dataset(tmp_path, examples)
    trace = tmp_path / "trace.txt"
    options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=True, cache=cache,
                                   shuffle_buffer=8, seed=1, trace_path=str(trace))
    dataset = data.make_dataset(split, options)
    assert dataset.element_spec[0].shape.as_list() == [4, 16, 16, 3]
    assert dataset.element_spec[1].shape.as_list() == [4]
    sizes = [int(labels.shape[0]) for _, labels in dataset.take(12)]
    assert sizes == [4] * 12
    traced = trace.read_text().split()
    assert not any(i.startswith("bad") for i in traced)
    first_pass = traced[:12]  # 14 good images in batches of 4: three full batches, two wait
    assert len(set(first_pass)) == 12


@pytest.mark.parametrize("label", range(5))
@pytest.mark.parametrize("size", [64, 300])
def test_reduced_scale_decode_is_close_to_full_decode(label, size):
    image = synthetic.make_image(np.random.default_rng(label), label=label)
    encoded = tf.io.encode_jpeg(image, quality=90)
    fast = data.decode_resize(encoded, size).numpy().astype(np.float64)
    full = tf.image.resize(tf.io.decode_jpeg(encoded), (size, size), antialias=True).numpy()
    psnr = 10 * np.log10(255**2 / ((fast - full) ** 2).mean())
    assert psnr > 30  # dB: differences below what the eye (or a ResNet) notices


def test_global_batch_is_per_replica_batch_times_replicas(eight_files):
    """Two replicas in one process (two logical CPUs), the pipeline distributed over them.
    Logical devices must be configured before TensorFlow's runtime starts: a fresh process."""
    split, _ = eight_files
    script = f"""
import trainer, tensorflow as tf
from cassava import data
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
split = data.Split(name="train", num_examples=40, class_names=tuple("abcde"), files={split.files!r})
options = data.PipelineOptions(image_size=16, per_replica_batch_size=3, training=True, cache=False)
distributed = strategy.distribute_datasets_from_function(lambda ctx: data.make_dataset(split, options, ctx))
_, labels = next(iter(distributed))
print("replicas", strategy.num_replicas_in_sync, "batches", [t.shape[0] for t in strategy.experimental_local_results(labels)])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=REPO, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "replicas 2 batches [3, 3]" in result.stdout


def test_synthetic_images_look_like_cassava_photos():
    rng = np.random.default_rng(5)
    image = synthetic.make_image(rng, label=0)
    assert 500 <= image.shape[0] <= 800 and 500 <= image.shape[1] <= 800
    jpeg = tf.io.encode_jpeg(image, quality=90).numpy()
    assert len(jpeg) > 30_000  # real texture: not a flat or tiny tile
    # Smooth structure: neighbouring pixels correlate strongly, unlike noise.
    gray = image.mean(axis=2)
    correlation = np.corrcoef(gray[:, :-1].ravel(), gray[:, 1:].ravel())[0, 1]
    assert correlation > 0.8


def test_tfds_cassava_source_through_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=12):
        split = sources.load(DatasetSpec("tfds", "cassava"), str(tmp_path), "train")
        assert (split.num_examples, split.num_classes, split.tfds_name) == (12, 5, "cassava")
        ids = []
        for worker in range(2):
            context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=2)
            options = data.PipelineOptions(image_size=16, per_replica_batch_size=2, training=False, cache=False)
            ids.append([i for batch in id_batches(split, options, context) for i in batch["id"].numpy()])
    assert len(ids[0]) == len(ids[1]) == 6 and not set(ids[0]) & set(ids[1])


def test_missing_tfrecords_are_a_one_line_data_error(tmp_path):
    with pytest.raises(sources.DataError, match="matches no files"):
        sources.load(DatasetSpec("tfrecord", str(tmp_path / "none-*.tfrecord")), None, "train")


def test_a_directory_for_tfrecords_is_a_one_line_data_error_naming_the_pattern(tmp_path):
    with pytest.raises(sources.DataError, match=f"{tmp_path} is a directory; give the files, such as "
                                                f"tfrecord:{tmp_path}/train-\\*.tfrecord"):
        sources.load(DatasetSpec("tfrecord", str(tmp_path)), None, "train")


_ITERATE = """
import sys, trainer, tensorflow as tf
from cassava import data
split = data.Split(name="train", num_examples=40, class_names=tuple("abcde"), files=tuple(sys.argv[2:]))
options = data.PipelineOptions(image_size=16, per_replica_batch_size=4, training=True, cache=True)
if sys.argv[1] == "alone":
    dataset = iter(data.make_dataset(split, options))
else:
    strategy = tf.distribute.MirroredStrategy()
    dataset = iter(strategy.distribute_datasets_from_function(lambda context: data.make_dataset(split, options, context)))
for _ in range(3):
    next(dataset)
"""


def test_the_generator_dataset_warning_comes_from_tf_distribute_not_our_pipeline(eight_files):
    """Why trainer/process/relay.py may drop it: iterated alone our pipeline prints nothing; the one line
    appears once tf.distribute's per-device prefetch wraps it, even in one process."""
    from trainer.process import relay

    split, _ = eight_files
    printed = {}
    for mode in ("alone", "distributed"):
        result = subprocess.run([sys.executable, "-c", _ITERATE, mode, *split.files], capture_output=True, text=True,
                                timeout=300, cwd=REPO, env=clean_env(TF_CPP_MIN_LOG_LEVEL="1"))
        assert result.returncode == 0, result.stderr[-2000:]
        printed[mode] = [line for line in result.stderr.splitlines() if "GeneratorDatasetOp" in line]
    assert printed["alone"] == []
    assert len(printed["distributed"]) == 1 and relay.is_harmless(printed["distributed"][0])


def test_files_in_a_bucket_are_read_eight_at_once_and_local_files_as_autotune_says():
    import tensorflow as tf

    assert data.parallel_reads(("gs://b/train-0.tfrecord",) * 16) == 8
    assert data.parallel_reads(("/gcs/b/train-0.tfrecord", "/gcs/b/train-1.tfrecord")) == 2
    assert data.parallel_reads(("/data/train-0.tfrecord",) * 16) == tf.data.AUTOTUNE
