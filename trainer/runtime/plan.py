"""What a process of a job will do, decided before anything is built: its steps per epoch, its
validation steps, and the `Run` its task is handed. Pure functions of plain values."""

from __future__ import annotations

from trainer.cluster import Cluster
from trainer.runtime.config import ConfigError, TrainConfig
from trainer.tasks import Examples, Run


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
             steps_per_epoch: int, validation_steps: int | None, shuffle_seed: int | None, mixed_precision: str,
             trains: bool = True) -> Run:
    """The `Run` for this process: `strategy`, the precision and the counts as the caller decided them."""
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
        mixed_precision=mixed_precision,
        trains=trains,
    )
