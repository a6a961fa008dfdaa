"""Turns a --dataset spec into the splits it names, preparing data where that is needed.

`tfds:NAME` runs TFDS's download_and_prepare into --data-dir (gs:// allowed); `synthetic:N`
generates data into a local cache; `tfrecord:GLOB` lists existing files and reads the classes
from the `dataset.json` beside them (cassava.records). Where that file describes each shard,
start-up reads no data: counts come from it, and a file whose size differs from it is a
DataError naming the file; a label outside the classes is found as the input pipeline reads it
(cassava.data). Files it does not describe are read to their end before training, which finds both.
"""

from __future__ import annotations

import os

import tensorflow as tf

from cassava import records, synthetic
from cassava.data import Split
from cassava.spec import DatasetSpec
from trainer import tasks

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "cassava-trainer")
DEFAULT_CLASS_NAMES = records.CASSAVA_CLASS_NAMES


class DataError(tasks.DataError):
    """The data named on the command line cannot be read. str() is one line."""


def load(spec: DatasetSpec, data_dir: str | None, split: str) -> Split:
    """`split` is "train" or "validation"."""
    if spec.scheme == "synthetic":
        root = data_dir if data_dir and "://" not in data_dir else DEFAULT_CACHE_DIR
        directory = synthetic.ensure(root, spec.synthetic_size)
        files = tuple(sorted(tf.io.gfile.glob(f"{directory}/{split}-*.tfrecord")))
        size = spec.synthetic_size if split == "train" else synthetic.validation_size(spec.synthetic_size)
        return Split(name=split, num_examples=size, class_names=synthetic.CLASS_NAMES, files=files)
    if spec.scheme == "tfrecord":
        return _tfrecord_split(spec, split)
    return _tfds_split(spec.value, data_dir, split)


def default_validation(spec: DatasetSpec) -> DatasetSpec | None:
    """TFDS and synthetic data carry a validation split; a bare TFRecord glob does not."""
    return spec if spec.scheme in ("tfds", "synthetic") else None


def metadata_of(files: tuple[str, ...], spec: DatasetSpec) -> dict[str, records.Metadata | None]:
    """Each directory the files are in -> its dataset.json (None where it has none)."""
    described = {}
    for directory in sorted({os.path.dirname(path) for path in files}):
        try:
            described[directory] = records.read_metadata(directory)
        except records.MetadataError as error:
            raise DataError(f"--dataset {spec}: {error}") from None
    return described


def class_names_of(described: dict[str, records.Metadata | None], spec: DatasetSpec) -> tuple[tuple[str, ...], str]:
    """The classes the files' dataset.json names, and where they came from. Every directory the
    files are in must describe the same classes; with no dataset.json anywhere, cassava's."""
    found = {d: m for d, m in described.items() if m is not None}
    if not found:
        return DEFAULT_CLASS_NAMES, f"cassava's, as no {records.METADATA_FILE} is beside the files (cassava.prepare writes one)"
    directory, metadata = next(iter(found.items()))
    for other, other_metadata in described.items():
        if other_metadata is None or other_metadata.class_names != metadata.class_names:
            what = (f"has no {records.METADATA_FILE}, unlike" if other_metadata is None
                    else "describes other classes than")
            raise DataError(f"--dataset {spec}: {other} {what} {directory}; match the files of one dataset")
    return metadata.class_names, f"from {records.metadata_path(directory)}"


def _tfrecord_split(spec: DatasetSpec, split: str) -> Split:
    files = tuple(sorted(tf.io.gfile.glob(spec.value)))
    if not files:
        raise DataError(f"--dataset {spec}: the pattern matches no files")
    if len(files) == 1 and tf.io.gfile.isdir(files[0]):
        raise DataError(f"--dataset {spec}: {files[0]} is a directory; give the files, such as "
                        f"tfrecord:{files[0].rstrip('/')}/train-*.tfrecord")
    described = metadata_of(files, spec)
    class_names, origin = class_names_of(described, spec)
    try:
        summaries = records.described_summaries(files, described)
        if summaries is not None:
            records.check_described(summaries)  # sizes only: start-up reads no data
        else:
            summaries = records.scan_files(files)
    except records.CorruptFile as error:
        raise DataError(f"--dataset {spec}: {error}; upload it again or rerun cassava.prepare") from None
    for summary in summaries:
        if summary.examples and summary.expected_bytes is None and (summary.min_label < 0 or summary.max_label >= len(class_names)):
            label = summary.max_label if summary.max_label >= len(class_names) else summary.min_label
            raise DataError(label_error(summary.path, label, class_names, origin))
    return Split(name=split, num_examples=sum(s.examples for s in summaries), class_names=class_names, files=files)


def label_error(path: str, label: int, class_names, origin: str = "") -> str:
    origin = f"{origin}: " if origin else ""
    return f"{path}: label {label} is outside the {len(class_names)} classes ({origin}{', '.join(class_names)})"


def _tfds_split(name: str, data_dir: str | None, split: str) -> Split:
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
        builder.download_and_prepare()
    except Exception as error:  # TFDS raises many types; the message is what the user needs
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"--dataset tfds:{name}: cannot prepare it in {data_dir or 'the TFDS default dir'}: {first_line}") from error
    info = builder.info
    class_names = tuple(info.features["label"].names)
    if split in info.splits:
        return Split(
            name=split, num_examples=info.splits[split].num_examples, class_names=class_names,
            tfds_name=name, tfds_data_dir=data_dir, tfds_num_files=info.splits[split].num_shards,
        )
    # Mocked builders (tfds.testing.mock_data) have no split metadata: count instead.
    dataset = builder.as_dataset(split=split, decoders={"image": tfds.decode.SkipDecoding()})
    count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return Split(name=split, num_examples=count, class_names=class_names, tfds_name=name, tfds_data_dir=data_dir)
