"""Turns a --dataset spec into the splits it names, preparing data where that is needed.

`tfds:NAME` runs TFDS's download_and_prepare into --data-dir (gs:// allowed); `synthetic:N`
generates data into a local cache; `tfrecord:GLOB` lists existing files.
"""

from __future__ import annotations

import os

import tensorflow as tf

from trainer import records, synthetic
from trainer.config import DatasetSpec
from trainer.data import Split

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "cassava-trainer")
NUM_CLASSES = len(synthetic.CLASS_NAMES)


class DataError(ValueError):
    """The data named on the command line cannot be read. str() is one line."""


def load(spec: DatasetSpec, data_dir: str | None, split: str) -> Split:
    """`split` is "train" or "validation"."""
    if spec.scheme == "synthetic":
        root = data_dir if data_dir and "://" not in data_dir else DEFAULT_CACHE_DIR
        directory = synthetic.ensure(root, spec.synthetic_size)
        files = tuple(sorted(tf.io.gfile.glob(f"{directory}/{split}-*.tfrecord")))
        size = spec.synthetic_size if split == "train" else synthetic.validation_size(spec.synthetic_size)
        return Split(name=split, num_examples=size, num_classes=NUM_CLASSES, files=files)
    if spec.scheme == "tfrecord":
        files = tuple(sorted(tf.io.gfile.glob(spec.value)))
        if not files:
            raise DataError(f"--dataset {spec}: the pattern matches no files")
        try:
            num_examples = records.count_records(files)
        except records.CorruptFile as error:
            raise DataError(f"--dataset {spec}: {error}; upload it again or rerun trainer.prepare") from None
        return Split(name=split, num_examples=num_examples, num_classes=NUM_CLASSES, files=files)
    return _tfds_split(spec.value, data_dir, split)


def default_validation(spec: DatasetSpec) -> DatasetSpec | None:
    """TFDS and synthetic data carry a validation split; a bare TFRecord glob does not."""
    return spec if spec.scheme in ("tfds", "synthetic") else None


def _tfds_split(name: str, data_dir: str | None, split: str) -> Split:
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
        builder.download_and_prepare()
    except Exception as error:  # TFDS raises many types; the message is what the user needs
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"--dataset tfds:{name}: cannot prepare it in {data_dir or 'the TFDS default dir'}: {first_line}") from error
    info = builder.info
    num_classes = info.features["label"].num_classes
    if split in info.splits:
        return Split(
            name=split, num_examples=info.splits[split].num_examples, num_classes=num_classes,
            tfds_name=name, tfds_data_dir=data_dir, tfds_num_files=info.splits[split].num_shards,
        )
    # Mocked builders (tfds.testing.mock_data) have no split metadata: count instead.
    dataset = builder.as_dataset(split=split, decoders={"image": tfds.decode.SkipDecoding()})
    count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return Split(name=split, num_examples=count, num_classes=num_classes, tfds_name=name, tfds_data_dir=data_dir)
