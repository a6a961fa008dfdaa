"""The classifier: augmentation, ResNet50 without its top, average pooling, a dense head.

The model takes uint8 images at its input size, exactly as `cassava.data.decode_resize` makes
them, and does everything else itself, on the device: the cast and ResNet50's normalisation,
then, in training only, a random crop and flips. The input pipeline ships a quarter of the bytes
float32 would need and caches images at the size the model takes.
"""

from __future__ import annotations

import hashlib
import re
import socket
import time

import keras
import tensorflow as tf

from trainer import layers

HEAD_UNITS = 1024
# ResNet50's ImageNet preprocessing ("caffe" mode): BGR channel order, mean subtracted.
IMAGENET_BGR_MEAN = (103.939, 116.779, 123.68)
# Training crops this fraction of each side at a random place and scales it back up.
CROP_FRACTION = 7 / 8
# ResNet50's batch-norm momentum, from scratch and fine-tuning alike. Validation and serving
# normalise with the moving statistics, and at Keras' 0.99 a short run's still carry 0.99^steps
# of where they started (0.79 after 24 steps):
# - from scratch they start at mean 0, variance 1, far from what random convolutions of pixels in
#   +-128 produce: validation runs on unnormalised activations compounded over 50 layers
#   (val_loss 219,720 after one epoch of 24 steps, val_accuracy at chance);
# - fine-tuning, they start as the pretraining data's, not the new data's: with weights pretrained
#   on other images, the trainer's val_accuracy went 0.34-0.56, 0.40-0.71, 0.40-0.58 over its first
#   three epochs at 0.99 (three runs) and 0.56, 0.78, 0.90 at 0.9 (benchmarks/time_to_accuracy.py's
#   fine-tuning task, 12 steps an epoch). Those are epochs, not seconds: no machine's speed is in them.
# At 0.9 the start weighs 0.08 after 24 steps. It is also PyTorch's default (its momentum 0.1 is
# the new statistics' weight, the complement of Keras'), which torchvision's fine-tuning recipes use.
BATCH_NORM_MOMENTUM = 0.9


@keras.saving.register_keras_serializable(package="cassava")
class ResNetPreprocess(keras.layers.Layer):
    """uint8 RGB -> float BGR minus the ImageNet mean, in the layer's compute dtype."""

    def call(self, images):
        images = tf.cast(images, self.compute_dtype)[..., ::-1]
        return images - tf.constant(IMAGENET_BGR_MEAN, dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="cassava")
class RandomCropFlip(keras.layers.Layer):
    """In training, each image becomes a random square crop of `crop_fraction` of its side,
    flipped left-right and up-down at random, resized back to the input size; otherwise the
    layer passes images through untouched, so evaluation and serving see the whole image.

    The crop and the flips are one gather of rows and columns (a flip reverses their order),
    then a bilinear resize: both compile under XLA (tf.image.crop_and_resize does not) and
    run on whatever device trains. The random numbers are stateless, seeded from the batch's
    own pixels and the layer's seed: reproducible, different for every batch and every replica,
    with no state to keep in step across workers, and XLA keeps its seed (it ignores the seed of
    stateful random ops).
    """

    def __init__(self, crop_fraction: float = CROP_FRACTION, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.crop_fraction = crop_fraction
        self.seed = seed

    def call(self, images, training=None):
        if not training:
            return images
        batch, size = tf.shape(images)[0], images.shape[1]
        crop = max(1, round(size * self.crop_fraction))
        pixels = tf.bitcast(tf.reduce_sum(tf.cast(images, tf.float32)), tf.int32)
        seed = tf.stack([pixels, tf.constant(self.seed, tf.int32)])
        offsets = tf.random.stateless_uniform([batch, 2], seed, 0, size - crop + 1, dtype=tf.int32)
        flips = tf.random.stateless_uniform([batch, 2], seed + 1, 0, 2, dtype=tf.int32) == 1
        steps = tf.range(crop)
        rows = offsets[:, :1] + tf.where(flips[:, :1], crop - 1 - steps, steps)
        columns = offsets[:, 1:] + tf.where(flips[:, 1:], crop - 1 - steps, steps)
        cropped = tf.gather(tf.gather(images, rows, axis=1, batch_dims=1), columns, axis=2, batch_dims=1)
        # Resized in float32 whatever the policy: the one dtype every device's bilinear kernel takes.
        resized = tf.image.resize(tf.cast(cropped, tf.float32), (size, size), method="bilinear")
        return tf.cast(resized, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "crop_fraction": self.crop_fraction, "seed": self.seed}


# ResNet50's ImageNet weights without the top, as keras.applications fetches them: the same file
# name, address, cache folder (~/.keras/models, $KERAS_HOME) and md5 (keras/src/applications/resnet.py,
# Keras 3.15.1; tests/unit/test_weights_fetch.py holds them to Keras' own), so a copy Keras already
# cached, or one baked into an image there, is used without a download.
IMAGENET_FILE = "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
IMAGENET_URL = "https://storage.googleapis.com/tensorflow/keras-applications/resnet/" + IMAGENET_FILE
IMAGENET_MD5 = "4d473c1dd8becc155b73f8504c6f6626"
CACHE_SUBDIR = "models"
# A download that stalls this long between two reads fails (urllib waits forever by default: a
# machine with no route out would hang at the first connect).
FETCH_TIMEOUT_SECONDS = 60
# Attempts at a download that failed for a reason that may pass (a 5xx, a 429, a timeout).
FETCH_ATTEMPTS = 3
FETCH_BACKOFF_SECONDS = 2.0


class WeightsUnavailable(Exception):
    """--weights cannot be fetched. str() is one line and names the flag."""


def transient_fetch_failure(message: str) -> bool:
    """Whether keras.utils.get_file's failure may pass on a retry: an HTTP 5xx or 429, or a timeout.
    A refusal (403 from VPC Service Controls, 404), a name that does not resolve or a connection
    refused will fail the same way again."""
    code = re.search(r"URL fetch failure on \S+: (\d{3}) --", message)
    if code:
        return int(code.group(1)) == 429 or int(code.group(1)) >= 500
    return "timed out" in message.lower()


def fetch_weights(weights: str, architecture: str, sleep=time.sleep) -> str:
    """`--weights` made a local file this process can load, or "none": `imagenet` downloaded
    (ResNet50's, into Keras' cache), a gs:// file copied beside it, a local path as it is.
    Raises WeightsUnavailable with one line."""
    if weights == "none" or architecture != "resnet50":  # the small architecture takes no weights
        return weights
    if weights == "imagenet":
        return _download_imagenet(sleep)
    if "://" in weights:
        return _copy_to_cache(weights)
    return weights


def _download_imagenet(sleep) -> str:
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(FETCH_TIMEOUT_SECONDS)
    try:
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            try:
                return keras.utils.get_file(IMAGENET_FILE, IMAGENET_URL, cache_subdir=CACHE_SUBDIR, file_hash=IMAGENET_MD5)
            except Exception as error:  # get_file raises a bare Exception for a failed fetch
                reason = " ".join(str(error).split())[:300] or type(error).__name__
                if attempt < FETCH_ATTEMPTS and transient_fetch_failure(reason):
                    sleep(FETCH_BACKOFF_SECONDS * attempt)
                    continue
                raise WeightsUnavailable(
                    f"--weights imagenet: cannot fetch ResNet50's ImageNet weights ({reason}); give --weights none "
                    f"to train from scratch, or --weights FILE, a copy of {IMAGENET_FILE} this job can read (a "
                    "local path, in the image or a mounted volume, or gs://)") from None
    finally:
        socket.setdefaulttimeout(previous)
    raise AssertionError("unreachable")


def _copy_to_cache(weights: str) -> str:
    """A gs:// (or other remote) weights file copied into Keras' cache: Keras loads .h5 weights
    from a local file only."""
    import os

    from keras.src.backend import config as keras_config

    local = os.path.join(os.path.expanduser(keras_config.keras_home()), CACHE_SUBDIR,
                         hashlib.sha256(weights.encode()).hexdigest()[:16] + "-" + os.path.basename(weights))
    try:
        tf.io.gfile.makedirs(os.path.dirname(local))
        tf.io.gfile.copy(weights, local, overwrite=True)
    except (tf.errors.OpError, OSError) as error:
        message = (getattr(error, "message", None) or str(error)).strip().splitlines()[0][:300]
        raise WeightsUnavailable(f"--weights {weights}: cannot read it ({message}); give --weights none to train "
                                 "from scratch, or a weights file this job can read") from None
    return local


def build(num_classes: int, image_size: int, weights: str, architecture: str = "resnet50", seed: int = 0,
          batch_norm_momentum: float = BATCH_NORM_MOMENTUM) -> keras.Model:
    """`weights`: "imagenet", "none" or a path to a ResNet50 (no-top) weights file (fetch_weights
    makes "imagenet" and a gs:// file local first, before the cluster forms);
    `batch_norm_momentum`: ResNet50's (cassava.task's --batch-norm-momentum)."""
    images = keras.Input(shape=(image_size, image_size, 3), dtype="uint8", name="image")
    x = ResNetPreprocess(name="preprocess")(images)
    x = RandomCropFlip(seed=seed, name="augment")(x)
    if architecture == "resnet50":
        base = keras.applications.ResNet50(
            include_top=False,
            weights=None if weights == "none" else weights,
            input_shape=(image_size, image_size, 3),
            pooling="avg",
        )
        # Keras 3's batch normalization runs unfused and in float32 on TensorFlow: the fused kernel
        # takes a third less CPU per image here (trainer.layers says what was measured).
        base = layers.fuse_batch_norm(base)
        for layer in base.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = batch_norm_momentum
        x = base(x)
    elif architecture == "small":
        # A few conv layers: the same pipeline, strategy and save paths at a fraction of the cost,
        # for smoke runs and the failure tests.
        for filters in (16, 32, 128):
            x = keras.layers.Conv2D(filters, 3, strides=2, activation="relu")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
    else:
        raise ValueError(f"unknown architecture {architecture!r}")
    x = keras.layers.Dense(HEAD_UNITS, activation="relu", name="head")(x)
    # float32 softmax even under mixed precision, for a numerically stable loss.
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="predictions")(x)
    return keras.Model(images, outputs, name=f"cassava_{architecture}")


@keras.saving.register_keras_serializable(package="cassava")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """`rate` * (step + 1) / `steps` for the first `steps` steps, then `rate`."""

    def __init__(self, rate: float, steps: int):
        self.rate = rate
        self.steps = steps

    def __call__(self, step):
        fraction = tf.minimum(1.0, (tf.cast(step, tf.float32) + 1.0) / float(max(self.steps, 1)))
        return self.rate * fraction

    def get_config(self):
        return {"rate": self.rate, "steps": self.steps}


def warmup_steps(weights: str, steps_per_epoch: int) -> int:
    """Steps over which the learning rate ramps up: the first epoch from scratch, none otherwise.

    From scratch, Adam's first steps at the full rate, taken on gradients of random weights and
    batch-norm statistics of a few batches, throw a ResNet50 far off (a training loss of 4.7 in
    its first epoch, 3 times chance's 1.6); a ramp over one epoch lets the statistics settle
    first. Fine-tuning ImageNet weights starts at the codelab's small rate, as the codelab does.
    """
    return steps_per_epoch if weights == "none" else 0


LOSS = "sparse_categorical_crossentropy"


def metrics() -> list:
    return ["accuracy"]


def optimizer(learning_rate: float, warmup: int = 0) -> keras.optimizers.Optimizer:
    """Adam, its rate ramped up linearly over `warmup` steps (warmup_steps), 0 for none."""
    return keras.optimizers.Adam(LinearWarmup(learning_rate, warmup) if warmup else learning_rate)
