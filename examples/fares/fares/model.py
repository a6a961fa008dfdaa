"""The fare model, and its export with a serving signature over the raw columns.

The model takes the columns as the CSV holds them (strings for the categories, the hour as a
number) and does its own preprocessing, so that what serves it needs no copy of that code. It
starts out predicting the training data's mean fare: the output layer scales a unit-variance
guess by the fares' standard deviation around their mean, so learning starts from the baseline
a test measures it against.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fares import data

HOURS = 24


def inputs() -> dict[str, keras.KerasTensor]:
    dtypes = {"distance_km": "float32", "passengers": "int64", data.HOUR: "int64",
              **{name: "string" for name in data.CATEGORIES}}
    return {name: keras.Input(shape=(1,), name=name, dtype=dtypes[name]) for name in data.FEATURES}


def build(train: data.Summary, hidden_units: tuple[int, ...], dropout: float, seed: int) -> keras.Model:
    """`train`: the training files' statistics (fares.data.summarize)."""
    features = inputs()
    # Preprocessing in float32 whatever the job's policy; the first Dense casts to the policy's.
    numeric = keras.layers.Concatenate(name="numeric", dtype="float32")(
        [keras.ops.cast(features[name], "float32") for name in data.NUMERIC])
    numeric = keras.layers.Normalization(
        mean=[train.means[name] for name in data.NUMERIC], variance=[train.variances[name] or 1.0 for name in data.NUMERIC],
        name="normalized", dtype="float32")(numeric)
    encoded = [numeric, keras.layers.CategoryEncoding(HOURS, output_mode="one_hot", name="hour_one_hot",
                                                        dtype="float32")(features[data.HOUR])]
    for name, values in data.CATEGORIES.items():
        # No out-of-vocabulary slot: prepare refuses a value outside the list before training.
        encoded.append(keras.layers.StringLookup(vocabulary=list(values), num_oov_indices=0, output_mode="one_hot",
                                                    name=f"{name}_one_hot", dtype="float32")(features[name]))
    hidden = keras.layers.Concatenate(name="encoded", dtype="float32")(encoded)
    for index, units in enumerate(hidden_units):
        hidden = keras.layers.Dense(units, activation="relu", name=f"hidden_{index}",
                                    kernel_initializer=keras.initializers.HeUniform(seed + index))(hidden)
        if dropout:
            hidden = keras.layers.Dropout(dropout, seed=seed + index, name=f"dropout_{index}")(hidden)
    # float32 head: under a mixed policy the loss must still see float32 (trainer.tasks).
    standardized = keras.layers.Dense(1, dtype="float32", name="standardized_fare",
                                      kernel_initializer=keras.initializers.GlorotUniform(seed))(hidden)
    fare = keras.layers.Rescaling(scale=train.variances[data.LABEL] ** 0.5 or 1.0, offset=train.means[data.LABEL],
                                     dtype="float32", name="fare")(standardized)
    return keras.Model(features, fare, name="fares")


def serving_function(model: keras.Model):
    """serving_default: one 1-D tensor per column, named as in the CSV header -> {"fare": [batch]}."""
    specs = {name: tf.TensorSpec([None], tensor.dtype, name=name) for name, tensor in model.input.items()}

    # Traced as written, as Keras' own export does: TensorFlow ops, nothing for AutoGraph to convert.
    @tf.function(input_signature=[specs], autograph=False)
    def serve(columns):
        predicted = model({name: tf.expand_dims(value, -1) for name, value in columns.items()}, training=False)
        return {"fare": tf.squeeze(predicted, -1)}

    return serve


def save(model: keras.Model, path: str) -> None:
    """A SavedModel whose serving_default takes the raw columns (Keras 3's ExportArchive, each weight
    stored once: trainer.export)."""
    from trainer import export

    export.write(path, model, {"serving_default": serving_function(model)})
