"""Input pipeline benchmark: the lab's pipeline against the trainer's, per simulated worker.

    python benchmarks/input_pipeline.py [--quick] [--images N] [--repeats R] [--workers 1,2,4] [--no-bucket]
                                        [--no-stages] [--latency-ms MS] [--results-dir DIR]

One process, the same generated TFRecords (600x450 JPEG, quality 90) for every measurement.
For N = 1, 2 and 4 simulated workers it times worker 0 with:
  baseline  the lab's pipeline (see `lab_pipeline`), DATA sharding;
  trainer   cassava.data.make_dataset, as training uses it (cache on);
  limit     decoding worker 0's share of the JPEGs and nothing else;
  bucket    the trainer's pipeline reading the same files from a Cloud Storage bucket: the local
            server (scripts/rehearsal/local_gcs/, in a process of its own) delays every request by
            --latency-ms, Cloud Storage's time to first byte, and TensorFlow's own GCS client
            reads through it. The server shares the 2 cores with the pipeline (real Cloud
            Storage costs the machine nothing), so this ratio is a lower bound.
Epochs 1 and 2 are timed separately; after a warm-up round, each measurement is repeated and the
median reported. A second table builds the trainer's pipeline up one stage at a time at N=1 and
gives each stage's cost in epoch 1 (`stage_pipelines`); a line after it times the resize on the
decoded uint8 image against the same resize on a float32 copy, in the pipeline (`resize_orders`).
The tables go to stdout and to benchmarks/results/input_pipeline/KIND.md, one file per machine
kind (benchmarks/machine.py), with a line saying whether the trainer meets its targets (epoch 1 at
least the lab's at every N; later epochs at least 20x the lab's at the largest N); the last line is
a machine-readable summary. The raw measurements go to KIND.json beside it, from which report()
writes the file again; each worker count's rows say what other processes used while they ran. A line gives the decode-only pipeline's rate as a share of the
machine's decode limit: one thread's JPEG decode rate, timed in the same run, times the cores.
"""

from __future__ import annotations

import datetime
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer import cli  # noqa: E402
from trainer.process import stopping  # noqa: E402
from trainer.runtime import storage  # noqa: E402

# What cassava.task sets before TensorFlow starts: the GCS client reads these when TensorFlow
# loads, so setting them later (say, when the bucket is made) leaves the client on its defaults
# and measures a client the trainer never runs.
for _key, _value in storage.CLIENT_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)

import tensorflow as tf  # noqa: E402

from cassava import data, records, synthetic  # noqa: E402
# benchmarks/ is first on the path when this runs as a script
import rounds  # noqa: E402
from machine import RESULTS_ROOT, command_line, cpu_model, write_results  # noqa: E402

IMAGE_SIZE = 300
BATCH = 64
SHUFFLE_BUFFER = 1024  # the trainer's default (--shuffle-buffer)
NUM_FILES = 16
IMAGE_SHAPE = (450, 600)  # height, width
# Cloud Storage's time to first byte for a small read in the same region is tens of
# milliseconds; 30 ms, on every request, metadata included.
BUCKET_LATENCY_MS = 30.0


def lab_pipeline(files: list[str], num_workers: int, worker: int) -> tf.data.Dataset:
    """The lab's input pipeline (seed 001) on one of `num_workers` MultiWorkerMirrored workers.

    Every example is decoded, resized to 300x300 as float32 and scaled to [0, 1] on the host,
    shuffled (buffer 1000) and batched by the global batch (64 per replica, one replica per
    worker), then prefetched. The lab sets AutoShardPolicy.DATA; what that does to this graph is
    rebuilt here by hand, as tf.data's auto-shard rewrite does it (ShardByData in
    tensorflow/core/grappler/optimizers/data/auto_shard.cc): the global batches are split into
    per-replica batches and the shard goes at the very end, before the prefetch. So every worker
    decodes, resizes, shuffles and batches the whole dataset and keeps every N-th batch.
    """

    def preprocess(serialized):
        example = tf.io.parse_single_example(serialized, data.RECORD_FEATURES)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.image.resize(image, (IMAGE_SIZE, IMAGE_SIZE))
        return tf.cast(image, tf.float32) / 255.0, example["label"]

    dataset = tf.data.TFRecordDataset(files).map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.shuffle(1000).batch(BATCH * num_workers)
    dataset = dataset.rebatch(BATCH).shard(num_workers, worker)  # what AutoShardPolicy.DATA amounts to
    return dataset.prefetch(tf.data.AUTOTUNE)


def decode_limit(files: list[str], num_workers: int, worker: int) -> tf.data.Dataset:
    """Only the unavoidable work: decode this worker's own files."""
    own = files[worker::num_workers]
    dataset = tf.data.TFRecordDataset(own, num_parallel_reads=len(own))
    return dataset.map(
        lambda s: tf.shape(tf.io.decode_jpeg(tf.io.parse_single_example(s, data.RECORD_FEATURES)["image"], channels=3))[0],
        num_parallel_calls=tf.data.AUTOTUNE,
    ).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def single_thread_ms(encoded: tf.Tensor, fn, repeats: int = 3) -> float:
    """Best-of-`repeats` milliseconds per image of `fn` on one thread, tf.data overhead included."""
    dataset = tf.data.Dataset.from_tensor_slices(encoded).map(fn)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    dataset = dataset.with_options(options)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        count = sum(1 for _ in dataset)
        best = min(best, (time.perf_counter() - start) * 1e3 / count)
    return best


def host_resize_ceiling(files: list[str], images: int = 128) -> tuple[float, float, float]:
    """What resizing on the host costs, whatever the pipeline around it.

    Times one thread decoding `images` JPEGs, and decoding plus resizing them as the trainer does
    (cassava.data.decode_resize). Their ratio bounds epoch 1 of ANY pipeline that resizes on the
    host against the decode-only limit, before caching, augmenting or batching cost anything.
    Returns (decode ms, decode and resize ms, ceiling).
    """
    encoded = tf.stack([
        tf.io.parse_single_example(record, data.RECORD_FEATURES)["image"]
        for record in tf.data.TFRecordDataset(files).take(images)
    ])
    # One pixel of the result, so that graph optimisation cannot prune the work (a resize's shape
    # is known without running it).
    decode_ms = single_thread_ms(encoded, lambda e: tf.io.decode_jpeg(e, channels=3)[0, 0, 0])
    resize_ms = single_thread_ms(encoded, lambda e: data.decode_resize(e, IMAGE_SIZE)[0, 0, 0])
    return decode_ms, resize_ms, decode_ms / resize_ms


def decode_machine_limit(results: dict, decode_ms: float, cores: int) -> tuple[str, dict[int, float]]:
    """The decode-only pipeline's rate (the `limit` row, every core) against what the machine can
    decode: one thread's JPEG decode rate, timed in this run (host_resize_ceiling), times the
    cores. Below 1, tf.data leaves cores idle or spends them on something besides decoding.
    Returns the line and, per N, that share."""
    one_core = 1e3 / decode_ms
    shares = {n: r["limit"][0] / (one_core * cores) for n, r in sorted(results.items())}
    line = (f"The machine's decode limit: one thread decodes {one_core:,.0f} img/s (timed above), times {cores} cores "
            f"= {one_core * cores:,.0f} img/s. The decode-only pipeline reaches " + ", ".join(
                f"x{share:.2f} of it at N={n} ({results[n]['limit'][0]:,.0f} img/s)" for n, share in shares.items())
            + "; the trainer's epoch 1 " + ", ".join(
                f"x{results[n]['trainer'][0] / (one_core * cores):.2f} at N={n}" for n in shares) + ".")
    return line, shares


def timed_epochs(dataset: tf.data.Dataset, batches_per_epoch: int, epochs: int) -> list[tuple[float, int]]:
    """Seconds and examples for each of `epochs` consecutive epochs of one iterator over `dataset`.

    The iterator is destroyed before this returns. A live one keeps its background threads
    filling buffers (the lab's 1,000-image shuffle buffer, every prefetch), which would run on
    the same cores as the next configuration's measured epoch.
    """
    iterator = iter(dataset)
    results = []
    for _ in range(epochs):
        start, examples = time.perf_counter(), 0
        for _ in range(batches_per_epoch):
            element = next(iterator)
            labels = element[1] if isinstance(element, tuple) else element
            examples += int(tf.shape(labels)[0])
        results.append((time.perf_counter() - start, examples))
    del iterator
    gc.collect()
    return results


def measure(files, num_images, num_workers, repeats, bucket_files=None):
    share = num_images // num_workers
    batches = share // BATCH
    split = data.Split(name="train", num_examples=num_images, class_names=synthetic.CLASS_NAMES, files=tuple(files))
    options = data.PipelineOptions(image_size=IMAGE_SIZE, per_replica_batch_size=BATCH, training=True, cache=True, seed=0)
    context = tf.distribute.InputContext(num_input_pipelines=num_workers, input_pipeline_id=0, num_replicas_in_sync=num_workers)
    rows = {"baseline": ([], []), "trainer": ([], []), "limit": ([], [])}
    if bucket_files:
        rows["bucket"] = ([], [])
        bucket_split = data.Split(name="train", num_examples=num_images, class_names=synthetic.CLASS_NAMES,
                                  files=tuple(bucket_files))
    # Round 0 is a warm-up and is not recorded. It pays the process's one-time costs, which belong
    # to no epoch: tracing, thread pools, and first-touch page faults on fresh memory (the lab's
    # shuffle buffer alone is 1,000 float32 images, about 1 GB, and its first pass is about 3x
    # slower than the next on these 2-core VMs).
    for round_index in range(repeats + 1):
        for name in rows:
            if name == "baseline":
                dataset = lab_pipeline(files, num_workers, 0)
                epoch_results = [timed_epochs(dataset, batches, 1)[0] for _ in range(2)]  # re-iterated: decodes again
            elif name == "trainer":
                epoch_results = timed_epochs(data.make_dataset(split, options, context), batches, 2)
            elif name == "bucket":
                epoch_results = timed_epochs(data.make_dataset(bucket_split, options, context), batches, 2)
            else:
                epoch_results = timed_epochs(decode_limit(files, num_workers, 0), batches, 1) * 2
            for epoch, (seconds, examples) in enumerate(epoch_results):
                if round_index > 0:
                    rows[name][epoch].append(examples / seconds)
    return {name: tuple(statistics.median(v) for v in epochs) for name, epochs in rows.items()}


def finish(dataset: tf.data.Dataset, tuned: bool, batched: bool = False) -> tf.data.Dataset:
    """Batches of decoded images as training takes them (`batched`: already batched); `tuned` adds
    the trainer's tf.data options."""
    if not batched:
        dataset = dataset.batch(BATCH, drop_remainder=True)
    dataset = dataset.map(lambda b: ({"image": b["image"]}, b["label"]))
    if tuned:
        options = tf.data.Options()
        options.threading.max_intra_op_parallelism = 1
        options.experimental_optimization.map_parallelization = False
        dataset = dataset.with_options(options)
    return dataset.prefetch(tf.data.AUTOTUNE)


def stage_pipelines(split: data.Split) -> list[tuple[str, object]]:
    """The trainer's pipeline for one worker, built up one stage at a time from the pieces in
    cassava.data, the last being make_dataset itself: what each stage costs in epoch 1 is the drop
    from the row before. The first three decode in a parallel map fused with its batch, which
    cannot drop an undecodable image; the fourth decodes per window, as the trainer does."""
    context = tf.distribute.InputContext()

    def decoded(tuned: bool, shuffle_buffer: int = 0):
        records = data.records(split, context, training=True, shuffle_buffer=shuffle_buffer, seed=0)
        dataset = records.map(lambda r: {"image": data.decode_resize(r["image"], IMAGE_SIZE), "label": r["label"]},
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        return finish(dataset, tuned)

    def windowed(cache: bool):
        encoded = data.encoded_records(split, context, training=True, shuffle_buffer=SHUFFLE_BUFFER, seed=0)
        batches = data.decoded_batches(encoded, data.record_parser(split), BATCH, IMAGE_SIZE, deterministic=False)
        batches = data.checked_batches(batches, 100, split.num_classes, data.file_names(split))
        if cache:
            batches = batches.cache().rebatch(BATCH, drop_remainder=True)
        return finish(batches, tuned=True, batched=True)

    options = data.PipelineOptions(image_size=IMAGE_SIZE, per_replica_batch_size=BATCH, training=True, cache=True,
                                   shuffle_buffer=SHUFFLE_BUFFER, seed=0)
    return [
        ("read, decode and resize (tf.data defaults)", lambda: decoded(tuned=False)),
        ("+ one intra-op thread per element", lambda: decoded(tuned=True)),
        ("+ shuffle the encoded records", lambda: decoded(tuned=True, shuffle_buffer=SHUFFLE_BUFFER)),
        ("+ decoded per window, undecodable images dropped and counted", lambda: windowed(cache=False)),
        ("+ cache", lambda: windowed(cache=True)),
        ("+ later passes reshuffled from the cache: the trainer's pipeline",
         lambda: data.make_dataset(split, options, context)),
    ]


def stage_costs(files: list[str], num_images: int, repeats: int) -> list[tuple[str, float]]:
    """Epoch 1 images/s of each stage pipeline at N=1: the median of `repeats` rounds after a warm-up."""
    split = data.Split(name="train", num_examples=num_images, class_names=synthetic.CLASS_NAMES, files=tuple(files))
    stages = stage_pipelines(split)
    rates: dict[str, list[float]] = {name: [] for name, _ in stages}
    batches = num_images // BATCH
    for round_index in range(repeats + 1):
        for name, build in stages:  # alternating, so that drift hits every stage alike
            seconds, examples = timed_epochs(build(), batches, 1)[0]
            if round_index:
                rates[name].append(examples / seconds)
    return [(name, statistics.median(values)) for name, values in rates.items()]


def resize_orders(files: list[str], num_images: int, repeats: int) -> dict[str, tuple[float, float]]:
    """The two orders of the host resize, in the pipeline at N=1: bilinear on the decoded uint8
    image (the trainer's, cassava.data.decode_resize) and on a float32 copy of it. They give the
    same pixels; which is cheaper depends on the CPU and its memory. One thread alone resizes the
    copy sooner, but the copy is four times the decoded image's bytes, and with decoders sharing
    the memory bus writing it can cost more than the kernel saves (it does on the EPYC family 26),
    so both are timed here as the pipeline runs them. Returns name -> (epoch 1 images/s, CPU ms
    per image), each the median of `repeats` alternating rounds after a warm-up. (The benchmark's
    JPEGs need no DCT scaling at this size, so both decode plainly.)"""
    orders = {
        "uint8": lambda image: tf.image.resize(image, (IMAGE_SIZE, IMAGE_SIZE)),
        "float32 copy": lambda image: tf.image.resize(tf.cast(image, tf.float32), (IMAGE_SIZE, IMAGE_SIZE)),
    }
    split = data.Split(name="train", num_examples=num_images, class_names=synthetic.CLASS_NAMES, files=tuple(files))

    def pipeline(resize):
        def decode(record):
            image = tf.io.decode_jpeg(record["image"], channels=3)
            return {"image": tf.cast(resize(image) + 0.5, tf.uint8), "label": record["label"]}

        dataset = data.records(split, tf.distribute.InputContext(), training=True, shuffle_buffer=SHUFFLE_BUFFER, seed=0)
        return finish(dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False), tuned=True)

    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in orders}
    for round_index in range(repeats + 1):
        for name, resize in orders.items():
            cpu_before = rounds.own_cpu_seconds()
            seconds, examples = timed_epochs(pipeline(resize), num_images // BATCH, 1)[0]
            if round_index:
                measured[name].append((examples / seconds, (rounds.own_cpu_seconds() - cpu_before) * 1e3 / examples))
    return {name: (statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs))
            for name, runs in measured.items()}


# What the trainer's pipeline must reach against the lab's: epoch 1 at least the lab's at every N,
# later epochs (decoded images cached) at least this many times the lab's at the largest N.
LATER_EPOCH_TARGET = 20.0


def targets(results: dict) -> str:
    """One line saying whether the trainer met both targets, with the figures that decide it."""
    epoch1 = {n: r["trainer"][0] / r["baseline"][0] for n, r in sorted(results.items())}
    largest = max(results)
    later = results[largest]["trainer"][1] / results[largest]["baseline"][1]
    first_ok = all(ratio >= 1.0 for ratio in epoch1.values())
    return (f"Epoch 1 at least the lab's at every N: {'yes' if first_ok else 'NO'} ("
            + ", ".join(f"N={n}: x{ratio:.2f}" for n, ratio in epoch1.items())
            + f"). Epoch 2 at N={largest}: x{later:.1f} the lab's "
            f"({'meets' if later >= LATER_EPOCH_TARGET else 'MISSES'} the x{LATER_EPOCH_TARGET:.0f} target).")


# Epoch 1 from a bucket against the same pipeline on local disk.
BUCKET_TARGET = 0.8


def bucket_verdict(results: dict) -> str:
    ratios = {n: r["bucket"][0] / r["trainer"][0] for n, r in sorted(results.items()) if "bucket" in r}
    ok = all(ratio >= BUCKET_TARGET for ratio in ratios.values())
    return (f"Epoch 1 from the bucket against local disk, at least x{BUCKET_TARGET}: {'yes' if ok else 'NO'} ("
            + ", ".join(f"N={n}: x{ratio:.2f}" for n, ratio in ratios.items()) + ").")


class BucketCopy:
    """The benchmark's files in a bucket of the local Cloud Storage server, which runs in a
    process of its own; this process's environment is pointed at it before TensorFlow's GCS
    client first starts (it reads its settings then)."""

    def __init__(self, latency_ms: float):
        import subprocess

        self.server = subprocess.Popen(
            [sys.executable, "-m", "scripts.rehearsal.local_gcs", "--bucket", "bench", "--latency-ms", str(latency_ms)],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), stdout=subprocess.PIPE, text=True)
        for line in self.server.stdout:
            if line.startswith("export "):
                key, _, value = line[len("export "):].strip().partition("=")
                os.environ[key] = value
            if "Ctrl-C" in line:
                break
        else:
            raise RuntimeError("scripts/rehearsal/local_gcs/ did not start")
        self.latency_ms = latency_ms

    def upload(self, files: list[str]) -> list[str]:
        copies = [f"gs://bench/{os.path.basename(path)}" for path in files]
        for path, copy in zip(files, copies):
            tf.io.gfile.copy(path, copy, overwrite=True)
        return copies

    def stop(self) -> None:
        stopping.stop([self.server], 30)


def generate(directory: str, num_images: int) -> list[str]:
    marker = os.path.join(directory, f"complete-{num_images}")
    if not os.path.exists(marker):
        tf.io.gfile.rmtree(directory) if tf.io.gfile.exists(directory) else None
        print(f"generating {num_images} images of {IMAGE_SHAPE[1]}x{IMAGE_SHAPE[0]} in {directory} ...", flush=True)
        records.write_shards(synthetic.examples(num_images, 0, "bench", IMAGE_SHAPE), directory, "train", NUM_FILES)
        open(marker, "w").close()
    return sorted(tf.io.gfile.glob(f"{directory}/train-*.tfrecord"))


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python benchmarks/input_pipeline.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1024 images, 3 repeats")
    parser.add_argument("--images", type=int, default=None, help="images to generate (default 2048)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 5)")
    parser.add_argument("--data-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "cassava-trainer", "bench"))
    parser.add_argument("--results-dir", default=RESULTS_ROOT, metavar="DIR",
                        help="results root: the tables go to DIR/input_pipeline/KIND.md ('' for nowhere; "
                             "default benchmarks/results)")
    parser.add_argument("--workers", default="1,2,4", help="simulated worker counts")
    parser.add_argument("--no-bucket", action="store_true", help="leave out the rows read from a bucket")
    parser.add_argument("--no-stages", action="store_true", help="leave out the per-stage breakdown and the resize orders at N=1")
    parser.add_argument("--latency-ms", type=float, default=BUCKET_LATENCY_MS,
                        help=f"delay of every request to the bucket (default {BUCKET_LATENCY_MS:.0f})")
    args = parser.parse_args(argv)
    num_images = args.images or (1024 if args.quick else 2048)
    repeats = args.repeats or (3 if args.quick else 5)
    files = generate(os.path.join(args.data_dir, f"n{num_images}"), num_images)
    print(f"machine: {cpu_model()}", flush=True)
    raw = measure_all(files, num_images, repeats, [int(n) for n in args.workers.split(",")],
                      None if args.no_bucket else args.latency_ms, stages=not args.no_stages)
    body = report(raw)
    print(body, flush=True)
    if args.results_dir:
        path = write_results("input_pipeline", command_line("input_pipeline.py", argv),
                             datetime.date.today().isoformat(), body, args.results_dir, raw=raw)
        print(f"results: {path}", flush=True)
    print(summary_line(raw))
    return 0


def measure_all(files: list[str], num_images: int, repeats: int, workers: list[int], latency_ms: float | None,
                stages: bool) -> dict:
    """Every measurement of one run, as JSON values: report() writes the results file from these
    alone. Each worker count's rows carry what the rest of the machine did while they were timed
    (benchmarks/rounds.py's `others` and `steal`, and the 1-minute load average at their end)."""
    raw = {"tensorflow": tf.__version__, "images": num_images, "image_shape": list(IMAGE_SHAPE), "batch": BATCH,
           "image_size": IMAGE_SIZE, "repeats": repeats, "cpus": os.cpu_count() or 1, "latency_ms": latency_ms,
           "load_before": os.getloadavg()[0], "workers": {}, "stages": [], "resize_orders": []}
    bucket = bucket_files = None
    if latency_ms is not None:
        bucket = BucketCopy(latency_ms)
        try:
            bucket_files = bucket.upload(files)
        except BaseException:
            bucket.stop()
            raise
    try:
        for num_workers in workers:
            timer = rounds.Timer().start()
            rates = measure(files, num_images, num_workers, repeats, bucket_files)
            sample = timer.sample(0)
            raw["workers"][str(num_workers)] = {
                # pairs, not a dict: the .json is written with sorted keys, and the rows keep this order
                "rates": [[name, list(epochs)] for name, epochs in rates.items()],
                "others": sample.others, "steal": sample.steal, "load_average": os.getloadavg()[0]}
            print(f"N={num_workers}: " + ", ".join(f"{name} {e1:,.0f}/{e2:,.0f} img/s" for name, (e1, e2) in rates.items())
                  + f"; others' cores {sample.others:.2f}", flush=True)
    finally:
        if bucket:
            bucket.stop()
    if stages:
        raw["stages"] = [[name, rate] for name, rate in stage_costs(files, num_images, repeats)]
        raw["resize_orders"] = [[name, list(values)] for name, values in resize_orders(files, num_images, repeats).items()]
    raw["decode_ms"], raw["resize_ms"], _ = host_resize_ceiling(files)
    raw["load_after"] = os.getloadavg()[0]
    return raw


def worker_results(raw: dict) -> dict[int, dict[str, tuple[float, float]]]:
    """N -> pipeline -> (epoch 1, epoch 2) images/s, from the raw data."""
    return {int(n): {name: tuple(epochs) for name, epochs in row["rates"]}
            for n, row in sorted(raw["workers"].items(), key=lambda item: int(item[0]))}


def summary_line(raw: dict) -> str:
    """The machine-readable last line."""
    results = worker_results(raw)
    _, shares = decode_machine_limit(results, raw["decode_ms"], raw["cpus"])
    largest = max(results)
    r = results[largest]
    return ("summary: " + " ".join(f"n{n}_epoch1_speedup={results[n]['trainer'][0] / results[n]['baseline'][0]:.2f}"
                                   for n in sorted(results))
            + f" n{largest}_epoch2_speedup={r['trainer'][1] / r['baseline'][1]:.2f}"
            f" n{largest}_decode_limit_fraction={r['trainer'][0] / r['limit'][0]:.2f}"
            + "".join(f" n{n}_decode_share_of_cores={shares[n]:.2f}" for n in sorted(results))
            + "".join(f" n{n}_bucket_vs_disk={results[n]['bucket'][0] / results[n]['trainer'][0]:.2f}"
                      for n in sorted(results) if "bucket" in results[n]))


def report(raw: dict) -> str:
    """The results file's body, from the run's raw measurements alone (measure_all's)."""
    results = worker_results(raw)
    lines = ["| workers | pipeline | epoch 1 img/s | epoch 2 img/s | others' cores | load average |", "|---|---|---|---|---|---|"]
    for n, rates in results.items():
        row = raw["workers"][str(n)]
        for name, (epoch1, epoch2) in rates.items():
            lines.append(f"| {n} | {name} | {epoch1:,.0f} | {epoch2:,.0f} | {row['others']:.2f} | {row['load_average']:.1f} |")
    stages = raw["stages"]
    stage_lines = ["| stage (N=1, epoch 1) | img/s | cost against the row before |", "|---|---|---|"]
    for index, (name, rate) in enumerate(stages):
        cost = "" if index == 0 else f"{(1 / rate - 1 / stages[index - 1][1]) * 1e3:+.3f} ms/image"
        stage_lines.append(f"| {name} | {rate:,.0f} | {cost} |")
    resize_line = ""
    if raw["resize_orders"]:
        resize_line = ("Resize in the pipeline (N=1, epoch 1): " + "; ".join(
            f"from {name} {rate:,.0f} img/s, {cpu_ms:.3f} CPU ms/image"
            for name, (rate, cpu_ms) in raw["resize_orders"]) + ".")
    decode_ms, resize_ms = raw["decode_ms"], raw["resize_ms"]
    ceiling_line = (f"One thread: decode {decode_ms:.2f} ms/image, decode and resize to {raw['image_size']} px "
                    f"{resize_ms:.2f} ms/image, so a pipeline that resizes on the host reaches at most "
                    f"{decode_ms / resize_ms:.2f} of the decode-only limit.")
    machine_line, _ = decode_machine_limit(results, decode_ms, raw["cpus"])
    verdict = targets(results)
    if raw["latency_ms"] is not None:
        verdict += f"\n\n{bucket_verdict(results)} Every request to the bucket waited {raw['latency_ms']:.0f} ms."
    width, height = raw["image_shape"][1], raw["image_shape"][0]
    load = (f"The machine's 1-minute load average was {raw['load_before']:.1f} before the first measurement and "
            f"{raw['load_after']:.1f} after the last, on {raw['cpus']} CPUs; `others' cores` is what other processes "
            f"used while that worker count's rows were timed (0 on a quiet machine).")
    return (f"TensorFlow {raw['tensorflow']}; {raw['images']} JPEGs of {width}x{height}, batch {raw['batch']}, "
            f"{raw['image_size']} px, median of {raw['repeats']}. Images per second for worker 0. {load}\n\n"
            + "\n".join(lines)
            + ("\n\n" + "\n".join(stage_lines) if stages else "")
            + (f"\n\n{resize_line}" if resize_line else "")
            + f"\n\n{ceiling_line}\n\n{machine_line}\n\n{verdict}\n\n`{summary_line(raw)}`")


if __name__ == "__main__":
    sys.exit(main())
