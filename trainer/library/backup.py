"""Preemption costs steps, not epochs: the training state backed up at step granularity, a save on
SIGTERM, and the resume.

`Backup` keeps one checkpoint of everything training needs to go on (the model's variables, the
optimizer's, the metrics' so far, and how many steps are done) in the job's backup directory, and
restores it when the job starts again. Under MultiWorkerMirroredStrategy writing a checkpoint is a
collective (reading the metrics sums them over the workers), so every worker writes one: the chief
into the backup directory, the others into a scratch directory of their own, removed at once.
Every worker restores the chief's.

When to back up:
- on SIGTERM, which Vertex AI and Kubernetes send before they stop a replica (Spot VMs get about
  30 s): every task saves, then training stops with `Preempted` and the process exits 143;
- with `--backup-every-steps N`, every N steps; with 0, at each epoch's end;
- by default (`auto`), when the time since the last backup is 50 times what the last backup took
  (at least a minute): backups then cost about 2% of the training time whatever the step time,
  so a preemption without warning loses a few minutes of work on a GPU as on a CPU, where a fixed
  N cannot do both (a ResNet50 step takes a fraction of a second on a GPU, seconds on a CPU).

A synchronous job's tasks must save at the same step: `SynchronousGuard` has them vote after each
call of the train function, through one all-reduce of two numbers (did any get SIGTERM; does the
chief want a backup). A ParameterServer job's coordinator decides alone (`CoordinatorGuard`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import signal
import tempfile
import threading
import time
from typing import Callable, Iterator

import tensorflow as tf

from trainer.library import loop

log = logging.getLogger("trainer")

# auto mode: backups take about this share of the time, and come at least this far apart.
BACKUP_TIME_SHARE = 0.02
MIN_BACKUP_INTERVAL_SECONDS = 60.0


class Preempted(Exception):
    """Training stopped on SIGTERM after saving a backup; a restart resumes at (epoch, step):
    the 1-based epoch and the steps already done in it."""

    def __init__(self, epoch: int, step: int):
        super().__init__(f"epoch {epoch} step {step}")
        self.epoch, self.step = epoch, step


class BackupMismatch(ValueError):
    """The backup found was written by a different model. str() is one line."""


def resume_point(steps_done: int, steps_per_epoch: int) -> tuple[int, int]:
    """(1-based epoch, steps already done in it) after `steps_done` steps of the whole run."""
    epoch, step = divmod(steps_done, steps_per_epoch)
    return epoch + 1, step


def backup_interval(last_backup_seconds: float | None) -> float:
    """Seconds of training between two auto backups."""
    if last_backup_seconds is None:
        return MIN_BACKUP_INTERVAL_SECONDS
    return max(MIN_BACKUP_INTERVAL_SECONDS, last_backup_seconds / BACKUP_TIME_SHARE)


class Backup:
    """The training state in `directory`, at most one checkpoint of it. `every_steps`: None for
    auto, 0 for each epoch's end, else every N steps."""

    def __init__(self, directory: str, model, steps_per_epoch: int, is_chief: bool, every_steps: int | None,
                 clock: Callable[[], float] = time.monotonic):
        self.directory = directory
        self.steps_per_epoch = steps_per_epoch
        self.is_chief = is_chief
        self.every_steps = every_steps
        self.clock = clock
        self.model = model
        self.last: tuple[int, int] | None = None  # resume point of the newest backup
        self.last_seconds: float | None = None  # how long it took
        self.saved_at = 0  # steps done at the newest backup
        self.finished_at = clock()

    @functools.cached_property
    def steps_done(self) -> tf.Variable:
        return tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")

    @functools.cached_property
    def checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer, steps_done=self.steps_done)

    def restore(self) -> int:
        """Loads the newest backup, if there is one; returns the steps it had done (0 without)."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        status = self.checkpoint.restore(latest)
        try:
            status.assert_existing_objects_matched()
        except AssertionError as error:
            first = str(error).strip().splitlines()[0][:200]
            raise BackupMismatch(f"the backup {latest} was written by a different model ({first}); delete "
                                 f"{self.directory} or train with another --checkpoint-dir") from None
        steps = self.saved_at = int(self.steps_done.numpy())
        self.last = resume_point(steps, self.steps_per_epoch)
        log.info("resumed from backup at epoch %d step %d", *self.last)
        self.finished_at = self.clock()
        return steps

    def save(self, steps_done: int) -> None:
        """Every task of a synchronous job calls it at the same step."""
        started = self.clock()
        self.steps_done.assign(steps_done)
        with _write_path(self.directory, self.is_chief) as directory:
            tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=1, checkpoint_name="backup").save()
        self.finished_at = self.clock()
        self.last_seconds = self.finished_at - started
        self.last = resume_point(steps_done, self.steps_per_epoch)
        self.saved_at = steps_done
        if self.is_chief:
            log.info("backup saved in %.1fs: a restart resumes at epoch %d step %d", self.last_seconds, *self.last)

    def due(self, steps_done: int) -> bool:
        """Whether a backup is due after `steps_done` steps of the run (not at epoch ends with 0)."""
        if self.every_steps is None:
            return self.clock() - self.finished_at >= backup_interval(self.last_seconds)
        return self.every_steps > 0 and steps_done - self.saved_at >= self.every_steps

    def finish(self) -> None:
        """Training is done: the next run of this job starts afresh (as Keras' BackupAndRestore)."""
        if self.is_chief and tf.io.gfile.exists(self.directory):
            tf.io.gfile.rmtree(self.directory)

    def describe_resume(self) -> str:
        return "epoch %d step %d" % self.last if self.last else "the start (no backup yet)"


@contextlib.contextmanager
def _write_path(directory: str, is_chief: bool) -> Iterator[str]:
    if is_chief:
        yield directory
        return
    scratch = tempfile.mkdtemp(prefix="backup-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def sigterm_flag() -> Iterator[threading.Event]:
    """An Event set when this process gets SIGTERM, for the duration of the block (main thread)."""
    received = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.set())
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


class SynchronousGuard(loop.Events):
    """After each call of the train function every task learns whether any got SIGTERM and whether
    the chief wants a backup (one all-reduce); then all save at this same step, and on SIGTERM
    stop with Preempted. Before a save, the replicas' non-trainable state is averaged (`sync`)."""

    def __init__(self, backup: Backup, strategy: tf.distribute.Strategy, sigterm: threading.Event,
                 sync: Callable[[], None]):
        super().__init__()
        self.backup = backup
        self.sigterm = sigterm
        self.sync = sync

        # Compiled: an eager cross-worker all-reduce per step is slow (TensorFlow warns).
        @tf.function(autograph=False)
        def votes(local):
            per_replica = strategy.run(lambda: tf.identity(local))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._votes = votes

    def steps_done(self, epoch: int, step: int) -> None:
        done = (epoch - 1) * self.backup.steps_per_epoch + step
        local = [1.0 if self.sigterm.is_set() else 0.0, 1.0 if self.backup.is_chief and self.backup.due(done) else 0.0]
        sigterm, due = (float(v) > 0 for v in self._votes(tf.constant(local)).numpy())
        if sigterm or due:
            self.sync()
            self.backup.save(done)
        if sigterm:
            raise Preempted(*self.backup.last)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        if self.backup.every_steps == 0:
            self.backup.save(epoch * self.backup.steps_per_epoch)  # fit has averaged the state


class CoordinatorGuard(loop.Events):
    """A ParameterServer job's coordinator: on SIGTERM or when a backup is due, it waits for the
    steps scheduled so far, then saves; on SIGTERM it then stops with Preempted."""

    def __init__(self, backup: Backup, sigterm: threading.Event, wait: Callable[[], None]):
        super().__init__()
        self.backup = backup
        self.sigterm = sigterm
        self.wait = wait

    def steps_done(self, epoch: int, step: int) -> None:
        done = (epoch - 1) * self.backup.steps_per_epoch + step
        sigterm = self.sigterm.is_set()
        if sigterm or self.backup.due(done):
            self.wait()
            self.backup.save(done)
        if sigterm:
            raise Preempted(*self.backup.last)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        if self.backup.every_steps == 0:
            self.backup.save(epoch * self.backup.steps_per_epoch)
