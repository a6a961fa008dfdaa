"""A click-through model written the way keras.io teaches Keras 3, trained with `model.fit`.

Numeric features through a Normalization layer, a site name through a StringLookup and an
Embedding, AUC as the metric. Run alone it trains; run as several MultiWorkerMirrored workers it
meets Keras 3's limit (keras-team/keras#20585), and docs/keras.md shows the lines that train it
across workers anyway.

    python clicks.py [--epochs N] [--steps-per-epoch N]
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

SITES = ["news", "shop", "video", "blog"]


def clicks(rows: int = 4096, seed: int = 0) -> tf.data.Dataset:
    """Generated impressions: whether a user clicked depends on the site and two of three numbers."""
    rng = np.random.default_rng(seed)
    numeric = rng.normal(size=(rows, 3)).astype("float32")
    site = rng.choice(SITES, size=(rows, 1))
    score = numeric[:, 0] - 0.5 * numeric[:, 1] + np.where(site[:, 0] == "shop", 1.0, -0.3)
    clicked = (score + rng.normal(scale=0.5, size=rows) > 0).astype("float32")[:, None]
    return tf.data.Dataset.from_tensor_slices(({"numeric": numeric, "site": site}, clicked))


def build_model() -> keras.Model:
    numeric = keras.Input((3,), name="numeric")
    site = keras.Input((1,), dtype="string", name="site")
    site_vector = keras.layers.Flatten()(keras.layers.Embedding(len(SITES) + 1, 4)(
        keras.layers.StringLookup(vocabulary=SITES)(site)))
    x = keras.layers.Concatenate()([keras.layers.Normalization(mean=[0.0] * 3, variance=[1.0] * 3)(numeric),
                                    site_vector])
    clicked = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(16, activation="relu")(x))
    return keras.Model({"numeric": numeric, "site": site}, clicked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train = clicks().shuffle(4096, seed=1).repeat().batch(64)
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc")])
    model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)

    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    if task.get("type", "chief") == "chief":  # only the chief keeps the model
        model.export(os.environ.get("AIP_MODEL_DIR", "output/model"), verbose=False)
        print("saved the model", flush=True)


if __name__ == "__main__":
    main()
