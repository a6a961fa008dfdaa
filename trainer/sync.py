"""Synchronous training: MultiWorkerMirroredStrategy across workers, or Mirrored/OneDevice in
one process. Each worker builds its own input pipeline over its own share of the data, from the
task's dataset function."""

from __future__ import annotations

import logging
import sys

import tensorflow as tf

from trainer import exits, outputs, peers, plan, precision, preemption, saving, storage
from trainer import strategy as strategy_lib
from trainer.cluster import Cluster
from trainer.config import ConfigError, TrainConfig
from trainer.tasks import Task

log = logging.getLogger("trainer")


def run(task: Task, config: TrainConfig, cluster: Cluster, strategy_name: str, name: str) -> int:
    """`name`: the command's name, for its error lines."""
    strategy = strategy_lib.create(strategy_name, cluster)  # before any other TensorFlow op
    # Before any model is built; every task of the job then trains in the same policy.
    precision.apply(config.mixed_precision, agree=peers.mean_over_tasks(strategy) if cluster.is_distributed else None)
    replicas = strategy.num_replicas_in_sync
    global_batch = config.per_replica_batch_size * replicas
    tf.keras.utils.set_random_seed(config.seed)

    examples = task.prepare(config.task_flags)
    num_pipelines = max(cluster.num_workers, 1)
    steps = plan.steps_per_epoch(config, examples, global_batch)
    validation_steps = plan.validation_steps(config, examples, global_batch)
    run_info = plan.make_run(config, cluster, strategy_name, replicas_in_sync=replicas, num_input_pipelines=num_pipelines,
                             steps_per_epoch=steps, validation_steps=validation_steps, shuffle_seed=config.seed)
    has_validation = task.validation_dataset(run_info, tf.distribute.InputContext()) is not None
    if has_validation and validation_steps is None:
        raise ConfigError("the task has validation data but does not report its size: pass --validation-steps")
    log.info(
        "strategy=%s replicas=%d global_batch=%d (%d per replica) steps_per_epoch=%d input_pipelines=%d%s",
        strategy_name, replicas, global_batch, config.per_replica_batch_size, steps, num_pipelines,
        f" train_examples={examples.train}" if examples and examples.train else "",
    )

    train_dataset = strategy.distribute_datasets_from_function(lambda context: task.train_dataset(run_info, context))
    validation_dataset = None
    if has_validation:
        validation_dataset = strategy.distribute_datasets_from_function(
            lambda context: task.validation_dataset(run_info, context).repeat())

    with strategy.scope():
        model = task.build_model(run_info)
        plan.compile_model(task, run_info, model, config, input_lanes=replicas)

    # First, so that a resumed run starts at the step it reached.
    backup = preemption.StepBackup(outputs.backup_dir(config.checkpoint_dir), config.backup_every_steps, steps,
                                   cluster.is_chief, per_epoch=config.backup_every_steps == 0)
    callback_list = [
        backup,
        preemption.StepAgreement(backup, strategy, cluster.is_chief),
        *plan.common_callbacks(task, run_info, config, log_metrics=cluster.is_chief, report=cluster.is_chief),
    ]

    try:
        with plan.data_errors(task, run_info):
            model.fit(
                train_dataset,
                epochs=config.epochs,
                steps_per_epoch=steps,
                validation_data=validation_dataset,
                validation_steps=validation_steps,
                callbacks=callback_list,
                verbose=0,  # EpochLog reports each epoch
            )
    except preemption.Preempted as stop:
        print(f"{name}: preempted (SIGTERM): saved a backup; a restart resumes at epoch {stop.epoch} "
              f"step {stop.step} (exit {exits.RETRYABLE})", file=sys.stderr)
        return exits.RETRYABLE
    except peers.LOST_PEER_ERRORS as error:
        if not cluster.is_distributed or storage.failure(error):
            raise
        print(f"{name}: error: lost {peers.lost_peer(error)} of this {strategy_name} job ({type(error).__name__}: "
              f"{peers.error_summary(error)}); a restart resumes at {backup.describe_resume()} (exit {exits.RETRYABLE})",
              file=sys.stderr)
        return exits.RETRYABLE
    saving.save_from_every_worker(task, model, run_info, cluster)
    return exits.OK
