"""Pretrained ResNet50 weights made here, for benchmarks that compare fine-tuning where ImageNet's
weights cannot be downloaded.

    python benchmarks/pretrain.py [--image-size 64] [--steps 600] [--batch 32] [--cache-dir DIR]

ResNet50 (no top, average pooling, as the trainer and the lab build it) is trained from random
weights on a generated task that is not the cassava-like evaluation task: 8 classes of textures
and shapes (stripes in four orientations, checks, rings, spots, smooth noise), each in random
colours, frequencies and phases, drawn fresh for every batch. Its inputs get the preprocessing
Keras' ImageNet ResNet50 weights expect (`keras.applications.resnet50.preprocess_input`, "caffe":
RGB to BGR, the ImageNet mean subtracted, no scaling), so a recipe meets these weights as it
would meet ImageNet's: the trainer, which preprocesses that way, as it would; the lab's recipe,
which feeds [0, 1], with the same mismatch it has against ImageNet's weights.

The weights (an .h5 of the no-top ResNet50, which `ResNet50(weights=FILE)` and the trainer's
`--weights FILE` load) go to a cache outside the repository, keyed by every setting that changes
them, with a .json beside them saying what they cost (seconds, CPU seconds, images, machine) and
how well they learned their own task (accuracy on a held-out generated set). `ensure()` makes them
once; later runs reuse them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "cassava-trainer", "pretrained")
CLASSES = ("horizontal stripes", "vertical stripes", "diagonal stripes", "anti-diagonal stripes", "checks", "rings",
           "spots", "smooth noise")
FORMAT_VERSION = 2  # 2: written by tf-keras, read by tf-keras and Keras 3


def weights_path(cache_dir: str, image_size: int, steps: int, batch: int, seed: int) -> str:
    name = f"resnet50-shapes-v{FORMAT_VERSION}-{image_size}px-{steps}x{batch}-seed{seed}.h5"
    return os.path.join(cache_dir, name)


def ensure(cache_dir: str = CACHE_DIR, image_size: int = 64, steps: int = 600, batch: int = 32, seed: int = 7,
           log=print) -> tuple[str, dict]:
    """The weights file and what making it cost (its .json), pretraining first if needed, in a
    process of its own (its precision policy and memory stay out of the caller's)."""
    path = weights_path(cache_dir, image_size, steps, batch, seed)
    if not (os.path.exists(path) and os.path.exists(path + ".json")):
        log(f"pretraining ResNet50 on generated shapes ({steps} steps of {batch} at {image_size} px) into {path} ...")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--image-size", str(image_size), "--steps", str(steps),
                        "--batch", str(batch), "--seed", str(seed), "--cache-dir", cache_dir],
                       check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    with open(path + ".json") as handle:
        return path, json.load(handle)


def generated_batches(image_size: int, batch: int, seed: int):
    """An endless dataset of (uint8 RGB images, labels), every image drawn afresh."""
    import tensorflow as tf

    size = image_size
    ys, xs = tf.meshgrid(tf.range(size, dtype=tf.float32), tf.range(size, dtype=tf.float32), indexing="ij")

    def image(index):
        seeds = tf.random.experimental.stateless_split(tf.stack([tf.cast(index, tf.int32), tf.constant(seed)]), 8)
        uniform = lambda k, shape=(), low=0.0, high=1.0: tf.random.stateless_uniform(shape, seeds[k], low, high)
        label = tf.random.stateless_uniform((), seeds[0], 0, len(CLASSES), dtype=tf.int32)
        frequency = uniform(1, (), 2.0, 8.0) * 2 * 3.14159 / size
        phase = uniform(2, (), 0.0, 6.283)
        center = uniform(3, (2,), 0.2 * size, 0.8 * size)
        radius = tf.sqrt((ys - center[0]) ** 2 + (xs - center[1]) ** 2)
        coarse = tf.image.resize(tf.random.stateless_normal((1, 6, 6, 1), seeds[4]), (size, size), "bicubic")[0, :, :, 0]
        fine = tf.image.resize(tf.random.stateless_normal((1, 16, 16, 1), seeds[4]), (size, size), "bicubic")[0, :, :, 0]
        patterns = [
            tf.sin(frequency * ys + phase), tf.sin(frequency * xs + phase),
            tf.sin(frequency * (xs + ys) / 1.414 + phase), tf.sin(frequency * (xs - ys) / 1.414 + phase),
            tf.sin(frequency * xs + phase) * tf.sin(frequency * ys + phase), tf.sin(frequency * radius + phase),
            tf.cast(coarse > 0.8, tf.float32) * 2 - 1, tf.tanh(fine),
        ]
        pattern = tf.switch_case(label, [lambda p=p: p for p in patterns])
        low, high = uniform(5, (3,), 0, 255), uniform(6, (3,), 0, 255)
        mix = (pattern[..., None] + 1) / 2
        pixels = low + (high - low) * mix + tf.random.stateless_normal((size, size, 3), seeds[7]) * 8
        return tf.cast(tf.clip_by_value(pixels, 0, 255), tf.uint8), label

    dataset = tf.data.Dataset.range(1 << 62).map(image, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def pretrain(args) -> None:
    sys.path.insert(0, REPO)
    # tf-keras writes the weights: its legacy .h5 is what both of the benchmark's Kerases load by
    # name, tf-keras (the lab's recipe) and Keras 3 (the trainer), as both load ImageNet's.
    import tensorflow as tf
    import tf_keras

    started, cpu_before = time.monotonic(), _cpu_seconds()
    policy = "float32"
    tf_keras.utils.set_random_seed(args.seed)
    images = tf_keras.Input((args.image_size, args.image_size, 3), dtype=tf.uint8)
    x = tf_keras.applications.resnet50.preprocess_input(tf.cast(images, tf.float32))
    base = tf_keras.applications.ResNet50(include_top=False, weights=None, pooling="avg",
                                          input_shape=(args.image_size, args.image_size, 3))
    for layer in base.layers:  # from scratch: statistics that follow the weights (cassava.model)
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            layer.momentum = 0.9
    outputs = tf_keras.layers.Dense(len(CLASSES), activation="softmax", dtype="float32")(base(x))
    model = tf_keras.Model(images, outputs)
    model.compile(tf_keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    train = generated_batches(args.image_size, args.batch, args.seed)
    held_out = generated_batches(args.image_size, args.batch, args.seed + 1000).take(8)
    epochs = 6
    history = model.fit(train, steps_per_epoch=args.steps // epochs, epochs=epochs, verbose=2)
    accuracy = float(model.evaluate(held_out, verbose=0)[1])
    for layer in base.layers:  # Keras' ImageNet weights carry momentum 0.99; it is not in the file
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            layer.momentum = 0.99
    path = weights_path(args.cache_dir, args.image_size, args.steps, args.batch, args.seed)
    os.makedirs(args.cache_dir, exist_ok=True)
    staging = path + f".{os.getpid()}.h5"
    base.save_weights(staging)
    sys.path.insert(0, BENCHMARKS)
    from machine import cpu_model

    cost = {"seconds": round(time.monotonic() - started, 1), "cpu_seconds": round(_cpu_seconds() - cpu_before, 1),
            "steps": args.steps // epochs * epochs, "batch": args.batch, "image_size": args.image_size,
            "images": args.steps // epochs * epochs * args.batch, "policy": policy, "classes": len(CLASSES),
            "train_accuracy": round(float(history.history["accuracy"][-1]), 4), "held_out_accuracy": round(accuracy, 4),
            "machine": cpu_model(), "cpus": os.cpu_count(), "tensorflow": tf.__version__}
    with open(path + ".json", "w") as handle:
        json.dump(cost, handle, indent=2)
    os.replace(staging, path)
    print(json.dumps(cost), flush=True)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def describe(cost: dict) -> str:
    """One sentence: what the weights are and what they cost."""
    return (f"ResNet50 pretrained here on {cost['classes']} generated texture and shape classes (not the evaluation task), "
            f"{cost['steps']} steps of {cost['batch']} images at {cost['image_size']} px ({cost['images']:,} images, "
            f"{cost['policy']}, caffe preprocessing as Keras' ImageNet weights expect): {cost['seconds'] / 60:.1f} min, "
            f"{cost['cpu_seconds'] / 60:.1f} CPU min on {cost['machine']} ({cost['cpus']} CPUs); it reached "
            f"{cost['held_out_accuracy']:.2f} on held-out images of its own task (chance {1 / cost['classes']:.2f})")


def main(argv=None) -> int:
    sys.path[:0] = [REPO, BENCHMARKS]
    from trainer import cli
    import legacy_keras

    parser = cli.OneLineParser(prog="python benchmarks/pretrain.py", description=__doc__.split("\n")[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cache-dir", default=CACHE_DIR)
    args = parser.parse_args(argv)
    legacy_keras.require(parser)
    if args.steps < 6 or args.batch < 1 or args.image_size < 32:
        print("pretrain.py: --steps must be at least 6, --batch positive, --image-size at least 32", file=sys.stderr)
        return 2
    pretrain(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
