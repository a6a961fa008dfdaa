"""Keras callbacks of our own: progress lines the launcher and tests can read, and the
hyperparameter-tuning report."""

from __future__ import annotations

import logging
import time

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

    def __init__(self, epochs: int, with_metrics: bool = True, num_classes: int | None = None):
        super().__init__()
        self.epochs = epochs
        self.with_metrics = with_metrics
        self.num_classes = num_classes
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
        if self.with_metrics and self.num_classes:
            line = accuracy_meaning(self.last_logs, self.num_classes)
            if line:
                log.info("%s", line)


def accuracy_meaning(logs: dict, num_classes: int) -> str | None:
    """One line saying what the last epoch's accuracy means: a share of images classified right,
    against what guessing would score. A newcomer cannot tell 0.2 from learning without it."""
    name = "val_accuracy" if "val_accuracy" in logs else "accuracy" if "accuracy" in logs else None
    if name is None:
        return None
    value, chance = float(logs[name]), 1.0 / num_classes
    images = "validation images" if name == "val_accuracy" else "training images (no validation data)"
    if value >= 2 * chance:
        verdict = f"{value / chance:.1f}x chance: the model learned"
    elif value > 1.25 * chance:
        verdict = "above chance but not far: train longer or on more data"
    else:
        verdict = "no better than guessing: the model has not learned (yet)"
    return (f"final {name}={value:.4f}: the share of {images} whose class the model ranks first; "
            f"guessing among {num_classes} classes scores {chance:.2f}, so this is {verdict}")


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
