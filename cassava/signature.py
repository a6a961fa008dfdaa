"""What the exported SavedModel serves: signatures that take what clients send.

- `serving_default` takes `image_bytes`, a batch of encoded JPEG or PNG images, as Vertex AI
  prediction and TF Serving clients send them (Vertex decodes `{"image_bytes": {"b64": ...}}`
  into bytes for an input whose name ends in `_bytes`). Each image goes through
  `cassava.data.decode_resize`, the very function validation runs, inside the SavedModel.
- `serving_pixels` takes `image`, uint8 [N, size, size, 3], already decoded and resized.

Both return `probabilities` (float32 [N, classes]), `class_index` (int64 [N]) and `class_name`
(string [N], from the dataset's class names). The runtime hands the export a float32 model,
whatever the job trained in (trainer.runtime.saving). Written with Keras 3's `ExportArchive`: what it
saves is a plain TensorFlow SavedModel, which any TensorFlow server loads without Keras.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import keras
import tensorflow as tf

from cassava import data
from trainer import export

BYTES_SIGNATURE = "serving_default"
PIXELS_SIGNATURE = "serving_pixels"
BYTES_INPUT = "image_bytes"


def signatures(model: keras.Model, class_names: Sequence[str], image_size: int) -> dict:
    names = tf.constant(list(class_names))

    def answer(images):
        probabilities = tf.cast(model(images, training=False), tf.float32)
        index = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "class_index": index, "class_name": tf.gather(names, index)}

    # Traced as written (autograph=False), as Keras' own export traces its endpoints: both are
    # TensorFlow ops already, and AutoGraph's conversion of them (the map_fn's function and
    # decode_resize) cost every export about 1.8 CPU s of the 3.3 s a small model's took.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT)], autograph=False)
    def from_bytes(image_bytes):
        images = tf.map_fn(lambda encoded: data.decode_resize(encoded, image_size), image_bytes,
                           fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.uint8))
        return answer(images)

    @tf.function(input_signature=[tf.TensorSpec([None, image_size, image_size, 3], tf.uint8, name="image")],
                 autograph=False)
    def from_pixels(image):
        return answer(image)

    return {BYTES_SIGNATURE: from_bytes, PIXELS_SIGNATURE: from_pixels}


log = logging.getLogger("trainer")


def save(model: keras.Model, path: str, class_names: Sequence[str], image_size: int) -> None:
    """Saves the model as a SavedModel with both signatures, and logs its size and time.

    The model's weights only, no optimizer: Adam's two slots per weight would be two thirds of
    what it stores, serving reads none of them, and every byte is written to the bucket at the end
    of the job and read again at deploy. Training state lives in the checkpoints and the backup.
    """
    started = time.monotonic()
    export.write(path, model, signatures(model, class_names, image_size))  # each weight stored once
    size = directory_bytes(path)
    log.info("exported %s: %.1f MB in %.1fs", path, size / 1e6, time.monotonic() - started)


def directory_bytes(path: str) -> int:
    """Bytes under `path` (local or gs://)."""
    total = 0
    for directory, _, files in tf.io.gfile.walk(path):
        total += sum(tf.io.gfile.stat(f"{directory.rstrip('/')}/{name}").length for name in files)
    return total
