"""The on-disk format every prepared dataset uses: sharded TFRecords of JPEG + label + id.

Files are named `{split}-{index:05d}-of-{count:05d}.tfrecord`, and examples are dealt out
round-robin, so shard sizes differ by at most one and FILE sharding gives workers equal work.
"""

from __future__ import annotations

import concurrent.futures
import re
from typing import Iterable

import tensorflow as tf


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


class CorruptFile(ValueError):
    """A TFRecord file that cannot be read to its end (truncated upload, flipped bits)."""

    def __init__(self, path: str, error: tf.errors.OpError):
        # TensorFlow prefixes the function it ran ({{function_node ...}}) and appends [Op:...].
        reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]", "", (error.message or type(error).__name__).strip())
        reason = reason.splitlines()[0][:160]
        super().__init__(f"{path} is truncated or corrupt ({type(error).__name__}: {reason})")
        self.path = path


def count_file(path: str) -> int:
    """Records in one file, reading bytes only; every record's length and CRC are checked."""
    try:
        return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError) as error:
        raise CorruptFile(path, error) from None


def count_records(files: Iterable[str]) -> int:
    """Counts the records of every file, several files at a time (the reads release the GIL);
    raises CorruptFile naming the first file that cannot be read to its end. This reads every
    byte once, before training, so a broken file stops the job before it starts."""
    files = list(files)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(1, len(files)))) as pool:
        return sum(pool.map(count_file, files))
