"""The input pipeline: encoded JPEG records in, batches of uint8 images and labels out.

Order of work, and why:

1. Shard first. Each worker reads only its own files (FILE sharding) when there are at least as
   many files as input pipelines; otherwise it keeps every N-th record right after reading, still
   before decoding. Decoding everything and keeping 1/N (tf.data's DATA policy) wastes (N-1)/N of
   the most expensive step.
2. Decode and resize once, to the model's input size, in uint8: `decode_resize`, the one
   preprocessing function. Validation, the exported model's serving signature and
   `serving.predict` call the same function, so what a model is served is what it was validated
   on. JPEGs much larger than the target are decoded at a reduced DCT scale, which is nearly free
   and visually exact. Casting and normalising happen on the device, in the model's first layer,
   so the host ships a quarter of float32's bytes.
3. Shuffle records encoded, before decoding: the buffer holds JPEGs, not decoded images.
4. Decode per window: one thread decodes a window of a batch's worth of consecutive records and
   copies each image into its batch straight after the decode, while it is still in that core's
   cache; windows are decoded in parallel, one per core (`decoded_batches`). An undecodable image
   is dropped inside its own window, where nothing else is lost.
5. Cache the decoded batches in memory when they fit, so later epochs skip decoding. The first
   pass fills the cache in the order shuffled above; every later pass reshuffles the cached
   images, so every epoch still sees a new order and new batches. Augmentation (random crops and
   flips) is not done here: it is layers at the front of the model (cassava.model), which run
   on the accelerator and only in training.

An image that cannot be decoded (not an image, cut short, corrupt) is skipped with a warning
naming its example id; past `max_bad_examples` in one pass over a worker's share, the pipeline
fails (as the images stream through: when training reaches the batch over the limit) with an
error that `too_many_bad_examples` recognises, and the job stops with one line (exit 2).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import tensorflow as tf

from trainer import inputs

# Every function this module hands tf.data is written in TensorFlow ops already (tf.cond, not
# `if`), so AutoGraph has nothing to convert. Converting them anyway (reading each one's source,
# parsing and rewriting it) doubled what building a task's two pipelines costs, once per process:
# 1.27 CPU s against 0.66 traced as written (benchmarks/pipeline_startup.py, 2-core AMD EPYC family
# 25), about a tenth of a small test job's task.
as_written = tf.autograph.experimental.do_not_convert

# --cache-images auto caches when the estimate fits in this fraction of available memory.
CACHE_MEMORY_FRACTION = 0.25

RECORD_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.string),
}


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of examples, however it is stored.

    `files` are TFRecords of RECORD_FEATURES. A TFDS split instead names its builder (`tfds_name`)
    and is read through TFDS, whose records use TFDS's own feature names.
    """

    name: str
    num_examples: int
    class_names: tuple[str, ...]  # label i is class_names[i]
    files: tuple[str, ...] = ()
    tfds_name: str | None = None
    tfds_data_dir: str | None = None
    tfds_num_files: int = 0

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_files(self) -> int:
        return self.tfds_num_files if self.tfds_name else len(self.files)


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    image_size: int
    per_replica_batch_size: int
    training: bool
    cache: bool
    shuffle_buffer: int = 1024
    seed: int | None = None
    trace_path: str | None = None  # append the ids of every batch produced here
    max_bad_examples: int = 100  # undecodable images skipped per pass before the pipeline fails


def should_cache(mode: str, num_examples: int, image_size: int, num_pipelines: int,
                 examples_read: int | None = None) -> bool:
    """--cache-images: always, never, or auto (when this worker's share fits in memory and the job
    reads all of it: `examples_read`, this pipeline's images over the whole job, when known).
    tf.data discards a cache its iterator did not fill to the end, and says so on stderr."""
    if mode != "auto":
        return mode == "always"
    if examples_read is not None and examples_read < num_examples / max(num_pipelines, 1):
        return False
    estimate = (num_examples / max(num_pipelines, 1)) * image_size * image_size * 3
    return estimate < CACHE_MEMORY_FRACTION * available_memory_bytes()


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def encoded_records(split: Split, context: tf.distribute.InputContext, training: bool,
                    shuffle_buffer: int = 0, seed: int | None = None) -> tf.data.Dataset:
    """This pipeline's share of the split as (record, file index) pairs, nothing parsed or decoded;
    shuffled through a buffer of `shuffle_buffer` records when it is not 0. `record_parser(split)`
    reads a record; the index is into `file_names(split)`, so that a bad label can name its file
    (an int64 per record costs less than carrying the name, a heap-allocated string, along)."""
    num_pipelines = context.num_input_pipelines
    file_sharding = inputs.sharding_mode(split.num_files, num_pipelines) == inputs.FILE
    # Record-level (DATA) sharding keeps every N-th record, so every worker must see the records
    # in the same order: no file shuffling and a deterministic interleave before the shard.
    shuffle_files = training and (file_sharding or num_pipelines == 1)
    if split.tfds_name:
        dataset = _tfds_records(split, context if file_sharding else None, shuffle_files)
        dataset = tf.data.Dataset.zip((dataset, tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()))
    else:
        files = tf.data.Dataset.from_tensor_slices((list(split.files), tf.range(len(split.files), dtype=tf.int64)))
        files = inputs.shard_files(files, split.num_files, context)
        if shuffle_files:
            files = files.shuffle(len(split.files), reshuffle_each_iteration=True)
        dataset = files.interleave(
            as_written(lambda path, file_index: tf.data.Dataset.zip(
                (tf.data.TFRecordDataset(path), tf.data.Dataset.from_tensors(file_index).repeat()))),
            cycle_length=min(len(split.files), 8),
            num_parallel_calls=parallel_reads(split.files),
            deterministic=not shuffle_files,
        )
    dataset = inputs.shard_records(dataset, split.num_files, context)
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return dataset


def record_parser(split: Split):
    """A function from one of `encoded_records`' records to {image: encoded bytes, label, id}."""
    if split.tfds_name:
        return lambda example: {"image": example["image"], "label": example["label"], "id": example["image/filename"]}
    return lambda serialized: tf.io.parse_single_example(serialized, RECORD_FEATURES)


def file_names(split: Split) -> tuple[str, ...]:
    return (split.tfds_name,) if split.tfds_name else split.files


def records(split: Split, context: tf.distribute.InputContext, training: bool,
            shuffle_buffer: int = 0, seed: int | None = None) -> tf.data.Dataset:
    """`encoded_records`, parsed: {image: encoded bytes, label, id, file: its name}, one by one.
    (make_dataset parses inside its decode instead, which saves a function call per record.)"""
    parse, names = record_parser(split), tf.constant(file_names(split))
    return encoded_records(split, context, training, shuffle_buffer, seed).map(
        as_written(lambda record, file_index: {**parse(record), "file": tf.gather(names, file_index)}),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)


def parallel_reads(files: tuple[str, ...]) -> int:
    """How many files to read at once. From a bucket (gs://, or /gcs/ through Cloud Storage FUSE)
    every file in the cycle: a read spends its time waiting on the network, not on a core. From
    local disk, AUTOTUNE: eight reader threads on a 2-core machine cost epoch 1 about an eighth
    (1,221 against 1,406-1,415 img/s, benchmarks/input_pipeline.py's files on the 2-core EPYC)."""
    if any(_remote(path) for path in files):
        return min(len(files), 8)
    return tf.data.AUTOTUNE


def _remote(path: str) -> bool:
    return "://" in path or path.startswith("/gcs/")


def _tfds_records(split: Split, context, shuffle_files: bool) -> tf.data.Dataset:
    import tensorflow_datasets as tfds

    builder = tfds.builder(split.tfds_name, data_dir=split.tfds_data_dir)
    read_config = tfds.ReadConfig(
        input_context=context,  # FILE sharding by TFDS itself; None when the caller shards
        interleave_cycle_length=8,
        shuffle_seed=None,
    )
    return builder.as_dataset(
        split=split.name,
        decoders={"image": tfds.decode.SkipDecoding()},
        read_config=read_config,
        shuffle_files=shuffle_files,
    )


TOO_MANY_BAD_EXAMPLES = "trainer: too many undecodable images"
LABEL_OUTSIDE_CLASSES = "trainer: label outside the classes"
# The bytes a complete file ends with: JPEG's end-of-image marker (within its last KiB, as some
# cameras append metadata), PNG's IEND chunk.
_JPEG_TAIL_BYTES = 1024
_PNG_END = b"IEND\xaeB`\x82"


def looks_decodable(encoded: tf.Tensor) -> tf.Tensor:
    """Whether `encoded` is a whole JPEG, PNG, GIF or BMP, from its first and last bytes only:
    catches what goes wrong in practice (other files, truncated uploads) in a few microseconds,
    before a decode fails on it (serving.predict, cassava.prepare)."""
    length = tf.strings.length(encoded)
    head = tf.strings.substr(encoded, 0, 8)
    tail = tf.io.decode_raw(tf.strings.substr(encoded, tf.maximum(length - _JPEG_TAIL_BYTES, 0), _JPEG_TAIL_BYTES),
                            tf.uint8)
    jpeg = tf.logical_and(
        tf.equal(tf.strings.substr(head, 0, 3), b"\xff\xd8\xff"),
        tf.reduce_any(tf.logical_and(tf.equal(tail[:-1], 0xFF), tf.equal(tail[1:], 0xD9))))
    png = tf.logical_and(tf.equal(head, b"\x89PNG\r\n\x1a\n"),
                         tf.equal(tf.strings.substr(encoded, tf.maximum(length - 8, 0), 8), _PNG_END))
    other = tf.logical_or(tf.equal(tf.strings.substr(head, 0, 4), b"GIF8"), tf.equal(tf.strings.substr(head, 0, 2), b"BM"))
    return tf.logical_or(jpeg, tf.logical_or(png, other))


def decoded_batches(encoded: tf.data.Dataset, parse, batch_size: int, image_size: int,
                    deterministic: bool) -> tf.data.Dataset:
    """`encoded_records` decoded and resized, in batches of up to `batch_size`: one batch from
    each window of `batch_size` consecutive records, so that the images come out in the records'
    order. Each batch is {image, label, id, file (index)} and `records`, how many records its
    window held; the difference is the images dropped.

    One thread decodes a whole window and copies each image into the batch straight after its
    decode, while it is still in that core's cache; the windows are decoded in parallel. A
    parallel map followed by a batch decodes that way only with nothing between the two, when
    tf.data fuses them, and dropping undecodable images needs `ignore_errors` between them.
    Unfused, every decoded image is handed to another thread and copied from memory into its
    batch: 1.24-1.28 CPU ms per image against 1.21 fused (benchmarks/input_pipeline.py's
    files, 2-core AMD EPYC family 26), where the lab's pipeline, which does less, takes 1.22.

    An image that cannot be decoded (not an image, cut short, corrupt) is dropped: its error is
    swallowed by `ignore_errors` within its window only, where TensorFlow logs it, and the window
    names it (`trainer: skipping undecodable image "ID"`). No check runs before the decode: its
    two dozen small ops cost more per image (about 3% of epoch 1 here) than it saves.
    """

    def decode(record, file_index):
        fields = parse(record)
        return {"image": decode_resize(fields["image"], image_size), "label": fields["label"], "id": fields["id"],
                "file": file_index}

    def decode_window(record_window, file_window):
        held = file_window.cardinality()
        batch = tf.data.Dataset.zip((record_window, file_window)).map(as_written(decode))
        batch = batch.ignore_errors(log_warning=True)
        batch = batch.batch(batch_size)
        # A window whose every image was dropped still sends a batch, empty: its count must arrive.
        empty = {key: tf.zeros((0, *spec.shape[1:]), spec.dtype) for key, spec in batch.element_spec.items()}
        batch = batch.concatenate(tf.data.Dataset.from_tensors(empty)).take(1)

        def name_dropped(decoded_ids):
            # Only when something was dropped: the window's ids are read again, the decoded ones
            # taken out, and the rest named, a line each.
            ids = tf.data.Dataset.zip(record_window).map(as_written(lambda record: parse(record)["id"]))
            ids = ids.batch(batch_size).get_single_element()
            dropped = tf.sets.difference(ids[tf.newaxis], decoded_ids[tf.newaxis]).values
            lines = tf.strings.reduce_join(tf.strings.join(['trainer: skipping undecodable image "', dropped, '"']),
                                           separator="\n")
            return tf.print(lines, output_stream=sys.stderr)

        def counted(b):
            named = tf.cond(tf.size(b["id"], out_type=tf.int64) < held, lambda: name_dropped(b["id"]), tf.no_op)
            with tf.control_dependencies([named]):  # kept: a tf.data function prunes what nothing uses
                return {**b, "records": tf.identity(held)}

        return batch.map(as_written(counted))

    # Each window's records are decoded by the one thread that runs its cycle: the window's map
    # must stay sequential, which make_dataset's options see to (map_parallelization off). One
    # window per core is in flight, so the decoded images held at once are cores x batch_size
    # (and the prefetched batches): 16 cores and 512 images of 300 px hold 2.2 GB.
    return encoded.window(batch_size).interleave(
        as_written(decode_window), cycle_length=tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic)


def checked_batches(batches: tf.data.Dataset, max_bad: int, num_classes: int,
                    names: tuple[str, ...]) -> tf.data.Dataset:
    """`decoded_batches` with their checks made, in order: a label outside [0, num_classes)
    fails the pipeline with an error naming the record's file (`label_outside_classes` reads
    it); more than `max_bad` images dropped in one pass fails it with TOO_MANY_BAD_EXAMPLES.
    Batches come out as {image, label, id}; empty ones are left out."""
    names = tf.constant(names)

    def check(dropped_so_far, batch):
        label = batch["label"]
        known = tf.logical_and(label >= 0, label < num_classes)
        unknown = tf.logical_not(known)
        # (Files dataset.json describes are not read before training, so this is where their
        # labels are checked.) Scalars, string and int32 only: such an Assert is one op, where
        # any other type makes it a conditional. Both are empty or 0 when every label is known.
        file_name = tf.strings.reduce_join(tf.gather(names, tf.boolean_mask(batch["file"], unknown)[:1]))
        first_unknown = tf.reduce_sum(tf.cast(tf.boolean_mask(label, unknown)[:1], tf.int32))
        labels_known = tf.debugging.Assert(tf.reduce_all(known), [LABEL_OUTSIDE_CLASSES, file_name, first_unknown])
        dropped = dropped_so_far + batch["records"] - tf.shape(label, out_type=tf.int64)[0]
        with tf.control_dependencies([labels_known]):  # a bad label is reported before the count
            within = tf.debugging.Assert(
                dropped <= max_bad, [f"{TOO_MANY_BAD_EXAMPLES}: more than {max_bad} in one pass (--max-bad-examples)"])
        # The outputs depend on both checks: a tf.data function may prune an op nothing uses.
        with tf.control_dependencies([labels_known, within]):
            return tf.identity(dropped), {"image": batch["image"], "label": tf.identity(label), "id": batch["id"]}

    checked = batches.scan(tf.constant(0, tf.int64), as_written(check))
    return checked.filter(as_written(lambda batch: tf.size(batch["label"]) > 0))


def too_many_bad_examples(error: BaseException) -> bool:
    return TOO_MANY_BAD_EXAMPLES in (getattr(error, "message", None) or str(error))


def label_outside_classes(error: BaseException) -> tuple[str, int] | None:
    """(file, label) from the pipeline's error for a label outside the classes, else None."""
    import re

    match = re.search(re.escape(LABEL_OUTSIDE_CLASSES) + r"\]\s*\[(.*?)\]\s*\[(-?\d+)\]",
                      getattr(error, "message", None) or str(error))
    return (match.group(1), int(match.group(2))) if match else None


# A JPEG header (1x1 pixel, no image data) that extract_jpeg_shape reads in place of an image
# that is not a JPEG, so the decoder can be chosen without a conditional (see decode_resize).
_HEADER_ONLY_JPEG = bytes.fromhex("ffd8" "ffc00011080001000103012200021101031101" "ffda000c03010002110311003f00" "ffd9")
_JPEG_RATIOS = (1, 2, 4, 8)


def decode_resize(encoded: tf.Tensor, size: int) -> tf.Tensor:
    """Image bytes -> uint8 [size, size, 3].

    A JPEG much larger than `size` is decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling),
    as long as its short side stays at least `size`, then resized. Decoding is the expensive
    step and the reduced decode is several times cheaper. Other formats (PNG in some TFDS
    builds) take the plain path. The decoder is one switch_case: in a tf.data function each
    conditional is a function call of tens of microseconds, and nested conditionals (format, then
    DCT scale) cost about a tenth of an image's decode (0.11 of 1.07 ms of CPU per 600x450 JPEG
    on one thread, 2-core AMD EPYC).
    """
    jpeg = tf.io.is_jpeg(encoded)
    shape = tf.image.extract_jpeg_shape(tf.raw_ops.Select(condition=jpeg, x=encoded, y=_HEADER_ONLY_JPEG))
    # The largest ratio that keeps the short side >= size: how many of 2, 4, 8 it allows.
    short_side = tf.minimum(shape[0], shape[1])
    scale = tf.reduce_sum(tf.cast(short_side >= tf.constant([r * size for r in _JPEG_RATIOS[1:]]), tf.int32))
    branches = [lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False)]
    branches += [lambda r=r: tf.io.decode_jpeg(encoded, channels=3, ratio=r) for r in _JPEG_RATIOS]
    image = tf.switch_case(tf.where(jpeg, 1 + scale, 0), branches)
    # Plain bilinear: after the DCT-scaled decode the remaining downscale is under 2x, where
    # bilinear is close to exact, and antialiasing would cost more than the decode itself.
    # On the uint8 image, which the kernel reads as float itself (the same pixels as casting
    # first, tested). A cast first writes a float32 copy of the whole decoded image, four times
    # its bytes. Alone on one thread the copy resizes sooner (0.37 against 0.42 ms per 600x450
    # image), but in the pipeline, two decoders sharing the memory bus, writing it costs more than
    # the kernel saves whenever memory is busy (perf, 2-core AMD EPYC family 26: resize and cast
    # 0.37-0.56 of the JPEG decode's CPU time, varying with the memory's load, against 0.31-0.37
    # for this). Over nine full runs of `resize_orders` in benchmarks/input_pipeline.py on that
    # machine, this order saved 0.14-0.30 CPU ms per image in four and lost 0.01-0.05 in five: a
    # small loss at worst, a large saving when memory is busy. Time both orders in the pipeline,
    # not on one thread, before changing this.
    resized = tf.image.resize(image, (size, size), method="bilinear")
    # Bilinear output stays within [0, 255]: +0.5 and truncation round it in one pass.
    return tf.cast(resized + 0.5, tf.uint8)


def make_dataset(
    split: Split, options: PipelineOptions, context: tf.distribute.InputContext | None = None
) -> tf.data.Dataset:
    """This worker's batches of (uint8 NHWC images, labels); training data repeats forever."""
    context = context or tf.distribute.InputContext()
    # Records are shuffled encoded, before decoding: the buffer holds JPEGs, a tenth of the decoded
    # images' bytes, and every image is batched straight after its decode (decoded_batches). From
    # a bucket too: there the buffer waits for the first blocks of the files in the cycle before
    # the first decode, yet this order is still faster than shuffling decoded images (epoch 1
    # against local disk, 0.88-0.94x against 0.81-0.88x at N=1, 2 and 4;
    # benchmarks/input_pipeline.py's files, alternating rounds, 2-core AMD EPYC family 25, Zen 3).
    batch_size = context.get_per_replica_batch_size(
        options.per_replica_batch_size * context.num_replicas_in_sync
    )
    encoded = encoded_records(split, context, options.training,
                              shuffle_buffer=options.shuffle_buffer if options.training else 0, seed=options.seed)
    dataset = decoded_batches(encoded, record_parser(split), batch_size, options.image_size,
                              deterministic=not options.training)
    dataset = checked_batches(dataset, options.max_bad_examples, split.num_classes, file_names(split))
    if options.cache:
        dataset = dataset.cache()  # of batches: the first pass's, as they come
    if options.training:
        # Every training batch holds exactly batch_size images (a static shape, as XLA and the
        # TPU-style input specs want): rebatch passes full batches through without a copy and
        # joins the short ones (a window with dropped images). The first pass's remainder
        # waits for a later pass.
        first_pass = dataset.rebatch(batch_size, drop_remainder=True)
        if options.cache:
            # Every later pass reshuffles the decoded images, read from the cache: the cached
            # batches in a new order, each new batch drawn from `mixed` of them at once, and a
            # last shuffle within the batch's worth. A shuffle buffer of single images would
            # first copy a whole buffer's worth out of the cached batches before its first
            # batch; this copies an image when it is needed (epoch 2 at N=4, 2-core AMD EPYC
            # family 26: 21,500 img/s against 12,400). Each image is still copied twice (out of
            # its batch, into the new one); a cache of single images makes later epochs faster
            # (53,000-68,000 img/s there) but costs epoch 1 a copy of every image from memory,
            # and epoch 1 is the one that decodes.
            mixed = max(1, options.shuffle_buffer // batch_size)
            later = dataset.shuffle(10_000, seed=options.seed, reshuffle_each_iteration=True).interleave(
                as_written(lambda batch: tf.data.Dataset.from_tensors(batch).unbatch()), cycle_length=mixed,
                block_length=1)
            later = later.shuffle(batch_size, seed=options.seed, reshuffle_each_iteration=True)
            dataset = first_pass.concatenate(later.repeat().batch(batch_size, drop_remainder=True))
        else:
            dataset = first_pass.repeat()  # the records are reshuffled on every pass
    if options.trace_path:
        dataset = dataset.map(as_written(_tracer(options.trace_path)))
    dataset = dataset.map(as_written(lambda b: (b["image"], b["label"])))

    dataset_options = tf.data.Options()
    # Sharding is done above, before decoding; tf.distribute must not shard again.
    dataset_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset_options.deterministic = not options.training
    # Parallelism comes from decoding many images at once; letting each resize also fan out over
    # the intra-op pool only adds contention on small machines.
    dataset_options.threading.max_intra_op_parallelism = 1
    # decoded_batches decodes each window on one thread: its map must not be made parallel.
    dataset_options.experimental_optimization.map_parallelization = False
    return dataset.with_options(dataset_options).prefetch(tf.data.AUTOTUNE)


def _tracer(path: str):
    def write(ids):
        with open(path, "a") as trace:
            trace.write("".join(i.decode() + "\n" for i in ids.numpy()))
        return 0

    def trace(batch):
        written = tf.py_function(write, [batch["id"]], Tout=tf.int32)
        with tf.control_dependencies([written]):
            return {**batch, "label": tf.identity(batch["label"])}

    return trace
