"""`model.fit` for a script of your own, under any synchronous strategy, MultiWorkerMirrored
included, on the loop of trainer/library/loop.py (docs/keras.md).

The callbacks are Keras' own and run as `fit` runs them, in every worker's process, on the same
all-reduced logs, so every worker decides alike (EarlyStopping, ReduceLROnPlateau,
LearningRateScheduler: a learning rate changed on one worker alone would train the workers'
copies apart). What differs across workers, and why:
- a callback that only writes what it sees (TensorBoard, CSVLogger, the progress bar) runs on the
  chief alone: the other workers would write the same numbers into the same files;
- ModelCheckpoint runs everywhere, because saving a whole model reads the metrics' variables,
  which under MultiWorkerMirroredStrategy is a collective every worker must join; the other
  workers' copies go to a scratch directory of their own, removed at the end (as the runtime's
  epoch checkpoints do), so only the chief's reaches the path given;
- BackupAndRestore is refused: its workers would share one backup directory (Keras 3 has no chief
  logic there, and two workers die on the file's lock). `backup_dir=` backs up at step granularity.
- `model.stop_training`, which a callback sets to stop, is agreed over the workers (one small
  all-reduce after each call of the train function, and at each epoch's end) when there are
  callbacks and several workers: a worker that stopped alone would leave the others waiting in
  their next all-reduce.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import Callable, Iterator, Sequence

import keras
import tensorflow as tf

from trainer.library import backup as backup_lib
from trainer.library.loop import Steps, UnsupportedModel, fit

Dataset = tf.data.Dataset | Callable[[tf.distribute.InputContext], tf.data.Dataset]
# Callbacks that only write what they are given: the chief's copy is the one worth writing.
CHIEF_ONLY = (keras.callbacks.TensorBoard, keras.callbacks.CSVLogger, keras.callbacks.ProgbarLogger)


def fit_model(model: keras.Model, dataset: Dataset, *, epochs: int, steps_per_epoch: int,
              validation_data: Dataset | None = None, validation_steps: int | None = None,
              callbacks: Sequence[keras.callbacks.Callback] | None = None, backup_dir: str | None = None,
              verbose: int = 2, steps_per_execution: int = 1) -> keras.callbacks.History:
    """`model.fit` for a script of your own, under any strategy, MultiWorkerMirrored included.

    In place of `model.fit(dataset, epochs=3, steps_per_epoch=100)`, with the model built and
    compiled in `strategy.scope()` as `fit` under a strategy wants it:

        from trainer.loop import fit_model
        history = fit_model(model, dataset, epochs=3, steps_per_epoch=100)

    `dataset` is what `fit` takes under a strategy: a `tf.data.Dataset` of global batches (each
    worker reads its share, as `fit` shards it), or a function from a `tf.distribute.InputContext`
    to a dataset of per-replica batches. It is repeated: `steps_per_epoch` says how many batches
    an epoch is. `validation_data` the same, read for `validation_steps` batches after each
    epoch. `callbacks`: Keras callbacks, run as the module's docstring says. With `backup_dir`
    (on storage every worker reaches, e.g. a gs:// path), the training state is backed up there
    every few minutes and on SIGTERM, which then ends the process with exit code 143; a rerun
    resumes at the step. `verbose`: Keras' progress bar on the chief (2: a line per epoch).
    Returns the `keras.callbacks.History`, as `fit` does. ParameterServerStrategy needs the
    runtime's coordinator: use a `trainer.tasks.Task` there.
    """
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise UnsupportedModel("fit_model runs the synchronous strategies; a ParameterServer job needs a "
                               "trainer.tasks.Task (docs/your-own-code.md)")
    given = list(callbacks or [])
    if any(isinstance(callback, keras.callbacks.BackupAndRestore) for callback in given):
        raise UnsupportedModel("keras.callbacks.BackupAndRestore cannot back up a multi-worker job (its workers would "
                               "share one directory): give fit_model backup_dir= instead, which backs up at the step")
    steps = Steps(strategy, model, steps_per_execution=steps_per_execution)
    train, spec = _distribute(strategy, dataset)
    steps.build(spec)
    validation = None
    if validation_data is not None:
        if not validation_steps:
            raise UnsupportedModel("validation_data needs validation_steps: batches to read after each epoch")
        validation = (iter(_distribute(strategy, validation_data)[0]), validation_steps)
    chief = strategy.extended.should_checkpoint
    start_epoch, start_step, saved = 1, 0, None
    with _for_this_worker(given, chief) as here, backup_lib.sigterm_flag() as sigterm:
        guards: list[keras.callbacks.Callback] = []
        if backup_dir:
            saved = backup_lib.Backup(backup_dir, model, steps_per_epoch, chief, every_steps=None)
            start_epoch, start_step = backup_lib.resume_point(saved.restore(), steps_per_epoch)
            guards.append(backup_lib.SynchronousGuard(saved, strategy, sigterm, steps.sync_state))
        if given and strategy.num_replicas_in_sync > len(strategy.extended.worker_devices):
            here.append(StopAgreement(strategy))  # last: after every callback that may set the flag
        every = keras.callbacks.CallbackList([*guards, *here], add_history=True, add_progbar=bool(verbose) and chief,
                                             model=model, verbose=verbose, epochs=epochs, steps=steps_per_epoch)
        try:
            fit(steps, iter(train), epochs=epochs, steps_per_epoch=steps_per_epoch, start_epoch=start_epoch,
                start_step=start_step, validation=validation, callbacks=every)
        except backup_lib.Preempted as stop:
            print(f"preempted (SIGTERM): saved a backup in {backup_dir}; a rerun resumes at epoch {stop.epoch} "
                  f"step {stop.step}", file=sys.stderr, flush=True)
            raise SystemExit(143) from None
    if saved is not None:
        saved.finish()
    return model.history


class StopAgreement(keras.callbacks.Callback):
    """Every worker stops where any one's callbacks set `model.stop_training`: one all-reduce of
    the flag after each call of the train function and at each epoch's end."""

    def __init__(self, strategy: tf.distribute.Strategy):
        super().__init__()

        # Compiled: an eager cross-worker all-reduce per step is slow (TensorFlow warns).
        @tf.function(autograph=False)
        def stops(flag):
            per_replica = strategy.run(lambda: tf.identity(flag))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._stops = stops

    def _agree(self) -> None:
        self.model.stop_training = float(self._stops(tf.constant(1.0 if self.model.stop_training else 0.0))) > 0

    def on_train_batch_end(self, batch, logs=None):
        self._agree()

    def on_epoch_end(self, epoch, logs=None):
        self._agree()


@contextlib.contextmanager
def _for_this_worker(callbacks: list[keras.callbacks.Callback], chief: bool) -> Iterator[list[keras.callbacks.Callback]]:
    """The callbacks this worker runs (the module's docstring says which): on any worker but the
    chief, without the chief's writers, and with ModelCheckpoint saving into a scratch directory
    removed at the end."""
    if chief:
        yield list(callbacks)
        return
    scratch = tempfile.mkdtemp(prefix="fit_model-")
    try:
        here = []
        for callback in callbacks:
            if isinstance(callback, CHIEF_ONLY):
                continue
            if isinstance(callback, keras.callbacks.ModelCheckpoint):
                callback.filepath = os.path.join(scratch, callback.filepath.rstrip("/").rsplit("/", 1)[-1])
            here.append(callback)
        yield here
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _distribute(strategy: tf.distribute.Strategy, dataset: Dataset):
    """(distributed dataset, one input pipeline's element_spec) for a dataset or a dataset function."""
    if isinstance(dataset, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(dataset.repeat()), dataset.element_spec
    specs: list = []

    def built(context):
        made = dataset(context)
        specs.append(made.element_spec)
        return made.repeat()

    distributed = strategy.distribute_datasets_from_function(built)
    return distributed, specs[0]
