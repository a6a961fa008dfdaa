"""Prepares training data as sharded TFRecords that `--dataset tfrecord:GLOB` reads.

    python -m cassava.prepare --source tfds:cassava --data-dir gs://B/tfds --output gs://B/cassava --shards 16
    python -m cassava.prepare --source folder:/path/to/images --output /data/cassava --shards 8

`tfds:NAME` runs TFDS's download_and_prepare into --data-dir and rewrites every split it has.
`folder:PATH` reads PATH/<class>/<image> (one subfolder per class, any number of classes, in
sorted order, or in cassava's order when the names are cassava's) into one split, `--split`
(train); run it again with another --split and folder for validation data.
Each split is written as `<split>-KKKKK-of-NNNNN.tfrecord` with examples dealt round-robin, so
shards differ by at most one example and workers reading whole files get equal work. Beside
them, `dataset.json` (cassava.records) names the classes in label order and counts each split;
the trainer reads the classes from it. An output directory whose dataset.json names other
classes is refused before anything is written.

Every image is decoded before it is written: one that cannot be is skipped and named, and the
summary counts them; with no readable image at all the command exits 2. Images that are not
JPEG, or whose first and last bytes look cut short (cassava.data.looks_decodable), are
re-encoded as JPEG. Long runs print their progress every few seconds.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # before TensorFlow loads: no INFO banners

from trainer import cli  # noqa: E402

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


PROGRESS_SECONDS = 10.0


@dataclasses.dataclass
class Tally:
    written: int = 0
    skipped: int = 0


def readable(examples: Iterable[tuple[bytes, int, str]], split: str, tally: Tally,
             say: Callable[[str], None] = print, progress_seconds: float = PROGRESS_SECONDS) -> Iterator[tuple[bytes, int, str]]:
    """The examples whose image decodes, as JPEG; names every one skipped and reports progress."""
    import tensorflow as tf

    from cassava import data

    started = last_report = time.monotonic()
    for encoded, label, example_id in examples:
        try:
            image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
            if not bool(data.looks_decodable(tf.constant(encoded))) or not bool(tf.io.is_jpeg(encoded)):
                encoded = tf.io.encode_jpeg(image, quality=95).numpy()
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
            tally.skipped += 1
            reason = (error.message or type(error).__name__).strip().splitlines()[0][:120]
            say(f"prepare: {split}: skipping {example_id}: not a readable image ({reason})")
            continue
        tally.written += 1
        yield encoded, label, example_id
        now = time.monotonic()
        if now - last_report >= progress_seconds:
            last_report = now
            say(f"prepare: {split}: {tally.written:,} examples written, {tally.skipped} skipped "
                f"({tally.written / (now - started):,.0f}/s)")


def folder_classes(root: str) -> list[str]:
    """The class subfolders of root in label order: sorted, or cassava's order when the names
    are cassava's (so labels match TFDS cassava's)."""
    import tensorflow as tf

    from cassava.records import CASSAVA_CLASS_NAMES

    classes = sorted(d.rstrip("/") for d in tf.io.gfile.listdir(root) if tf.io.gfile.isdir(os.path.join(root, d)))
    if not classes:
        raise ValueError(f"folder:{root}: no class subfolders (expected {root}/<class>/<image>)")
    return list(CASSAVA_CLASS_NAMES) if sorted(classes) == sorted(CASSAVA_CLASS_NAMES) else classes


def folder_examples(root: str, classes: Sequence[str]) -> Iterator[tuple[bytes, int, str]]:
    """(image bytes, label, id) for every image under root/<class>/, as stored."""
    import tensorflow as tf

    for label, name in enumerate(classes):
        for filename in sorted(tf.io.gfile.listdir(os.path.join(root, name))):
            if not filename.lower().endswith(IMAGE_EXTENSIONS):
                continue
            path = os.path.join(root, name, filename)
            yield tf.io.gfile.GFile(path, "rb").read(), label, f"{name}/{filename}"


def tfds_examples(name: str, data_dir: str | None, split: str) -> Iterator[tuple[bytes, int, str]]:
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    dataset = builder.as_dataset(split=split, decoders={"image": tfds.decode.SkipDecoding()}, shuffle_files=False)
    for example in dataset.as_numpy_iterator():
        yield example["image"], int(example["label"]), example["image/filename"].decode()


def tfds_source(name: str, data_dir: str | None) -> tuple[list[str], list[str]]:
    """(splits, class names) of a TFDS dataset, prepared in data_dir."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    splits = sorted(builder.info.splits) or ["train"]  # mocked builders list no splits
    return splits, list(builder.info.features["label"].names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.OneLineParser(prog="python -m cassava.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="tfds:NAME or folder:PATH")
    parser.add_argument("--output", required=True, help="directory for the TFRecords and dataset.json (gs:// allowed)")
    parser.add_argument("--shards", type=int, default=16, help="files per split")
    parser.add_argument("--data-dir", default=None, help="TFDS data dir for tfds: sources (gs:// allowed)")
    parser.add_argument("--split", default="train", help="split name for folder: sources")
    args = parser.parse_args(argv)
    scheme, _, value = args.source.partition(":")
    if scheme not in ("tfds", "folder") or not value:
        parser.error(f"--source {args.source!r}: expected tfds:NAME or folder:PATH")
    if args.shards < 1:
        parser.error("--shards must be at least 1")

    from cassava import records

    total = Tally()
    try:
        if scheme == "tfds":
            splits, class_names = tfds_source(value, args.data_dir)
            jobs = [(split, tfds_examples(value, args.data_dir, split)) for split in splits]
        else:
            class_names = folder_classes(value)
            jobs = [(args.split, folder_examples(value, class_names))]
        records.check_classes(args.output, class_names)  # before any shard is overwritten
        print(f"prepare: {len(class_names)} classes: {', '.join(class_names)}", flush=True)
        for split, examples in jobs:
            tally = Tally()
            paths, count = records.write_shards(readable(examples, split, tally), args.output, split, args.shards)
            records.write_metadata(args.output, class_names, split, count, len(paths), paths)
            print(f"prepare: {split}: {count} examples in {len(paths)} files under {args.output}; "
                  f"{tally.skipped} unreadable images skipped", flush=True)
            total.written += tally.written
            total.skipped += tally.skipped
    except Exception as error:  # TFDS, gfile and decoding raise many types; one line for the user
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"cassava.prepare: error: {message}", file=sys.stderr)
        return 2
    if total.written == 0:
        print(f"cassava.prepare: error: no readable image in {args.source} ({total.skipped} unreadable skipped)",
              file=sys.stderr)
        return 2
    print(f"prepare: wrote {records.metadata_path(args.output)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
