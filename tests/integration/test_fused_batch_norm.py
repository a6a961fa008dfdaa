"""trainer.layers: the fused batch normalization computes what Keras 3's own does, in training and
in inference, in float32 and bfloat16, and fuse_batch_norm keeps a model's weights and answers."""

import numpy as np
import pytest

import keras

from trainer import layers


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"], indirect=True)
def test_the_fused_layer_computes_what_keras_own_does(policy):
    rng = np.random.default_rng(0)
    batches = [rng.normal(2.0, 3.0, size=(8, 6, 6, 4)).astype("float32") for _ in range(3)]
    own, fused = keras.layers.BatchNormalization(momentum=0.7), layers.FusedBatchNormalization(momentum=0.7)
    own.build((None, 6, 6, 4)), fused.build((None, 6, 6, 4))
    fused.set_weights([rng.normal(size=4).astype("float32") for _ in range(4)])
    own.set_weights(fused.get_weights())
    tolerance = 1e-5 if policy == "float32" else 5e-2  # bfloat16 keeps 8 bits of mantissa
    for batch in batches:
        np.testing.assert_allclose(np.asarray(fused(batch, training=True), np.float32),
                                   np.asarray(own(batch, training=True), np.float32), atol=tolerance * 10, rtol=tolerance)
    # The moving statistics follow the same update, the batch's biased variance included.
    for ours, theirs in zip(fused.get_weights(), own.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4 if policy == "float32" else 2e-2)
    np.testing.assert_allclose(np.asarray(fused(batches[0], training=False), np.float32),
                               np.asarray(own(batches[0], training=False), np.float32), atol=tolerance * 10, rtol=tolerance)
    assert fused.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")


def test_fuse_batch_norm_swaps_every_layer_of_nested_models_and_keeps_the_weights():
    inner = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                              keras.layers.ReLU(), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization()])
    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(inner(inputs))))
    model.layers[1].layers[1].moving_mean.assign(np.full(4, 0.5, np.float32))  # not the initial value
    fused = layers.fuse_batch_norm(model)
    swapped = [layer for layer in fused.layers[1].layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(swapped) == 2 and all(type(layer) is layers.FusedBatchNormalization for layer in swapped)
    assert all(np.array_equal(a, b) for a, b in zip(fused.get_weights(), model.get_weights()))
    images = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(fused(images, training=False), model(images, training=False), atol=1e-5)
