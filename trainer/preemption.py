"""Preemption costs steps, not epochs: step-level backups, a save on SIGTERM, and the resume line.

Synchronous jobs (MultiWorkerMirrored, mirrored):
- `StepBackup` is tf-keras's BackupAndRestore saving at step granularity; it remembers and logs
  the last backup, so a failure can say where a restart resumes.
- `StepAgreement` runs after every step. Each task votes, through a two-number all-reduce, on
  whether it got SIGTERM (what Vertex AI and Kubernetes send before they stop a replica; Spot VMs
  get about 30 s) and, in the default `auto` mode, whether a backup is due. Saving a backup under
  MultiWorkerMirrored reads the metrics' sync-on-read variables across workers, so every task
  must save at the same step: the vote makes them agree. On SIGTERM every task saves, then
  training ends with `Preempted`.
- When is a backup due: with `--backup-every-steps N`, every N steps. By default (`auto`) when the
  time since the last backup is 50 times what the last backup took (at least a minute): backups
  then cost about 2% of the training time whatever the step time is, so a preemption without
  warning loses a few minutes of work on a GPU as on a CPU, and a fixed N cannot do both (a
  ResNet50 step at the default batch takes a fraction of a second on a GPU, seconds on a CPU).
ParameterServer jobs keep epoch backups: tf-keras runs no batch hooks on the coordinator.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import tensorflow as tf

log = logging.getLogger("trainer")

# auto mode: backups take about this share of the time, and come at least this far apart.
BACKUP_TIME_SHARE = 0.02
MIN_BACKUP_INTERVAL_SECONDS = 60.0
# tf-keras resumes at step granularity only when save_freq is a number; in auto mode its own
# counter must never fire, so it gets one no job reaches.
_NEVER = 1 << 62


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


def backup_interval(last_backup_seconds: float | None) -> float:
    """Seconds of training between two auto backups."""
    if last_backup_seconds is None:
        return MIN_BACKUP_INTERVAL_SECONDS
    return max(MIN_BACKUP_INTERVAL_SECONDS, last_backup_seconds / BACKUP_TIME_SHARE)


class StepBackup(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore at step granularity: every `every_steps` steps, or when StepAgreement
    says so (every_steps None), or every epoch (per_epoch). Logs each backup from the chief."""

    def __init__(self, backup_dir: str, every_steps: int | None, steps_per_epoch: int, is_chief: bool,
                 per_epoch: bool = False):
        super().__init__(backup_dir, save_freq="epoch" if per_epoch else (every_steps or _NEVER))
        self.steps_per_epoch = steps_per_epoch
        self.is_chief = is_chief
        self.last: tuple[int, int] | None = None  # resume point of the newest backup
        self.last_seconds: float | None = None  # how long the newest backup took
        self.finished_at = time.monotonic()

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
        self.finished_at = time.monotonic()

    def on_train_end(self, logs=None):
        # tf-keras gives every non-chief task a scratch directory beside the backup
        # (`workertemp_<id>`), creates it at the start and removes it only after one of its own
        # backups; the chief then deletes only its own. A run with no backup would leave the
        # scratch directory in the bucket, so each task removes its own here.
        state = self._training_state
        scratch = state.write_checkpoint_manager.directory
        super().on_train_end(logs)
        if state.write_checkpoint_manager is not state.read_checkpoint_manager and tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)

    def _backup(self, epoch, batch=0):
        started = time.monotonic()
        super()._backup(epoch=epoch, batch=batch)
        self.finished_at = time.monotonic()
        self.last_seconds = self.finished_at - started
        if self.save_freq == "epoch":
            self.last = (epoch + 2, 0)
        else:
            self.last = resume_point(epoch, batch, self.steps_per_epoch)
        if self.is_chief:
            log.info("backup saved in %.1fs: a restart resumes at epoch %d step %d", self.last_seconds, *self.last)

    def backup_due(self) -> bool:
        """auto mode: enough training since the last backup to make the next one cheap."""
        return self.save_freq == _NEVER and time.monotonic() - self.finished_at >= backup_interval(self.last_seconds)

    def describe_resume(self) -> str:
        return "epoch %d step %d" % self.last if self.last else "the start (no backup yet)"


class StepAgreement(tf.keras.callbacks.Callback):
    """After each step, every task learns whether any got SIGTERM and whether the chief wants a
    backup; then all back up at this same step, and on SIGTERM stop with Preempted."""

    def __init__(self, backup: StepBackup, strategy: tf.distribute.Strategy, is_chief: bool):
        super().__init__()
        self.backup = backup
        self.is_chief = is_chief
        self.signalled = threading.Event()
        self._previous_handler = None

        # Compiled: an eager cross-worker all-reduce per step is slow (TensorFlow warns).
        @tf.function
        def votes(local):
            per_replica = strategy.run(lambda: tf.identity(local))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._votes = votes

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

    def on_train_batch_end(self, batch, logs=None):
        local = [1.0 if self.signalled.is_set() else 0.0, 1.0 if self.is_chief and self.backup.backup_due() else 0.0]
        sigterm, due = (float(v) > 0 for v in self._votes(tf.constant(local)).numpy())
        if sigterm or due:
            self.backup._backup(epoch=self.backup._current_epoch, batch=batch)
        if sigterm:
            self._restore_handler()
            raise Preempted(*self.backup.last)
