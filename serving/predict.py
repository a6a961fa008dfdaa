"""Classifies image files with an exported model, through the model's own serving signature.

    python -m serving.predict MODEL_DIR IMAGE [IMAGE ...]
    python -m serving.predict MODEL_DIR IMAGE [IMAGE ...] --vertex-request > request.json

Prints one line per image: its path, the class name and the probability of that class. The
images are sent to the SavedModel's `serving_default` signature as encoded bytes, exactly as a
Vertex AI endpoint or TF Serving receives them; the model decodes and resizes them itself with
the function training validated on (cassava.signature). MODEL_DIR and the images may be gs://
paths.

With --vertex-request it prints instead the JSON body of a Vertex AI prediction request for
the images (`{"instances": [{"image_bytes": {"b64": ...}}, ...]}`), for `curl` or
`gcloud ai endpoints predict --json-request`.

A missing model, a missing file or an image that cannot be decoded is one line and exit 2.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # before TensorFlow loads: no INFO banners

import trainer  # noqa: E402,F401  (selects legacy Keras before TensorFlow loads)

# Images per call of the signature: bounds memory for long file lists.
BATCH = 32


class PredictError(RuntimeError):
    """str() is one line."""


def vertex_request(images: Sequence[bytes]) -> dict:
    """The body of a Vertex AI online prediction request for the serving_default signature."""
    from cassava import signature as serving

    return {"instances": [{serving.BYTES_INPUT: {"b64": base64.b64encode(image).decode("ascii")}} for image in images]}


def read_images(paths: Sequence[str]) -> list[bytes]:
    import tensorflow as tf

    contents = []
    for path in paths:
        try:
            with tf.io.gfile.GFile(path, "rb") as handle:
                contents.append(handle.read())
        except (tf.errors.OpError, OSError) as error:
            raise PredictError(f"{path}: cannot read it ({type(error).__name__})") from None
    return contents


def check_model_dir(model_dir: str) -> None:
    import tensorflow as tf

    if not tf.io.gfile.exists(f"{model_dir.rstrip('/')}/saved_model.pb"):
        raise PredictError(f"{model_dir}: no saved_model.pb there (the --model-dir of a finished training job)")


def load_signature(model_dir: str):
    import tensorflow as tf

    from cassava import signature as serving

    check_model_dir(model_dir)
    loaded = tf.saved_model.load(model_dir)
    signature = loaded.signatures.get(serving.BYTES_SIGNATURE)
    inputs = signature.structured_input_signature[1] if signature is not None else {}
    if serving.BYTES_INPUT not in inputs:
        raise PredictError(f"{model_dir}: its {serving.BYTES_SIGNATURE} signature takes no {serving.BYTES_INPUT} "
                           f"(exported by an older trainer?)")
    return signature


def classify(signature, paths: Sequence[str], images: Sequence[bytes]) -> list[tuple[str, str, float]]:
    """(path, class name, probability) for each image."""
    import tensorflow as tf

    from cassava import data, signature as serving

    for path, image in zip(paths, images):
        # A check of first and last bytes: a truncated upload or another kind of file is named
        # here, before the model's decoder fails on the whole batch.
        if not bool(data.looks_decodable(tf.constant(image))):
            raise PredictError(f"{path}: not a whole JPEG, PNG, GIF or BMP image")
    results = []
    for start in range(0, len(images), BATCH):
        batch = list(images[start:start + BATCH])
        try:
            outputs = signature(**{serving.BYTES_INPUT: tf.constant(batch)})
        except tf.errors.InvalidArgumentError:
            # One image spoils the batch; name it.
            for path, image in zip(paths[start:start + BATCH], batch):
                try:
                    signature(**{serving.BYTES_INPUT: tf.constant([image])})
                except tf.errors.InvalidArgumentError:
                    raise PredictError(f"{path}: not a JPEG, PNG, GIF or BMP image the model can decode") from None
            raise
        names = outputs["class_name"].numpy()
        indices = outputs["class_index"].numpy()
        probabilities = outputs["probabilities"].numpy()
        for offset, path in enumerate(paths[start:start + BATCH]):
            results.append((path, names[offset].decode(), float(probabilities[offset, indices[offset]])))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.predict", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", help="the exported SavedModel (the training job's --model-dir)")
    parser.add_argument("images", nargs="+", help="image files (JPEG or PNG; gs:// allowed)")
    parser.add_argument("--vertex-request", action="store_true",
                        help="print the JSON body of a Vertex AI prediction request for the images instead")
    args = parser.parse_args(argv)
    try:
        images = read_images(args.images)
        if args.vertex_request:
            check_model_dir(args.model_dir)  # the request is for that model's serving_default
            print(json.dumps(vertex_request(images)))
            return 0
        signature = load_signature(args.model_dir)
        for path, name, probability in classify(signature, args.images, images):
            print(f"{path}\t{name}\t{probability:.4f}")
    except PredictError as error:
        print(f"serving.predict: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from trainer import relay

    relay.run(main)
