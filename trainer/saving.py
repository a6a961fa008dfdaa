"""Saving the final model from every worker of a synchronous job.

What is saved is `trainer.model.float32_copy` of the trained model, and making it is a collective
under MultiWorkerMirroredStrategy (reading batch normalisation's statistics is a mean over the
workers), so every worker makes it. Every worker then saves it in MultiWorkerMirroredStrategy's
documented pattern (made for saving the distributed model, itself a collective): the chief into
the model dir, each other worker into a private temporary directory on its own disk, deleted at
once. (The lab saved those copies next to the real model, in the bucket, one per worker per job.)
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from typing import Iterator

import tensorflow as tf

from trainer import model as model_lib, serving
from trainer.cluster import Cluster
from trainer.config import TrainConfig

log = logging.getLogger("trainer")


@contextlib.contextmanager
def save_path(model_dir: str, cluster: Cluster) -> Iterator[str]:
    """The directory this task saves into: the model dir for the chief, else a temp dir that is
    removed when the block ends, whatever happens."""
    if cluster.is_chief:
        yield model_dir
        return
    temp_dir = tempfile.mkdtemp(prefix=f"model-{cluster.task_name}-")
    try:
        yield temp_dir
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def compile_for_export(model: tf.keras.Model) -> None:
    """Gives the model to be saved the training's loss and metric. tf-keras's save builds the
    compiled loss and metrics of the model it saves, and a model never compiled has none to
    build: it logs a warning ("Compiled the loaded model, but the compiled metrics have yet to be
    built") on stderr, in every task that saves. What compile adds is not served: the optimizer
    it makes is left out of the SavedModel (serving.save); the metrics' counters (four scalars)
    are saved."""
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def save_model(model: tf.keras.Model, config: TrainConfig, cluster: Cluster, class_names) -> None:
    """Every task calls this, outside strategy.scope(); the chief's copy is the SavedModel with the
    serving signatures, in float32."""
    copy = model_lib.float32_copy(model, len(class_names), config.image_size, config.architecture, config.seed)
    compile_for_export(copy)
    with save_path(config.model_dir, cluster) as path:
        serving.save(copy, path, class_names, config.image_size)
        if cluster.is_chief:
            log.info("saved model to %s", path)
        else:
            log.info("saved this worker's copy to %s; removing it", path)
