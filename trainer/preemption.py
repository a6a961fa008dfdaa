"""Preemption costs steps, not epochs: step-level backups, a save on SIGTERM, and the resume line.

Synchronous jobs (MultiWorkerMirrored, mirrored):
- `StepBackup` is tf-keras's BackupAndRestore backing up every N steps; it remembers and logs the
  last backup, so a failure can say where a restart resumes.
- `SaveOnSigterm` turns SIGTERM (what Vertex AI and Kubernetes send before they stop a replica;
  Spot VMs get about 30 s) into a backup at the current step on every worker, then ends
  training with `Preempted`. The signal reaches one task; the tasks agree at each step through
  a one-number all-reduce, so every worker saves at the same step (the chief's copy is the one a
  restart reads) and none is left waiting in a collective for a peer that has gone.
ParameterServer jobs keep epoch backups: tf-keras runs no batch hooks on the coordinator.
"""

from __future__ import annotations

import logging
import signal
import threading

import tensorflow as tf

log = logging.getLogger("trainer")


class Preempted(Exception):
    """Training stopped on SIGTERM after saving a backup at (epoch, step), both 1-based counts."""

    def __init__(self, epoch: int, step: int):
        super().__init__(f"epoch {epoch} step {step}")
        self.epoch, self.step = epoch, step


def resume_point(saved_epoch: int, saved_batch: int, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, steps already done in it), 1-based epoch, for a backup tf-keras saved after batch
    `saved_batch` (0-based) of epoch `saved_epoch` (0-based). This is where tf-keras resumes."""
    if saved_batch >= steps_per_epoch - 1:
        return saved_epoch + 2, 0
    return saved_epoch + 1, saved_batch + 1


class StepBackup(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore every `every_steps` steps (or every epoch when None), logging each backup
    from the chief and the point a restart resumes at."""

    def __init__(self, backup_dir: str, every_steps: int | None, steps_per_epoch: int, is_chief: bool):
        super().__init__(backup_dir, save_freq=every_steps or "epoch")
        self.steps_per_epoch = steps_per_epoch
        self.is_chief = is_chief
        self.last: tuple[int, int] | None = None  # resume point of the newest backup

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        state = self.model._training_state
        saved_epoch = int(state._ckpt_saved_epoch.numpy())
        saved_batch = int(state._ckpt_saved_batch.numpy())
        if saved_epoch >= 0:
            if self.save_freq == "epoch":
                self.last = (saved_epoch + 2, 0)
            else:
                self.last = resume_point(saved_epoch, saved_batch, self.steps_per_epoch)
            log.info("resumed from backup at epoch %d step %d", *self.last)

    def _backup(self, epoch, batch=0):
        super()._backup(epoch=epoch, batch=batch)
        if self.save_freq == "epoch":
            self.last = (epoch + 2, 0)
        else:
            self.last = resume_point(epoch, batch, self.steps_per_epoch)
        if self.is_chief:
            log.info("backup saved: a restart resumes at epoch %d step %d", *self.last)

    def describe_resume(self) -> str:
        return "epoch %d step %d" % self.last if self.last else "the start (no backup yet)"


class SaveOnSigterm(tf.keras.callbacks.Callback):
    """On SIGTERM in any task: every task backs up at the same step, then raises Preempted."""

    def __init__(self, backup: StepBackup, strategy: tf.distribute.Strategy):
        super().__init__()
        self.backup = backup
        self.strategy = strategy
        self.signalled = threading.Event()
        self._previous_handler = None

        # Compiled: an eager cross-worker all-reduce per step is slow (TensorFlow warns).
        @tf.function
        def any_task_signalled(flag):
            per_replica = strategy.run(lambda: tf.identity(flag))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None) > 0

        self._any_task_signalled_fn = any_task_signalled

    def _on_sigterm(self, signum, frame):
        self.signalled.set()

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_train_end(self, logs=None):
        self._restore_handler()

    def _restore_handler(self):
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _any_task_signalled(self) -> bool:
        return bool(self._any_task_signalled_fn(tf.constant(1.0 if self.signalled.is_set() else 0.0)))

    def on_train_batch_end(self, batch, logs=None):
        if not self._any_task_signalled():
            return
        self.backup._backup(epoch=self.backup._current_epoch, batch=batch)
        self._restore_handler()
        raise Preempted(*self.backup.last)
