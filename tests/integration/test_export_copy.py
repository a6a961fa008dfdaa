"""The export is the task's model built again in float32 with the final checkpoint's weights,
whatever policy the job trained in (trainer.runtime.saving)."""

import numpy as np
import pytest

import keras
import tensorflow as tf

from cassava import model as model_lib
from trainer import precision
from trainer.runtime import saving
from trainer.tasks import Run, Task

SIZE, CLASSES = 32, 5


class SmallCassava(Task):
    name = "small"

    def build_model(self, run):
        return model_lib.build(CLASSES, SIZE, "none", "small", seed=3)

    def loss(self, run):
        return model_lib.LOSS

    def metrics(self, run):
        return model_lib.metrics()


RUN = Run(flags=None, strategy="one_device", task_name="chief-0", is_chief=True, num_input_pipelines=1,
          replicas_in_sync=1, per_replica_batch_size=4, epochs=1, steps_per_epoch=2, validation_steps=None,
          learning_rate=1e-2, seed=3, shuffle_seed=3, model_dir="", checkpoint_dir="", tensorboard_dir="",
          mixed_precision="mixed_bfloat16")


def pixels(batch=4, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(batch, SIZE, SIZE, 3), dtype=np.uint8)


@pytest.fixture
def trained_in(request, tmp_path):
    """A model built and briefly trained under request.param's policy, which stays global, and
    the checkpoint of its weights (as trainer.runtime.callbacks.EpochCheckpoints writes it)."""
    keras.mixed_precision.set_global_policy(request.param)
    try:
        model = SmallCassava().build_model(RUN)
        model.compile(optimizer=model_lib.optimizer(1e-2), loss=model_lib.LOSS, metrics=model_lib.metrics())
        model.fit(pixels(8, seed=1), np.arange(8) % CLASSES, batch_size=4, epochs=1, verbose=0)  # weights move
        path = saving.write_weights(saving.weights_checkpoint(model), str(tmp_path), 1, is_chief=True)
        yield model, path
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("trained_in", ["mixed_bfloat16", "float32"], indirect=True)
def test_the_export_computes_in_float32_with_the_trained_weights_and_no_optimizer(trained_in):
    trained, path = trained_in
    copy = saving.model_from_checkpoint(SmallCassava(), RUN, path)
    assert {layer.compute_dtype for layer in copy.layers if layer.name != "image"} == {"float32"}
    assert copy.optimizer is None
    weights = trained.get_weights()
    assert len(copy.get_weights()) == len(weights)
    assert all(np.array_equal(a, b) for a, b in zip(copy.get_weights(), weights))
    # The job's policy is back for whatever runs after the export.
    assert keras.mixed_precision.global_policy().name == trained.get_layer("head").dtype_policy.name

    # The copy's answers are those of a float32 model holding the same weights...
    with precision.float32_policy():
        reference = model_lib.build(CLASSES, SIZE, "none", "small", seed=3)
    reference.set_weights(weights)
    images = pixels()
    np.testing.assert_allclose(copy(images, training=False).numpy(), reference(images, training=False).numpy(),
                               rtol=0, atol=1e-6)
    # ...where in bfloat16 the trained model rounds away from them (compared before the softmax,
    # which saturates on these random weights).
    def head(model):
        return keras.Model(model.input, model.get_layer("head").output)(images, training=False).numpy()

    float32_head = head(copy)
    if trained.get_layer("head").compute_dtype == "bfloat16":
        assert np.abs(head(trained).astype(np.float32) - float32_head).max() > 1e-3 * np.abs(float32_head).max()


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = saving.write_weights(saving.weights_checkpoint(other), str(tmp_path), 1, is_chief=True)
    with pytest.raises(saving.CheckpointMismatch, match=r"does not hold this task's model \(") as raised:
        saving.model_from_checkpoint(SmallCassava(), RUN, path)
    assert "\n" not in str(raised.value)
