"""Augmentation lives in the model: a random crop and flips in training, nothing otherwise."""

import itertools

import numpy as np
import pytest

import tensorflow as tf

from cassava import model as model_lib


def images(batch=6, size=8, seed=0):
    return tf.constant(np.random.default_rng(seed).uniform(-100, 100, size=(batch, size, size, 3)), tf.float32)


def candidates(image: np.ndarray, crop: int) -> list[np.ndarray]:
    """Every crop of `crop` pixels at every offset, flipped every way, resized back."""
    size = image.shape[0]
    found = []
    for top, left, flip_rows, flip_columns in itertools.product(range(size - crop + 1), range(size - crop + 1),
                                                               (False, True), (False, True)):
        window = image[top:top + crop, left:left + crop]
        window = window[::-1] if flip_rows else window
        window = window[:, ::-1] if flip_columns else window
        found.append(tf.image.resize(window, (size, size)).numpy())
    return found


def test_outside_training_images_pass_through_untouched():
    layer = model_lib.RandomCropFlip(crop_fraction=7 / 8)
    batch = images()
    assert layer(batch, training=False) is batch


def test_in_training_each_image_is_a_random_crop_flipped_and_resized_back():
    layer = model_lib.RandomCropFlip(crop_fraction=7 / 8)  # 7 of 8 pixels: 4 offsets x 4 flips
    batch = images(batch=12)
    augmented = layer(batch, training=True).numpy()
    assert augmented.shape == batch.shape
    chosen = []
    for original, result in zip(batch.numpy(), augmented):
        matches = [i for i, c in enumerate(candidates(original, 7)) if np.allclose(c, result, atol=1e-4)]
        assert matches, "not a crop + flip + resize of its own image"
        chosen.append(matches[0])
    assert len(set(chosen)) > 1, "every image got the same crop and flips"


def test_the_random_choice_is_reproducible_and_follows_the_seed():
    batch = images(batch=16, size=16)
    first = model_lib.RandomCropFlip(seed=1)(batch, training=True).numpy()
    assert np.array_equal(first, model_lib.RandomCropFlip(seed=1)(batch, training=True).numpy())
    assert not np.array_equal(first, model_lib.RandomCropFlip(seed=2)(batch, training=True).numpy())


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_it_compiles_with_xla_in_the_models_compute_dtype(policy):
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        layer = model_lib.RandomCropFlip()
        batch = tf.cast(images(size=32), layer.compute_dtype)
        compiled = tf.function(lambda x: layer(x, training=True), jit_compile=True)
        result = compiled(batch)
        assert result.dtype == layer.compute_dtype and result.shape == batch.shape
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
