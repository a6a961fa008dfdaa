"""Keras callbacks of our own: progress lines the launcher and tests can read, and the
hyperparameter-tuning report."""

from __future__ import annotations

import logging
import time
from typing import Callable

import tensorflow as tf

from trainer import input_wait

log = logging.getLogger("trainer")


class EpochLog(tf.keras.callbacks.Callback):
    """Logs `epoch N/M begins` and `epoch N/M ends`, the end with the epoch's metrics and time
    when `with_metrics`. It replaces Keras' own progress lines (fit runs with verbose=0): one
    line format on every task, and the metrics once per job, from the chief, where every worker
    would otherwise print the same all-reduced numbers again. After BackupAndRestore in the
    callback list, so a resumed run's first line names the epoch it resumed at.

    After the metrics, a line says what share of the steps' time went to waiting for input
    (trainer.input_wait)."""

    def __init__(self, epochs: int, with_metrics: bool = True, summary: Callable[[dict], str | None] | None = None):
        """`summary`: from the last epoch's metrics, a line to log at the end (the task's
        `final_summary`), or None."""
        super().__init__()
        self.epochs = epochs
        self.with_metrics = with_metrics
        self.summary = summary
        self.started = time.monotonic()
        self.last_logs: dict = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.monotonic()
        log.info("epoch %d/%d begins", epoch + 1, self.epochs)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        waiting = input_wait.pop(logs)
        self.last_logs = logs
        if not self.with_metrics:
            log.info("epoch %d/%d ends", epoch + 1, self.epochs)
            return
        metrics = " ".join(f"{name}={value:.4f}" for name, value in sorted(logs.items()))
        log.info("epoch %d/%d ends: %s (%.1fs)", epoch + 1, self.epochs, metrics, time.monotonic() - self.started)
        if waiting is not None:
            log.info("epoch %d/%d %s", epoch + 1, self.epochs, input_wait.describe(*waiting))


    def on_train_end(self, logs=None):
        if self.with_metrics and self.summary:
            line = self.summary(self.last_logs)
            if line:
                log.info("%s", line)


class HypertuneReport(tf.keras.callbacks.Callback):
    """Reports one metric per epoch to Vertex AI / AI Platform tuning through cloudml-hypertune.

    The validation value is reported when there is one, else the training value. Only the chief
    gets this callback: every process would write its own metrics file.
    """

    def __init__(self, metric: str):
        super().__init__()
        import hypertune

        self.metric = metric
        self.reporter = hypertune.HyperTune()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        value = logs.get(f"val_{self.metric}", logs.get(self.metric))
        if value is None:
            log.warning("hypertune: no metric %r in %s", self.metric, sorted(logs))
            return
        self.reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric, metric_value=float(value), global_step=epoch + 1
        )
