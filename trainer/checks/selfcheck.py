"""`python -m trainer.selfcheck`: proves an image on the machine it runs on, before a large job.

It prints TensorFlow and its build, the CUDA libraries TensorFlow will load (trainer.gpu_stack),
the driver and the devices. Then it trains, on generated images:
- a few ResNet50 steps (Conv2D + model.fit) in float32, and in the trainer's default precision
  (`--mixed-precision auto`), with XLA where a GPU exists, printing images/s for each;
- a small model with MultiWorkerMirroredStrategy in this one process over every local GPU (NCCL
  all-reduce), or over the CPU.
Any failure is one line on stderr and exit code 1; on a machine without a GPU it says so and runs
the CPU part. `scripts/submit_job.py vertex --self-check` runs it as a one-replica Vertex job, and
the `gpu` test tier (tests/gpu) runs it wherever a GPU is visible.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import time

from trainer import cli


def driver_version() -> str:
    """The NVIDIA driver's release and the CUDA version it supports, or why there is none."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "none (libcuda.so.1 not found: no NVIDIA driver in this container)"
    code = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(code)) != 0:
        return "libcuda.so.1 loads but cuDriverGetVersion failed"
    release = ""
    try:
        with open("/proc/driver/nvidia/version") as handle:
            release = next((w for w in handle.readline().split() if w[:1].isdigit() and "." in w), "")
    except OSError:
        pass
    return f"{release or '?'} (supports CUDA {code.value // 1000}.{code.value % 1000 // 10})"


def timed_images_per_second(model, images, labels, steps: int, steps_per_execution: int = 1) -> tuple[float, float]:
    """(train-step throughput on data already in memory, seconds of the first call). The first
    call compiles the step, and on a GPU the wheel has only PTX for (H100 and newer,
    docs/gpus.md) the driver JIT-compiles every kernel it runs: that is its start-up cost."""
    import tensorflow as tf

    # Autotuning off: with it on, tearing down fit's iterator often waited for the autotuning
    # thread's next wake-up (10 ms x (2^k - 1) after the start), which set the measured rate
    # (benchmarks/train_step.py's in_memory_batches has the measurements); one repeated batch has
    # nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat().with_options(options)
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps_per_execution, epochs=1, verbose=0, shuffle=False)
    first = time.perf_counter() - start
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
    return steps * int(images.shape[0]) / (time.perf_counter() - start), first


def generated_batch(batch: int, image_size: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(batch, image_size, image_size, 3), dtype=np.uint8)
    return images, rng.integers(0, 5, size=(batch,))


def resnet50_classifier(image_size: int, classes: int = 5):
    """Keras' stock ResNet50 over uint8 images, float32 softmax: the convolutions, batch norms
    and GEMMs a vision job runs, with nothing of any one example's model."""
    import keras

    # keras.ops, not tf.cast: a Keras 3 functional model's inputs are symbolic KerasTensors.
    images = keras.Input((image_size, image_size, 3), dtype="uint8")
    features = keras.applications.ResNet50(include_top=False, weights=None, pooling="avg",
                                           input_shape=(image_size, image_size, 3))(keras.ops.cast(images, "float32"))
    return keras.Model(images, keras.layers.Dense(classes, activation="softmax", dtype="float32")(features))


def small_classifier(image_size: int, classes: int = 5):
    """A few convolutions: enough to run a real multi-worker step in seconds."""
    import keras

    images = keras.Input((image_size, image_size, 3), dtype="uint8")
    x = keras.ops.cast(images, "float32") / 255.0
    for filters in (16, 32):
        x = keras.layers.Conv2D(filters, 3, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(images, keras.layers.Dense(classes, activation="softmax", dtype="float32")(x))


def timed_trainer_throughput(policy: str, jit_compile: bool, batch: int, image_size: int, steps: int,
                             steps_per_execution: int = 1) -> tuple[float, float]:
    """A ResNet50 train step's throughput in `policy`, and the seconds its first (compiling) call took."""
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        model = resnet50_classifier(image_size)
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy",
                      steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        images, labels = generated_batch(batch, image_size)
        return timed_images_per_second(model, images, labels, steps, steps_per_execution)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def local_multi_worker_fit(strategy, steps: int = 3) -> tuple[int, float]:
    """A few steps of the small model under `strategy`: (replicas, final loss)."""
    import tensorflow as tf

    global_batch = 4 * strategy.num_replicas_in_sync
    images, labels = generated_batch(global_batch, 32, seed=1)
    with strategy.scope():
        model = small_classifier(32)
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    history = model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
    return strategy.num_replicas_in_sync, float(history.history["loss"][-1])


def check(args) -> list[str]:
    """Prints the report; returns the problems found (empty when the image is fit to train)."""
    import tensorflow as tf

    from trainer import precision
    from trainer.checks import gpu_stack

    # MultiWorkerMirrored configures the collective runtime, which is fixed once any op has run,
    # so it is created before anything else runs (with no TF_CONFIG: one worker, local devices).
    os.environ.pop("TF_CONFIG", None)
    multi_worker = tf.distribute.MultiWorkerMirroredStrategy()
    found_problems: list[str] = []
    build = tf.sysconfig.get_build_info()
    if build.get("is_cuda_build"):
        stack = gpu_stack.probe()
        for line in gpu_stack.describe(stack):
            print(line)
        found_problems += gpu_stack.problems(stack)
    else:
        print(f"tensorflow {tf.__version__}: CPU build")
    print(f"driver: {driver_version()}")
    gpus = tf.config.list_physical_devices("GPU")
    devices = precision.local_devices(gpus)
    if gpus:
        for gpu, capability in zip(gpus, devices.gpu_capabilities):
            name = tf.config.experimental.get_device_details(gpu).get("device_name", "?")
            print(f"device: {gpu.name} {name}, compute capability {capability[0]}.{capability[1]}")
    else:
        print(f"device: no GPU visible; the CPU part runs ({devices.describe()})")
    if found_problems:
        return found_problems

    default = precision.choose("auto", devices)
    print(f"precision: --mixed-precision auto picks {default.policy} ({default.reason})")
    runs = [("float32", "float32", False)]
    if gpus:
        runs.append((f"{default.policy} + XLA", default.policy, True))
    elif default.policy != "float32":
        runs.append((default.policy, default.policy, False))
    batch = args.batch or (32 if gpus else 8)
    baseline = None
    for label, policy, jit in runs:
        rate, first = timed_trainer_throughput(policy, jit, batch, args.image_size, args.steps)
        baseline = baseline or rate
        print(f"resnet50 train step, {label:24s} {rate:9.1f} images/s  x{rate / baseline:.2f}"
              f"  (batch {batch}, {args.image_size} px, {args.steps} steps; first step {first:.1f} s, compiling)")
    replicas, loss = local_multi_worker_fit(multi_worker)
    if not loss == loss:  # NaN
        return [f"multi_worker_mirrored over {replicas} local replicas trained to a NaN loss"]
    print(f"multi_worker_mirrored: 1 worker, {replicas} local replica(s) "
          f"({'GPUs, NCCL' if gpus else 'CPU'}), 3 steps, loss {loss:.4f}")
    return []


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python -m trainer.selfcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=cli.positive_int, default=5, help="timed train steps per configuration")
    parser.add_argument("--batch", type=cli.positive_int, default=None, help="images per step (default 32 on a GPU, 8 on a CPU)")
    parser.add_argument("--image-size", type=int, default=224, help="square input size in pixels")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        found_problems = check(args)
    except Exception as error:  # noqa: BLE001 - any failure is the answer, in one line
        first = (getattr(error, "message", None) or str(error) or type(error).__name__).strip().splitlines()[0]
        print(f"trainer.selfcheck: error: {type(error).__name__}: {first[:300]}", file=sys.stderr)
        return 1
    if found_problems:
        print(f"trainer.selfcheck: error: {'; '.join(found_problems)}", file=sys.stderr)
        return 1
    print("selfcheck ok")
    return 0
