"""Saving the final model from every worker of a synchronous job.

`model.save` under MultiWorkerMirroredStrategy is a collective: every worker must call it, or the
chief waits forever for the others. Only the chief's copy is wanted, so each other worker saves
into a private temporary directory on its own disk and deletes it at once. (The lab saved those
copies next to the real model, in the bucket, one per worker per job.)
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from typing import Iterator

import tensorflow as tf

from trainer import serving
from trainer.cluster import Cluster

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


def save_model(model: tf.keras.Model, model_dir: str, cluster: Cluster, class_names, image_size: int) -> None:
    """Every task calls this; the chief's copy is the SavedModel with the serving signatures."""
    with save_path(model_dir, cluster) as path:
        serving.save(model, path, class_names, image_size)
        if cluster.is_chief:
            log.info("saved model to %s", path)
        else:
            log.info("saved this worker's copy to %s; removing it", path)
