"""The export is a float32 copy of the trained model, whatever policy it trained in."""

import numpy as np
import pytest

import trainer  # noqa: F401  (selects tf-keras before TensorFlow is imported)
import tensorflow as tf

from cassava import model as model_lib

SIZE, CLASSES = 32, 5


def pixels(batch=4, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(batch, SIZE, SIZE, 3), dtype=np.uint8)


@pytest.fixture
def trained_in(request):
    """A model built and briefly trained under request.param's policy, which stays global."""
    tf.keras.mixed_precision.set_global_policy(request.param)
    try:
        model = model_lib.build(CLASSES, SIZE, "none", "small", seed=3)
        model.compile(optimizer=model_lib.optimizer(1e-2), loss=model_lib.LOSS, metrics=model_lib.metrics())
        labels = np.arange(8) % CLASSES
        model.fit(pixels(8, seed=1), labels, batch_size=4, epochs=1, verbose=0)  # weights and Adam's slots move
        yield model
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("trained_in", ["mixed_bfloat16", "float32"], indirect=True)
def test_the_copy_computes_in_float32_with_the_trained_weights_and_no_optimizer(trained_in):
    copy = model_lib.float32_copy(trained_in, CLASSES, SIZE, "small", seed=3)
    assert copy is not trained_in
    assert {layer.compute_dtype for layer in copy.layers if layer.name != "image"} == {"float32"}
    assert copy.optimizer is None
    trained = trained_in.get_weights()
    assert len(copy.get_weights()) == len(trained)
    assert all(np.array_equal(a, b) for a, b in zip(copy.get_weights(), trained))
    # The job's policy is back for whatever runs after the export.
    assert tf.keras.mixed_precision.global_policy().name == trained_in.get_layer("head").dtype_policy.name

    # The copy's answers are those of a float32 model holding the same weights...
    tf.keras.mixed_precision.set_global_policy("float32")
    reference = model_lib.build(CLASSES, SIZE, "none", "small", seed=3)
    reference.set_weights(trained)
    images = pixels()
    expected = reference(images, training=False).numpy()
    np.testing.assert_allclose(copy(images, training=False).numpy(), expected, rtol=0, atol=1e-6)
    # ...where in bfloat16 the trained model rounds away from them (compared before the softmax,
    # which saturates on these random weights).
    def head(model):
        return tf.keras.Model(model.input, model.get_layer("head").output)(images, training=False).numpy()

    float32_head = head(copy)
    np.testing.assert_allclose(float32_head, head(reference), rtol=0, atol=1e-5)
    if trained_in.get_layer("head").compute_dtype == "bfloat16":
        assert np.abs(head(trained_in).astype(np.float32) - float32_head).max() > 1e-3 * np.abs(float32_head).max()
