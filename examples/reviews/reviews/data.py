"""The review files: what `prepare` reads from them (rows, the vocabulary) and the tf.data
pipelines that feed the model raw text.

A file holds one review a line, `LABEL<TAB>TEXT`, LABEL 1 (positive) or 0 (negative), on a local
disk, gs:// or /gcs/ (tf.io.gfile reads all three). TensorFlow is imported inside the functions,
so `--help` and a flag error answer at once.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from trainer.tasks import DataError

CLASS_NAMES = ("negative", "positive")
# Index 0 is the padding token and 1 the out-of-vocabulary one (keras.layers.TextVectorization).
RESERVED_TOKENS = 2


@dataclasses.dataclass(frozen=True)
class Summary:
    files: tuple[str, ...]
    rows: int
    vocabulary: tuple[str, ...]  # the most frequent words, most frequent first


def list_files(pattern: str, flag: str) -> tuple[str, ...]:
    import tensorflow as tf

    try:
        files = tuple(sorted(tf.io.gfile.glob(pattern)))
    except tf.errors.OpError as error:
        raise DataError(f"{flag} {pattern}: {error.message.splitlines()[0]}") from None
    if not files:
        raise DataError(f"{flag} {pattern}: the pattern matches no files")
    return files


def summarize(pattern: str, flag: str, vocabulary_size: int) -> Summary:
    """One pass over the files: every line checked, rows counted, words counted."""
    import tensorflow as tf

    files = list_files(pattern, flag)
    words: collections.Counter = collections.Counter()
    rows = 0
    for path in files:
        with tf.io.gfile.GFile(path) as handle:
            for number, line in enumerate(handle, 1):
                label, tab, text = line.rstrip("\n").partition("\t")
                if not tab or label not in ("0", "1") or not text.strip():
                    raise DataError(f"{flag}: {path} line {number} is not LABEL<TAB>TEXT with LABEL 0 or 1")
                words.update(text.lower().split())
                rows += 1
    if not rows:
        raise DataError(f"{flag} {pattern}: the files hold no reviews")
    kept = vocabulary_size - RESERVED_TOKENS
    return Summary(files, rows, tuple(word for word, _ in words.most_common(kept)))


def dataset(files: Sequence[str], batch_size: int, context, *, training: bool, seed: int | None):
    """Batches of (text, label): raw strings, and float32 labels. Training: shuffled and repeated
    forever, whole batches only."""
    import tensorflow as tf

    from trainer import inputs

    names = inputs.shard_files(tf.data.Dataset.from_tensor_slices(list(files)), len(files), context)
    lines = names.interleave(tf.data.TextLineDataset, cycle_length=max(1, min(4, len(files))),
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    lines = inputs.shard_records(lines, len(files), context)

    def parse(line):
        label, text = tf.unstack(tf.strings.split(line, "\t", maxsplit=1), num=2)
        return text, tf.strings.to_number(label, tf.float32)

    reviews = lines.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        reviews = reviews.shuffle(10_000, seed=seed, reshuffle_each_iteration=True).repeat()
    return inputs.without_autoshard(reviews.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE))
