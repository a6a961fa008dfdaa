"""Synchronous training: MultiWorkerMirroredStrategy across workers, or Mirrored/OneDevice in
one process. Each worker builds its own input pipeline over its own share of the data, from the
task's dataset function, and every worker runs the same loop (trainer.loop) step for step."""

from __future__ import annotations

import logging
import sys

import keras
import tensorflow as tf

from trainer import exits, outputs
from trainer.library import backup as backup_lib
from trainer.library import loop
from trainer.runtime import callbacks, peers, plan, provenance, saving, storage
from trainer.runtime import strategy as strategy_lib
from trainer.cluster import Cluster
from trainer.runtime.config import ConfigError, TrainConfig
from trainer.tasks import Task

log = logging.getLogger("trainer")


def run(task: Task, config: TrainConfig, cluster: Cluster, strategy_name: str, name: str) -> int:
    """`name`: the command's name, for its error lines."""
    strategy = strategy_lib.create(strategy_name, cluster)  # before any other TensorFlow op
    replicas = strategy.num_replicas_in_sync
    global_batch = config.per_replica_batch_size * replicas
    keras.utils.set_random_seed(config.seed)

    examples = task.prepare(config.task_flags)
    num_pipelines = max(cluster.num_workers, 1)
    steps_per_epoch = plan.steps_per_epoch(config, examples, global_batch)
    validation_steps = plan.validation_steps(config, examples, global_batch)

    def make_run():
        return plan.make_run(config, cluster, strategy_name, replicas_in_sync=replicas, num_input_pipelines=num_pipelines,
                             steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                             shuffle_seed=config.seed)

    # Before the model is built; every task of the job then trains in the same policy.
    plan.choose_precision(task, make_run(), config, agree=peers.mean_over_tasks(strategy) if cluster.is_distributed else None)
    run_info = make_run()
    has_validation = task.validation_dataset(run_info, tf.distribute.InputContext()) is not None
    if has_validation and validation_steps is None:
        raise ConfigError("the task has validation data but does not report its size: pass --validation-steps")
    log.info(
        "strategy=%s replicas=%d global_batch=%d (%d per replica) steps_per_epoch=%d input_pipelines=%d%s",
        strategy_name, replicas, global_batch, config.per_replica_batch_size, steps_per_epoch, num_pipelines,
        f" train_examples={examples.train}" if examples and examples.train else "",
    )

    train_fn, train_spec = plan.captured_spec(lambda context: task.train_dataset(run_info, context))
    train_dataset = strategy.distribute_datasets_from_function(train_fn)
    validation = None
    if has_validation:
        validation_dataset = strategy.distribute_datasets_from_function(
            lambda context: task.validation_dataset(run_info, context).repeat())
        validation = (iter(validation_dataset), validation_steps)

    with strategy.scope():
        model = task.build_model(run_info)
        plan.compile_model(task, run_info, model)
    steps = loop.Steps(strategy, model, steps_per_execution=config.steps_per_execution, jit_compile=config.jit_compile)
    with plan.data_errors(task, run_info):
        steps.build(train_spec[0])

    backup = backup_lib.Backup(outputs.backup_dir(config.checkpoint_dir), model, steps_per_epoch, cluster.is_chief,
                               config.backup_every_steps)
    start_epoch, start_step = backup_lib.resume_point(backup.restore(), steps_per_epoch)
    train_iterator = iter(train_dataset)
    events, checkpoints = plan.between_epochs(task, run_info, config, model, chief=cluster.is_chief,
                                              graph=lambda: steps.train_graph(train_iterator))
    with backup_lib.sigterm_flag() as sigterm:
        guard = backup_lib.SynchronousGuard(backup, strategy, sigterm, steps.sync_state)
        try:
            with plan.data_errors(task, run_info):
                history = loop.fit(steps, train_iterator, epochs=config.epochs, steps_per_epoch=steps_per_epoch,
                                   start_epoch=start_epoch, start_step=start_step, validation=validation,
                                   events=callbacks.Composite([guard, *events]))
                if checkpoints.last is None:  # resumed from a backup taken after the last step
                    steps.sync_state()
                    checkpoints.epoch_end(config.epochs, {})
        except backup_lib.Preempted as stop:
            print(f"{name}: preempted (SIGTERM): saved a backup; a restart resumes at epoch {stop.epoch} "
                  f"step {stop.step} (exit {exits.RETRYABLE})", file=sys.stderr)
            return exits.RETRYABLE
        except peers.LOST_PEER_ERRORS as error:
            if not cluster.is_distributed or storage.failure(error):
                raise
            print(f"{name}: error: lost {peers.lost_peer(error)} of this {strategy_name} job ({type(error).__name__}: "
                  f"{peers.error_summary(error)}); a restart resumes at {backup.describe_resume()} "
                  f"(exit {exits.RETRYABLE})", file=sys.stderr)
            return exits.RETRYABLE
    log.info("trained %d epochs of %d steps; weights %s%s", config.epochs, steps_per_epoch, saving.fingerprint(model),
             " (every worker's are the same)" if cluster.is_distributed else "")
    backup.finish()
    if cluster.is_chief:
        saving.export(task, run_info, checkpoints.last, train_spec[0])
        summary = task.final_summary(history[-1], run_info) if history else None
        if summary:
            log.info("%s", summary)
        provenance.write(config, cluster, run_info, history, type(model.optimizer).__name__)
    return exits.OK
