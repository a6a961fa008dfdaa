"""The on-disk format every prepared dataset uses: sharded TFRecords of JPEG + label + id, and a
`dataset.json` beside them that says what the labels mean.

Files are named `{split}-{index:05d}-of-{count:05d}.tfrecord`, and examples are dealt out
round-robin, so shard sizes differ by at most one and FILE sharding gives workers equal work.

`dataset.json` (format version 1):

    {"format_version": 1, "class_names": ["cbb", "cbsd", ...], "image_format": "jpeg",
     "splits": {"train": {"examples": 17112, "shards": 16,
                          "files": {"train-00000-of-00016.tfrecord": {"examples": 1070, "bytes": 61340327}, ...}},
                "validation": {...}}}

`class_names` is in label order: label i is class_names[i]. Shards without it are read as
cassava's five classes, as they were before the file existed.

`files` (written since this project reads from buckets; optional) lets a job start without
reading its data first: the counts come from here, and each file's size, one metadata request
per file, tells a truncated or replaced file before training (`check_described`). Files it does
not describe are read to their end instead (`scan_files`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
from typing import Iterable, Sequence

import tensorflow as tf

# What shards without a dataset.json hold: cassava, in TFDS's label order.
CASSAVA_CLASS_NAMES = ("cbb", "cbsd", "cgm", "cmd", "healthy")
METADATA_FILE = "dataset.json"
FORMAT_VERSION = 1
IMAGE_FORMAT = "jpeg"


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def serialize(jpeg: bytes, label: int, example_id: str) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[example_id.encode()])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(
    examples: Iterable[tuple[bytes, int, str]], directory: str, split: str, num_shards: int
) -> tuple[list[str], int]:
    """Writes (jpeg, label, id) examples round-robin into `num_shards` files; returns the paths
    and the number of examples written. `directory` may be a gs:// URL."""
    tf.io.gfile.makedirs(directory)
    paths = [f"{directory.rstrip('/')}/{shard_name(split, i, num_shards)}" for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    count = 0
    try:
        for count, (jpeg, label, example_id) in enumerate(examples, start=1):
            writers[(count - 1) % num_shards].write(serialize(jpeg, label, example_id))
    finally:
        for writer in writers:
            writer.close()
    return paths, count


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What a directory of shards holds, from its dataset.json."""

    class_names: tuple[str, ...]
    splits: dict  # split -> {"examples": N, "shards": M}
    image_format: str = IMAGE_FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps({"format_version": self.format_version, "class_names": list(self.class_names),
                           "image_format": self.image_format, "splits": self.splits}, indent=2, sort_keys=True) + "\n"


class MetadataError(ValueError):
    """A dataset.json that cannot be used. str() is one line naming the file."""


def metadata_path(directory: str) -> str:
    return f"{directory.rstrip('/')}/{METADATA_FILE}"


def read_metadata(directory: str) -> Metadata | None:
    """The directory's dataset.json, or None when it has none."""
    path = metadata_path(directory)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as handle:
            raw = json.loads(handle.read())
        version = raw["format_version"]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise MetadataError(f"{path}: format version {version!r} is newer than this trainer reads "
                                f"({FORMAT_VERSION}); use the trainer that wrote it")
        names = raw["class_names"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise MetadataError(f"{path}: class_names must be a non-empty list of names")
        if len(set(names)) != len(names):
            raise MetadataError(f"{path}: class_names repeats a name")
        return Metadata(tuple(names), dict(raw.get("splits") or {}), raw.get("image_format", IMAGE_FORMAT), version)
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise MetadataError(f"{path}: not a dataset description ({type(error).__name__}: {error})") from None


def check_classes(directory: str, class_names: Sequence[str]) -> Metadata | None:
    """The directory's dataset.json, after checking it names these classes (MetadataError if
    not: labels written next to the others would mean other things)."""
    existing = read_metadata(directory)
    if existing is not None and existing.class_names != tuple(class_names):
        raise MetadataError(f"{metadata_path(directory)} describes classes {', '.join(existing.class_names)}, not "
                            f"{', '.join(class_names)}; write this dataset to another directory")
    return existing


def write_metadata(directory: str, class_names: Sequence[str], split: str, num_examples: int, num_shards: int,
                   paths: Sequence[str] = ()) -> Metadata:
    """Records `split` in the directory's dataset.json, keeping the splits already there. With
    the shard `paths` write_shards returned, also each file's example count and size."""
    existing = check_classes(directory, class_names)
    splits = dict(existing.splits) if existing else {}
    splits[split] = {"examples": int(num_examples), "shards": int(num_shards)}
    if paths:
        sizes = _stat_sizes(paths)
        splits[split]["files"] = {
            path.rsplit("/", 1)[-1]: {"examples": num_examples // len(paths) + (i < num_examples % len(paths)),
                                      "bytes": sizes[path]}
            for i, path in enumerate(paths)}
    metadata = Metadata(tuple(class_names), splits)
    with tf.io.gfile.GFile(metadata_path(directory), "w") as handle:
        handle.write(metadata.to_json())
    return metadata


class CorruptFile(ValueError):
    """A TFRecord file that cannot be read to its end (truncated upload, flipped bits)."""

    def __init__(self, path: str, error: tf.errors.OpError | None = None, reason: str = ""):
        if error is not None:
            # TensorFlow prefixes the function it ran ({{function_node ...}}) and appends [Op:...].
            reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]", "", (error.message or type(error).__name__).strip())
            reason = f"{type(error).__name__}: {reason.splitlines()[0][:160]}"
        super().__init__(f"{path} is truncated or corrupt ({reason})")
        self.path = path


@dataclasses.dataclass(frozen=True)
class FileSummary:
    path: str
    examples: int
    min_label: int  # over the file's records; 0 and -1 when it has none or they were not read
    max_label: int
    expected_bytes: int | None = None  # what dataset.json recorded, when the summary comes from there


_LABEL_ONLY = {"label": tf.io.FixedLenFeature([], tf.int64)}


def scan_file(path: str) -> FileSummary:
    """Reads one file to its end: every record's length and CRC are checked, and its labels
    parsed (the image bytes are skipped over, not decoded)."""
    def step(state, labels):
        count, low, high = state
        return count + tf.size(labels, tf.int64), tf.minimum(low, tf.reduce_min(labels)), tf.maximum(high, tf.reduce_max(labels))

    dataset = tf.data.TFRecordDataset(path).batch(512).map(lambda s: tf.io.parse_example(s, _LABEL_ONLY)["label"])
    start = (tf.constant(0, tf.int64), tf.constant(tf.int64.max, tf.int64), tf.constant(-1, tf.int64))
    try:
        count, low, high = (int(v) for v in dataset.reduce(start, step))
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError) as error:
        raise CorruptFile(path, error) from None
    return FileSummary(path, count, low if count else 0, high)


def _stat_sizes(paths: Sequence[str]) -> dict[str, int]:
    """Each path's size, several requests at a time (on a bucket each is a round trip)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, max(1, len(paths)))) as pool:
        return dict(zip(paths, pool.map(lambda path: tf.io.gfile.stat(path).length, paths)))


def described_summaries(files: Sequence[str], metadata: dict[str, Metadata | None]) -> list[FileSummary] | None:
    """Each file's example count from the dataset.json of its directory (`metadata`: directory ->
    what read_metadata returned), or None when any file is not described there (then they must
    be scanned). Labels are not known this way: the input pipeline checks them as it reads them
    (cassava.data)."""
    described_files = {
        directory: {name: entry for split in m.splits.values() for name, entry in (split.get("files") or {}).items()}
        for directory, m in metadata.items() if m is not None}
    summaries = []
    for path in files:
        directory, _, name = path.rpartition("/")
        entry = described_files.get(directory, {}).get(name)
        if entry is None:
            return None
        summaries.append(FileSummary(path, int(entry["examples"]), 0, -1, expected_bytes=int(entry["bytes"])))
    return summaries


def check_described(summaries: Sequence[FileSummary]) -> None:
    """Raises CorruptFile for the first file whose size is not the one dataset.json recorded:
    a truncated upload, or a file replaced without rerunning cassava.prepare. Reads no data."""
    sizes = _stat_sizes([summary.path for summary in summaries])
    for summary in summaries:
        if sizes[summary.path] != summary.expected_bytes:
            raise CorruptFile(summary.path, reason=f"{sizes[summary.path]} bytes where {METADATA_FILE} recorded "
                                                   f"{summary.expected_bytes}")


def scan_files(files: Iterable[str]) -> list[FileSummary]:
    """scan_file for every file, several at a time (the reads release the GIL); raises CorruptFile
    naming the first file that cannot be read to its end. This reads every byte once, before
    training, so a broken file stops the job before it starts."""
    files = list(files)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(1, len(files)))) as pool:
        return list(pool.map(scan_file, files))
