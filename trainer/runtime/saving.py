"""The model's weights after each epoch, and the export, saved from the chief only.

After each epoch every training task writes the model's weights as a TensorFlow checkpoint,
`CHECKPOINT_DIR/epoch-N` (what `tf.train.latest_checkpoint` finds): under
MultiWorkerMirroredStrategy writing is a collective, so the chief writes into the checkpoint
directory and every other worker into a scratch directory of its own, removed at once. The
weights are a list, in the order the model creates them, so a model the task builds again
(outside any strategy, in another process) reads them back whatever its layers are named.

At the end the chief alone exports: it builds the task's model again in float32, outside any
strategy, reads the final epoch's weights into it and hands it to the task's `export`. That one
path serves every strategy: a ParameterServer model's variables live on the parameter servers,
and a model trained in mixed precision serves in float32 (its weights are float32 under every
policy): exported in bfloat16 or float16, it would compute in them on whatever machine serves it,
where they may be emulated (bfloat16 about 6x slower on a CPU without its instructions,
trainer.precision).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import shutil
import tempfile
from typing import Iterator

import keras
import tensorflow as tf

from trainer import precision
from trainer.tasks import Run, Task

log = logging.getLogger("trainer")
CHECKPOINT_NAME = "epoch"


class CheckpointMismatch(ValueError):
    """A checkpoint that does not hold this model's weights. str() is one line."""


def weights_checkpoint(model: keras.Model) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(weights=list(model.weights))


def write_weights(checkpoint: tf.train.Checkpoint, checkpoint_dir: str, epoch: int, is_chief: bool) -> str:
    """Writes `CHECKPOINT_DIR/epoch-N` (the chief) or a scratch copy (any other worker, removed);
    returns the chief's path."""
    with _write_dir(checkpoint_dir, is_chief) as directory:
        manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=None, checkpoint_name=CHECKPOINT_NAME)
        return manager.save(checkpoint_number=epoch)


@contextlib.contextmanager
def _write_dir(directory: str, is_chief: bool) -> Iterator[str]:
    if is_chief:
        yield directory
        return
    scratch = tempfile.mkdtemp(prefix="weights-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def model_from_checkpoint(task: Task, run: Run, checkpoint: str, element_spec=None) -> keras.Model:
    """The task's model, built in float32 outside any strategy, with the checkpoint's weights,
    compiled with the task's loss and metrics (no optimizer). Used by the export and the side-car
    evaluator. A model that creates its weights on its first call is called once on zeros of
    `element_spec`'s shape."""
    from trainer.library import loop

    restoring = dataclasses.replace(run, trains=False)
    with precision.float32_policy():
        model = task.build_model(restoring)
        if not model.built and element_spec is not None:
            x, _, _ = keras.utils.unpack_x_y_sample_weight(loop.zeros_like_spec(element_spec))
            model(x, training=False)
    try:
        # (The checkpoint also holds the manager's save counter, which a model has no use for.)
        weights_checkpoint(model).read(checkpoint).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:200]
        raise CheckpointMismatch(f"{checkpoint} does not hold this task's model ({first})") from None
    model.compile(optimizer=None, loss=task.loss(restoring), metrics=task.metrics(restoring))
    return model


def export(task: Task, run: Run, checkpoint: str, element_spec=None) -> None:
    """The chief's export: the task's model in float32 with `checkpoint`'s weights, to run.model_dir."""
    model = model_from_checkpoint(task, run, checkpoint, element_spec)
    task.export(model, run.model_dir, run)
    log.info("saved model to %s (from %s)", run.model_dir, checkpoint)


def fingerprint(model: keras.Model) -> str:
    """A short hash of the model's weights: every worker of a synchronous job logs the same."""
    digest = hashlib.sha256()
    for weights in model.get_weights():
        digest.update(weights.tobytes())
    return digest.hexdigest()[:16]
