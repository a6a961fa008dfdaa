"""What the runtime does between epochs (trainer.loop.Events): the epoch log, TensorBoard's
scalars, the per-epoch checkpoints the evaluator watches, and the hyperparameter-tuning report.

`Composite` runs several in order: the order of the list is the order they run in."""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

import tensorflow as tf

from trainer import outputs
from trainer.library import input_wait, loop
from trainer.runtime import hypertune

log = logging.getLogger("trainer")


class Composite(loop.Events):
    def __init__(self, events: Sequence[loop.Events]):
        self.events = list(events)

    def epoch_begin(self, epoch: int) -> None:
        for events in self.events:
            events.epoch_begin(epoch)

    def steps_done(self, epoch: int, step: int) -> None:
        for events in self.events:
            events.steps_done(epoch, step)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        for events in self.events:
            events.epoch_end(epoch, logs)


def metrics_only(logs: dict) -> dict:
    """An epoch's logs without the input wait's figures and the epoch's seconds."""
    return {name: value for name, value in logs.items()
            if name not in (input_wait.METRIC, input_wait.WAITED, input_wait.STEPPED, "seconds")}


class EpochLog(loop.Events):
    """`epoch N/M begins` and `epoch N/M ends`, the end with the epoch's metrics and time when
    `with_metrics` (the chief's: every worker would print the same all-reduced numbers again),
    then the input-wait line (trainer.library.input_wait). One line format on every task."""

    def __init__(self, epochs: int, with_metrics: bool = True):
        self.epochs = epochs
        self.with_metrics = with_metrics

    def epoch_begin(self, epoch: int) -> None:
        log.info("epoch %d/%d begins", epoch, self.epochs)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        if not self.with_metrics:
            log.info("epoch %d/%d ends", epoch, self.epochs)
            return
        metrics = " ".join(f"{name}={value:.4f}" for name, value in sorted(metrics_only(logs).items()))
        log.info("epoch %d/%d ends: %s (%.1fs)", epoch, self.epochs, metrics, logs.get("seconds", 0.0))
        waiting = input_wait.pop(dict(logs))
        if waiting is not None:
            log.info("epoch %d/%d %s", epoch, self.epochs, input_wait.describe(*waiting))


class TensorBoardLog(loop.Events):
    """Each epoch's metrics as TensorBoard scalars, named as Keras' TensorBoard callback names them
    (`epoch_loss` under DIR/train, the val_ ones under DIR/validation), plus the input wait's share;
    the model's description (its layers and their dtype policies, as Keras' callback writes it);
    and, once, the graph of the train function (`graph`, called after the first step)."""

    def __init__(self, directory: str, model, graph: Callable[[], tf.Graph] | None = None):
        self.train = tf.summary.create_file_writer(outputs.join(directory, "train"))
        self.validation = tf.summary.create_file_writer(outputs.join(directory, "validation"))
        self.graph = graph
        with self.train.as_default(step=0):
            tf.summary.text("keras", model.to_json())

    def steps_done(self, epoch: int, step: int) -> None:
        if self.graph is not None:
            graph, self.graph = self.graph(), None
            with self.train.as_default():
                tf.summary.graph(graph)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        values = metrics_only(logs)
        if input_wait.METRIC in logs:
            values[input_wait.METRIC] = logs[input_wait.METRIC]
        for writer, names in ((self.train, [n for n in values if not n.startswith("val_")]),
                              (self.validation, [n for n in values if n.startswith("val_")])):
            with writer.as_default(step=epoch):
                for name in names:
                    tf.summary.scalar(f"epoch_{name.removeprefix('val_')}", values[name])
            writer.flush()


class EpochCheckpoints(loop.Events):
    """The model's weights after every epoch, `CHECKPOINT_DIR/epoch-N`, for the side-car evaluator
    and the export (trainer.runtime.saving). Weights only: the backup holds the optimizer. Under
    MultiWorkerMirroredStrategy every worker writes (a collective); only the chief's is kept."""

    def __init__(self, checkpoint_dir: str, model, is_chief: bool):
        from trainer.runtime import saving

        self.checkpoint_dir = checkpoint_dir
        self.checkpoint = saving.weights_checkpoint(model)
        self.is_chief = is_chief
        self.last: str | None = None

    def epoch_end(self, epoch: int, logs: dict) -> None:
        from trainer.runtime import saving

        self.last = saving.write_weights(self.checkpoint, self.checkpoint_dir, epoch, self.is_chief)


class HypertuneReport(loop.Events):
    """Reports one metric per epoch to Vertex AI hyperparameter tuning (trainer.runtime.hypertune): the
    validation value when there is one, else the training value. The chief's only."""

    def __init__(self, metric: str, reporter: hypertune.Reporter | None = None):
        self.metric = metric
        self.reporter = reporter or hypertune.Reporter()
        self.warned = False

    def epoch_end(self, epoch: int, logs: dict) -> None:
        value = logs.get(f"val_{self.metric}", logs.get(self.metric))
        if value is None:
            if not self.warned:
                log.warning("hypertune: no metric %r among %s (--hypertune-metric)", self.metric,
                            ", ".join(sorted(metrics_only(logs))))
                self.warned = True
            return
        try:
            self.reporter.report(self.metric, value, epoch)
        except OSError as error:
            log.warning("hypertune: cannot write %s (%s): this trial's metric is not reported",
                        self.reporter.path, error.strerror or error)


class Timer:
    """Seconds since it was made; for the final lines."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.started = clock()

    def seconds(self) -> float:
        return self.clock() - self.started
