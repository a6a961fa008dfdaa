"""Saving the trained model: from every worker of a synchronous job, or from a ParameterServer
job's checkpoint.

Under MultiWorkerMirroredStrategy saving is a collective, so every worker calls the task's
`export`, in MultiWorkerMirroredStrategy's documented pattern: the chief into the model dir, each
other worker into a private temporary directory on its own disk, deleted at once. (The lab saved
those copies next to the real model, in the bucket, one per worker per job.)

A ParameterServerStrategy model holds sharded variables, and a SavedModel of sharded variables
cannot be loaded back with tf.saved_model.load. Checkpoints store each sharded variable whole, so
the coordinator builds the task's model outside any strategy, restores the final epoch's
checkpoint into it and exports that.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from typing import Iterator

import tensorflow as tf

from trainer import precision
from trainer.cluster import Cluster
from trainer.tasks import Run, Task

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


def save_from_every_worker(task: Task, model: tf.keras.Model, run: Run, cluster: Cluster) -> None:
    """Every task of a synchronous job calls this, outside strategy.scope()."""
    with save_path(run.model_dir, cluster) as path:
        task.export(model, path, run)
        if cluster.is_chief:
            log.info("saved model to %s", path)
        else:
            log.info("saved this worker's copy to %s; removing it", path)


def model_from_checkpoint(task: Task, run: Run, checkpoint: str) -> tf.keras.Model:
    """The task's model, built in float32 outside any strategy, with the checkpoint's weights
    (float32 under every policy), compiled with the task's loss and metrics. Used by the PSS
    export and the side-car evaluator."""
    with precision.float32_policy():
        model = task.build_model(run)
    model.load_weights(checkpoint).expect_partial()
    # With the training's loss and metrics: tf-keras's save builds the compiled metrics of the
    # model it saves, and warns on stderr about a model that has none.
    model.compile(loss=task.loss(run), metrics=task.metrics(run))
    return model


def save_unsharded(task: Task, run: Run, checkpoint: str) -> None:
    model = model_from_checkpoint(task, run, checkpoint)
    task.export(model, run.model_dir, run)
    log.info("saved model to %s (from %s)", run.model_dir, checkpoint)
