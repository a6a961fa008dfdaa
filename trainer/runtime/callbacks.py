"""What the runtime does between a job's steps and epochs, as Keras callbacks in the loop's terms
(trainer.loop.Events): each epoch's time and input wait, the epoch log, TensorBoard's scalars, the
per-epoch checkpoints the evaluator watches, and the hyperparameter-tuning report. `for_job` puts
them in the order they run in.

The loop hands them the metrics alone; the timings are measured here (`Timings`) and read from
it by what reports them, so no name of a user's metric can ever be mistaken for one of ours."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable

import tensorflow as tf

from trainer import outputs
from trainer.library import input_wait, loop
from trainer.runtime import hypertune, profiling, saving
from trainer.runtime.config import TrainConfig
from trainer.tasks import Run

log = logging.getLogger("trainer")


@dataclasses.dataclass(frozen=True)
class EpochTiming:
    """How long an epoch took (its steps and its validation), and its steps' wait for input."""

    seconds: float
    waits: input_wait.Waits | None


class Timings(loop.Events):
    """Each epoch's `EpochTiming`, the newest last. It reads the input-wait measurement at each
    epoch's end and resets it, so under MultiWorkerMirroredStrategy every worker runs it (the
    read is a collective); it must come before whatever reports the timings."""

    def __init__(self, waits: input_wait.InputWait | None, strategy: tf.distribute.Strategy,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.waits = waits
        self.strategy = strategy
        self.clock = clock
        self.epochs: list[EpochTiming] = []
        self._started = 0.0

    def epoch_begin(self, epoch: int) -> None:
        self._started = self.clock()

    def epoch_end(self, epoch: int, logs: dict) -> None:
        waits = None
        if self.waits is not None:
            waits = self.waits.results(self.strategy)
            self.waits.reset()
        self.epochs.append(EpochTiming(self.clock() - self._started, waits))

    @property
    def last(self) -> EpochTiming | None:
        return self.epochs[-1] if self.epochs else None


class EpochLog(loop.Events):
    """`epoch N/M begins` and `epoch N/M ends`, the end with the epoch's metrics and time when
    `with_metrics` (the chief's: every worker would print the same all-reduced numbers again),
    then the input-wait line. One line format on every task."""

    def __init__(self, epochs: int, timings: Timings, with_metrics: bool = True):
        super().__init__()
        self.epochs = epochs
        self.timings = timings
        self.with_metrics = with_metrics

    def epoch_begin(self, epoch: int) -> None:
        log.info("epoch %d/%d begins", epoch, self.epochs)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        if not self.with_metrics:
            log.info("epoch %d/%d ends", epoch, self.epochs)
            return
        timing = self.timings.last
        metrics = " ".join(f"{name}={value:.4f}" for name, value in sorted(logs.items()))
        log.info("epoch %d/%d ends: %s (%.1fs)", epoch, self.epochs, metrics, timing.seconds if timing else 0.0)
        if timing and timing.waits is not None:
            log.info("epoch %d/%d %s", epoch, self.epochs, timing.waits.describe())


class TensorBoardLog(loop.Events):
    """Each epoch's metrics as TensorBoard scalars, named as Keras' TensorBoard callback names them
    (`epoch_loss` under DIR/train, the val_ ones under DIR/validation), plus the input wait's share
    (`epoch_input_wait`, under DIR/train); the model's description (its layers and their dtype
    policies, as Keras' callback writes it); and, once, the graph of the train function (`graph`,
    called after the first step)."""

    INPUT_WAIT = "input_wait"

    def __init__(self, directory: str, model, timings: Timings, graph: Callable[[], tf.Graph] | None = None):
        super().__init__()
        self.train = tf.summary.create_file_writer(outputs.join(directory, "train"))
        self.validation = tf.summary.create_file_writer(outputs.join(directory, "validation"))
        self.timings = timings
        self.graph = graph
        with self.train.as_default(step=0):
            tf.summary.text("keras", model.to_json())

    def steps_done(self, epoch: int, step: int) -> None:
        if self.graph is not None:
            graph, self.graph = self.graph(), None
            with self.train.as_default():
                tf.summary.graph(graph)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        train = {name: value for name, value in logs.items() if not name.startswith("val_")}
        validation = {name.removeprefix("val_"): value for name, value in logs.items() if name.startswith("val_")}
        timing = self.timings.last
        for writer, scalars in ((self.train, train), (self.validation, validation)):
            with writer.as_default(step=epoch):
                for name, value in scalars.items():
                    tf.summary.scalar(f"epoch_{name}", value)
                if writer is self.train and timing and timing.waits is not None:
                    tf.summary.scalar(f"epoch_{self.INPUT_WAIT}", timing.waits.share)
            writer.flush()


class EpochCheckpoints(loop.Events):
    """The model's weights after every epoch, `CHECKPOINT_DIR/epoch-N`, for the side-car evaluator
    and the export (trainer.runtime.saving). Weights only: the backup holds the optimizer. Under
    MultiWorkerMirroredStrategy every worker writes (a collective); only the chief's is kept."""

    def __init__(self, checkpoint_dir: str, model, is_chief: bool):
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint = saving.weights_checkpoint(model)
        self.is_chief = is_chief
        self.last: str | None = None

    def epoch_end(self, epoch: int, logs: dict) -> None:
        self.last = saving.write_weights(self.checkpoint, self.checkpoint_dir, epoch, self.is_chief)


class HypertuneReport(loop.Events):
    """Reports one metric per epoch to Vertex AI hyperparameter tuning (trainer.runtime.hypertune):
    the validation value when there is one, else the training value. The chief's only."""

    def __init__(self, metric: str, reporter: hypertune.Reporter | None = None):
        super().__init__()
        self.metric = metric
        self.reporter = reporter or hypertune.Reporter()
        self.warned = False

    def epoch_end(self, epoch: int, logs: dict) -> None:
        value = logs.get(f"val_{self.metric}", logs.get(self.metric))
        if value is None:
            if not self.warned:
                log.warning("hypertune: no metric %r among %s (--hypertune-metric)", self.metric, ", ".join(sorted(logs)))
                self.warned = True
            return
        try:
            self.reporter.report(self.metric, value, epoch)
        except OSError as error:
            log.warning("hypertune: cannot write %s (%s): this trial's metric is not reported",
                        self.reporter.path, error.strerror or error)


def for_job(run: Run, config: TrainConfig, steps: loop.Steps, *, graph: Callable[[], tf.Graph] | None = None,
            ) -> tuple[list[loop.Events], EpochCheckpoints, Timings]:
    """What runs between a job's epochs, in order: the epoch's timings (every task), the per-epoch
    checkpoints (every training task under MultiWorkerMirroredStrategy), then, on the chief,
    TensorBoard's scalars, the epoch log (begins and ends on every task, metrics on the chief),
    the tuning report; and the profile (--profile-steps, on the tasks --profile-tasks names).
    `graph`: the train function's graph, for TensorBoard."""
    model = steps.model
    timings = Timings(steps.input_wait, steps.strategy)
    checkpoints = EpochCheckpoints(config.checkpoint_dir, model, run.is_chief)
    events: list[loop.Events] = [timings, checkpoints]
    if run.is_chief:
        events.append(TensorBoardLog(config.tensorboard_dir, model, timings, graph))
    events.append(EpochLog(config.epochs, timings, with_metrics=run.is_chief))
    if run.is_chief:
        events.append(HypertuneReport(config.hypertune_metric))
    if config.profile_steps and profiling.profiles_here(config.profile_tasks, run.is_chief):
        events.append(profiling.ProfileSteps(profiling.log_dir(config.tensorboard_dir, run.task_name, run.is_chief),
                                             *config.profile_steps, steps_per_epoch=run.steps_per_epoch,
                                             wait=steps.wait))
    return events, checkpoints, timings
