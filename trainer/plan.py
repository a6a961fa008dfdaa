"""What every training role works out the same way: the steps, the `Run` a task is handed, the
compiled model, the callbacks the runtime adds to `fit`, and the task's word on a data error."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import tensorflow as tf

from trainer import callbacks, input_wait, outputs, profiling
from trainer.cluster import Cluster
from trainer.config import ConfigError, TrainConfig
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
        mixed_precision=tf.keras.mixed_precision.global_policy().name,
    )


def compile_model(task: Task, run: Run, model: tf.keras.Model, config: TrainConfig, input_lanes: int) -> None:
    """Compiles with the task's optimizer, loss and metrics and the runtime's execution options.
    Each train step also measures its wait for input (trainer.input_wait; `input_lanes` replicas
    step side by side), except under XLA, which cannot compile a timestamp."""
    model.compile(
        optimizer=task.optimizer(run),
        loss=task.loss(run),
        metrics=task.metrics(run),
        steps_per_execution=config.steps_per_execution,
        jit_compile=config.jit_compile,
    )
    if not config.jit_compile:
        input_wait.install(model, input_lanes)


def common_callbacks(task: Task, run: Run, config: TrainConfig, *, log_metrics: bool,
                     report: bool) -> list[tf.keras.callbacks.Callback]:
    """The per-epoch checkpoints (which the evaluator watches), TensorBoard, the epoch log, the
    tuning report (`report`: the chief only) and the profile (--profile-steps, on the tasks
    --profile-tasks names)."""
    result = [
        tf.keras.callbacks.ModelCheckpoint(outputs.checkpoint_pattern(config.checkpoint_dir), save_weights_only=True),
        tf.keras.callbacks.TensorBoard(config.tensorboard_dir),
        # Progress metrics from one task only: every worker would print the same numbers again.
        callbacks.EpochLog(config.epochs, with_metrics=log_metrics,
                           summary=(lambda logs: task.final_summary(logs, run)) if log_metrics else None),
    ]
    if report:
        result.append(callbacks.HypertuneReport(config.hypertune_metric))
    if config.profile_steps and profiling.profiles_here(config.profile_tasks, run.is_chief):
        result.append(profiling.ProfileSteps(profiling.log_dir(config.tensorboard_dir, run.task_name, run.is_chief),
                                             *config.profile_steps))
    return result


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
