"""What every training role works out the same way: the steps, the `Run` a task is handed, the
compiled model, what runs between epochs, and the task's word on a data error."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Iterator

import keras
import tensorflow as tf

from trainer.library import loop
from trainer.runtime import callbacks, profiling
from trainer.cluster import Cluster
from trainer.runtime.config import ConfigError, TrainConfig
from trainer.tasks import DataError, Examples, Run, Task

log = logging.getLogger("trainer")


def steps_per_epoch(config: TrainConfig, examples: Examples | None, global_batch: int) -> int:
    """--steps-per-epoch, else a whole pass over the training examples the task reported."""
    if config.steps_per_epoch:
        return config.steps_per_epoch
    if examples and examples.train:
        return max(1, examples.train // global_batch)
    raise ConfigError("the task does not report how many training examples it has: pass --steps-per-epoch")


def validation_steps(config: TrainConfig, examples: Examples | None, global_batch: int) -> int | None:
    """--validation-steps, else a whole pass over the validation examples the task reported; None
    when neither says."""
    if config.validation_steps:
        return config.validation_steps
    if examples and examples.validation:
        return max(1, examples.validation // global_batch)
    return None


def make_run(config: TrainConfig, cluster: Cluster, strategy: str, *, replicas_in_sync: int, num_input_pipelines: int,
             steps_per_epoch: int, validation_steps: int | None, shuffle_seed: int | None) -> Run:
    return Run(
        flags=config.task_flags,
        strategy=strategy,
        task_name=cluster.task_name,
        is_chief=cluster.is_chief,
        num_input_pipelines=num_input_pipelines,
        replicas_in_sync=replicas_in_sync,
        per_replica_batch_size=config.per_replica_batch_size,
        epochs=config.epochs,
        steps_per_epoch=steps_per_epoch,
        validation_steps=validation_steps,
        learning_rate=config.learning_rate,
        seed=config.seed,
        shuffle_seed=shuffle_seed,
        model_dir=config.model_dir,
        checkpoint_dir=config.checkpoint_dir,
        tensorboard_dir=config.tensorboard_dir,
        mixed_precision=keras.mixed_precision.global_policy().name,
    )


# The batch the bfloat16 probe times a task's model at, at most: enough for the arithmetic to
# dominate, small enough that a ResNet50 at 300 px measures in seconds on 2 cores.
PROBE_BATCH = 16


def choose_precision(task: Task, run: Run, config: TrainConfig, agree=None) -> str:
    """Sets the job's Keras policy (trainer.precision) before its model is built; `auto` on a CPU
    with bfloat16 instructions times the task's own model in both policies, on a batch of its own
    data (the validation data's first, else the training data's). `run`: made before the policy
    is chosen. Every task of a synchronous job calls it at the same point (`agree`)."""
    from trainer import precision

    probe_run = dataclasses.replace(run, trains=False)
    context = tf.distribute.InputContext()

    def measure():
        with data_errors(task, probe_run):
            dataset = task.validation_dataset(probe_run, context) or task.train_dataset(probe_run, context)
            x, _, _ = keras.utils.unpack_x_y_sample_weight(next(iter(dataset)))
        x = tf.nest.map_structure(lambda t: t[:PROBE_BATCH], x)
        return precision.measure_model(lambda: task.build_model(probe_run), x)

    return precision.apply(config.mixed_precision, agree=agree, measure=measure)


def legacy_keras(value: Any) -> str | None:
    """The class name of a legacy Keras 2 (tf_keras) object, else None."""
    kind = type(value)
    return f"{kind.__module__}.{kind.__name__}" if kind.__module__.split(".")[0] == "tf_keras" else None


def compile_model(task: Task, run: Run, model: Any) -> None:
    """Compiles the task's model with its optimizer, loss and metrics, after making sure they are
    Keras 3 objects: a legacy tf_keras one is refused with one line that names the way out."""
    parts = {"build_model": model, "optimizer": task.optimizer(run), "loss": task.loss(run)}
    metrics = task.metrics(run)
    for method, value in [*parts.items(), *(("metrics", metric) for metric in metrics or [])]:
        kind = legacy_keras(value)
        if kind:
            raise ConfigError(
                f"the {task.name} task's {method} gives a legacy Keras 2 object ({kind}); the runtime trains Keras 3: "
                "use `import keras` (TensorFlow 2.21's tf.keras is Keras 3 too) instead of tf_keras or the legacy-Keras "
                "switch (docs/keras.md#from-tf-keras)")
    if not isinstance(model, keras.Model):
        raise ConfigError(f"the {task.name} task's build_model gives {type(model).__module__}.{type(model).__name__}, "
                          "not a keras.Model")
    model.compile(optimizer=parts["optimizer"], loss=parts["loss"], metrics=metrics)
    try:
        loop.check_trainable(model)
    except loop.UnsupportedModel as error:
        raise ConfigError(f"the {task.name} task's model: {error}") from None


def between_epochs(task: Task, run: Run, config: TrainConfig, model, *, chief: bool, graph=None,
                   wait=lambda: None) -> tuple[list[loop.Events], callbacks.EpochCheckpoints]:
    """What runs between a job's epochs, in order: the per-epoch checkpoints (every training task
    under MultiWorkerMirroredStrategy), then, on the chief, TensorBoard's scalars, the epoch log
    (begins and ends on every task, metrics on the chief), the tuning report; and the profile
    (--profile-steps, on the tasks --profile-tasks names). `graph`: the train function's graph,
    for TensorBoard; `wait`: until the steps scheduled so far have run (a coordinator's)."""
    checkpoints = callbacks.EpochCheckpoints(config.checkpoint_dir, model, chief)
    events: list[loop.Events] = [checkpoints]
    if chief:
        events.append(callbacks.TensorBoardLog(config.tensorboard_dir, model, graph))
    events.append(callbacks.EpochLog(config.epochs, with_metrics=chief))
    if chief:
        events.append(callbacks.HypertuneReport(config.hypertune_metric))
    if config.profile_steps and profiling.profiles_here(config.profile_tasks, run.is_chief):
        events.append(profiling.ProfileSteps(profiling.log_dir(config.tensorboard_dir, run.task_name, run.is_chief),
                                             *config.profile_steps, steps_per_epoch=run.steps_per_epoch, wait=wait))
    return events, checkpoints


def captured_spec(dataset_fn):
    """`dataset_fn` wrapped so that the element_spec of the first dataset it builds is kept in
    the returned list: what `loop.Steps.build` needs, known before any batch is read."""
    specs: list = []

    def wrapped(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = dataset_fn(context)
        specs.append(dataset.element_spec)
        return dataset

    return wrapped, specs


@contextlib.contextmanager
def data_errors(task: Task, run: Run) -> Iterator[None]:
    """An error the task's `describe_error` says is its data's becomes a DataError (one line,
    exit 2); any other error passes on unchanged."""
    try:
        yield
    except DataError:
        raise
    except Exception as error:
        line = task.describe_error(error, run)
        if line is None:
            raise
        raise DataError(line) from None
