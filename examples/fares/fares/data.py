"""The taxi-fare CSV files: their columns, the check and statistics `prepare` reads from them,
and the tf.data pipelines that feed the model.

A file is CSV with one header line naming exactly COLUMNS, in that order, then one trip per line.
Files are found by glob on a local disk, gs:// or /gcs/ (tf.io.gfile reads all three).

TensorFlow is imported inside the functions: `fares.task --help` and `fares.generate` need none.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from typing import Iterable, Sequence

from trainer.tasks import DataError

# Numeric columns: the model normalizes them with the training data's mean and variance.
NUMERIC = ("distance_km", "passengers")
# Hour of pickup, 0-23: one-hot, since the night surcharge is not a straight line in the hour.
HOUR = "hour"
# Categorical columns and every value they may take; any other value is a DataError.
CATEGORIES = {
    "payment_type": ("card", "cash", "app"),
    "pickup_zone": ("downtown", "airport", "suburbs", "harbour"),
}
LABEL = "fare"
COLUMNS = (*NUMERIC, HOUR, *CATEGORIES, LABEL)
FEATURES = COLUMNS[:-1]


@dataclasses.dataclass(frozen=True)
class Trip:
    distance_km: float
    passengers: int
    hour: int
    payment_type: str
    pickup_zone: str
    fare: float

    def row(self) -> list[str]:
        return [f"{self.distance_km:.3f}", str(self.passengers), str(self.hour), self.payment_type, self.pickup_zone,
                f"{self.fare:.2f}"]


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one pass over a set of files found: rows, and each numeric column's and the label's
    mean and variance (the model's normalization and its starting prediction)."""

    files: tuple[str, ...]
    rows: int
    means: dict[str, float]
    variances: dict[str, float]


def parse_row(fields: Sequence[str], where: str) -> Trip:
    """One CSV row -> a Trip; DataError naming `where` (file:line) for anything else."""
    if len(fields) != len(COLUMNS):
        raise DataError(f"{where}: expected {len(COLUMNS)} fields ({','.join(COLUMNS)}), got {len(fields)}")
    values = dict(zip(COLUMNS, fields))
    try:
        trip = Trip(distance_km=float(values["distance_km"]), passengers=int(values["passengers"]),
                    hour=int(values["hour"]), payment_type=values["payment_type"],
                    pickup_zone=values["pickup_zone"], fare=float(values["fare"]))
    except ValueError as error:
        raise DataError(f"{where}: {error}") from None
    for name in ("distance_km", "fare"):
        if not math.isfinite(getattr(trip, name)):
            raise DataError(f"{where}: {name} is {values[name]}")
    if not 0 <= trip.hour <= 23:
        raise DataError(f"{where}: hour must be 0-23, got {trip.hour}")
    for name, allowed in CATEGORIES.items():
        if getattr(trip, name) not in allowed:
            raise DataError(f"{where}: {name} {getattr(trip, name)!r} is not one of {', '.join(allowed)}")
    return trip


def check_header(line: str, where: str) -> None:
    header = tuple(field.strip() for field in next(csv.reader([line]), []))
    if header != COLUMNS:
        raise DataError(f"{where}: the header is {','.join(header) or '(empty)'}; expected {','.join(COLUMNS)}")


def summarize_lines(lines: Iterable[tuple[str, Iterable[str]]]) -> tuple[int, dict[str, float], dict[str, float]]:
    """(file name, its lines) pairs -> rows, means, variances, checking every header and row."""
    rows = 0
    sums = {name: 0.0 for name in (*NUMERIC, LABEL)}
    squares = dict(sums)
    for path, file_lines in lines:
        reader = iter(file_lines)
        first = next(reader, None)
        if first is None:
            raise DataError(f"{path}: the file is empty; expected the header {','.join(COLUMNS)}")
        check_header(first, f"{path}:1")
        for number, line in enumerate(reader, start=2):
            if not line.strip():
                continue
            trip = parse_row(next(csv.reader([line])), f"{path}:{number}")
            rows += 1
            for name in sums:
                value = float(getattr(trip, name))
                sums[name] += value
                squares[name] += value * value
    if rows == 0:
        return 0, {}, {}
    means = {name: sums[name] / rows for name in sums}
    variances = {name: max(squares[name] / rows - means[name] ** 2, 0.0) for name in sums}
    return rows, means, variances


def list_files(pattern: str, flag: str) -> tuple[str, ...]:
    import tensorflow as tf

    try:
        files = tuple(sorted(tf.io.gfile.glob(pattern)))
    except tf.errors.OpError as error:
        raise DataError(f"{flag} {pattern}: {(error.message or type(error).__name__).splitlines()[0]}") from None
    if not files:
        raise DataError(f"{flag} {pattern}: the pattern matches no files")
    return files


def summarize(pattern: str, flag: str) -> Summary:
    """Reads every file `pattern` matches once: checks the header and each row, counts the rows,
    and measures the numeric columns. Small data, read in every process: a dataset too large for
    that would store these figures beside the files instead."""
    import tensorflow as tf

    files = list_files(pattern, flag)

    def lines():
        for path in files:
            with tf.io.gfile.GFile(path, "r") as handle:
                yield path, io.StringIO(handle.read())

    rows, means, variances = summarize_lines(lines())
    if rows == 0:
        raise DataError(f"{flag} {pattern}: the files hold a header but no rows")
    return Summary(files, rows, means, variances)


def record_defaults() -> list:
    """decode_csv's column types: a default of the column's type, so a missing field is an error."""
    import tensorflow as tf

    types = {"passengers": tf.int64, HOUR: tf.int64, **{name: tf.string for name in CATEGORIES}}
    return [tf.constant([], dtype=types.get(name, tf.float32)) for name in COLUMNS]


def decode(lines):
    """A batch of CSV lines -> (features: name -> [batch, 1], fare: [batch, 1])."""
    import tensorflow as tf

    columns = tf.io.decode_csv(lines, record_defaults=record_defaults())
    values = {name: tf.expand_dims(column, -1) for name, column in zip(COLUMNS, columns)}
    label = values.pop(LABEL)
    return values, label


def lines_of(files: Sequence[str], context, shuffle_files: bool, seed: int | None):
    """This input pipeline's lines of `files`, headers skipped: whole files when there are at least
    as many as the job's input pipelines (each reads only its own), else every N-th line."""
    import tensorflow as tf

    from trainer import inputs

    names = inputs.shard_files(tf.data.Dataset.from_tensor_slices(list(files)), len(files), context)
    if inputs.sharding_mode(len(files), context.num_input_pipelines) == inputs.FILE:
        if shuffle_files:
            names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        return names.interleave(lambda name: tf.data.TextLineDataset(name).skip(1), cycle_length=4,
                                num_parallel_calls=tf.data.AUTOTUNE, deterministic=seed is not None)
    # Every pipeline reads the lines in the same order and keeps every N-th.
    lines = names.flat_map(lambda name: tf.data.TextLineDataset(name).skip(1))
    return inputs.shard_records(lines, len(files), context)


def dataset(files: Sequence[str], batch_size: int, context, *, training: bool, seed: int | None,
            shuffle_buffer: int = 10_000):
    """Batches of (features, fare). Training: shuffled and repeated forever, whole batches only."""
    import tensorflow as tf

    from trainer import inputs

    lines = lines_of(files, context, shuffle_files=training, seed=seed)
    lines = lines.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
    if training:
        lines = lines.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    batches = lines.batch(batch_size, drop_remainder=training).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return inputs.without_autoshard(batches.prefetch(tf.data.AUTOTUNE))


def is_bad_csv(error: BaseException) -> str | None:
    """What tf.data's complaint about a CSV row it cannot parse says, with the column named
    (its own "Field 1 in record 0" counts within a batch, which tells a user nothing); else None."""
    import re

    import tensorflow as tf

    if not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    message = " ".join((error.message or "").split())
    field = re.search(r"Field (\d+) in record \d+ (.*?)(?: \[\[|$)", message)
    if field and int(field.group(1)) < len(COLUMNS):
        return f"{COLUMNS[int(field.group(1))]} {field.group(2)}"
    count = re.search(r"Expect (\d+) fields but have (\d+) in record", message)
    if count:
        return f"a row has {count.group(2)} fields, expected {count.group(1)} ({','.join(COLUMNS)})"
    quote = re.search(r"((?:Unquoted|Quoted) fields? .*?|Quote inside .*?)(?: \[\[|$)", message)
    return quote.group(1) if quote else None
