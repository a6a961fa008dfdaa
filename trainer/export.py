"""Writing the final SavedModel from a checkpoint, outside any distribution strategy.

A ParameterServerStrategy model holds sharded variables, and a SavedModel of sharded variables
cannot be loaded back with tf.saved_model.load. Checkpoints store each sharded variable whole,
so a plain model built on the coordinator restores the final epoch's checkpoint and is saved.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from trainer import model as model_lib, saving, serving
from trainer.config import TrainConfig

log = logging.getLogger("trainer")


def load_checkpoint(config: TrainConfig, num_classes: int, checkpoint: str) -> tf.keras.Model:
    model = model_lib.build(num_classes, config.image_size, "none", config.architecture, config.seed)
    model.load_weights(checkpoint).expect_partial()
    return model


def save_unsharded(config: TrainConfig, class_names, checkpoint: str) -> None:
    """The export computes in float32 whatever the job trained in (model_lib.float32_copy says
    why); the checkpoint's variables are float32 under every policy."""
    with model_lib.float32_policy():
        model = load_checkpoint(config, len(class_names), checkpoint)
    saving.compile_for_export(model)
    serving.save(model, config.model_dir, class_names, config.image_size)
    log.info("saved model to %s (from %s)", config.model_dir, checkpoint)
