"""Synchronous training: MultiWorkerMirroredStrategy across workers, or Mirrored/OneDevice in
one process. Each worker builds its own input pipeline over its own share of the data, from the
task's dataset function, and every worker runs the same loop (trainer/library/loop.py) step for
step; they vote on backups and SIGTERM after every call of the train function
(trainer.library.backup.SynchronousGuard)."""

from __future__ import annotations

import logging

import tensorflow as tf

from trainer.cluster import Cluster
from trainer.library import backup as backup_lib
from trainer.library import input_wait, loop
from trainer.runtime import peers, training
from trainer.runtime import strategy as strategy_lib
from trainer.runtime.config import ConfigError, TrainConfig
from trainer.tasks import Task

log = logging.getLogger("trainer")


def train(task: Task, config: TrainConfig, cluster: Cluster, strategy_name: str, name: str) -> int:
    """This chief's or worker's part of the job; returns the exit code. `name`: the command's
    name, for its error lines."""
    strategy = strategy_lib.create(strategy_name, cluster)  # before any other TensorFlow op
    replicas = strategy.num_replicas_in_sync
    # Before the model is built; every task of the job then trains in the same policy.
    run, examples = training.start(task, config, cluster, strategy, strategy_name,
                                   input_pipelines=max(cluster.num_workers, 1), shuffle_seed=config.seed,
                                   validates=True,
                                   agree=peers.mean_over_tasks(strategy) if cluster.is_distributed else None)
    # The validation data, built once for each of this worker's input pipelines, when the
    # strategy asks for it: a probe built beforehand, only to learn whether there is any, cost as
    # much again (tracing the pipeline's maps: 0.25 to 0.34 CPU s of the small image example's
    # worker on a 2-core Xeon). A task without validation data returns None; an empty stand-in
    # takes its place, never iterated.
    returned: list = []

    def validation_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = task.validation_dataset(run, context)
        returned.append(dataset)
        return tf.data.Dataset.range(0) if dataset is None else dataset.repeat()

    validation_dataset = strategy.distribute_datasets_from_function(validation_fn)
    has_validation = returned[0] is not None
    if has_validation and run.validation_steps is None:
        raise ConfigError("the task has validation data but does not report its size: pass --validation-steps")
    log.info(
        "strategy=%s replicas=%d global_batch=%d (%d per replica) steps_per_epoch=%d input_pipelines=%d%s",
        strategy_name, replicas, run.global_batch_size, config.per_replica_batch_size, run.steps_per_epoch,
        run.num_input_pipelines, f" train_examples={examples.train}" if examples and examples.train else "",
    )

    train_fn, train_spec = training.captured_spec(lambda context: task.train_dataset(run, context))
    train_batches = iter(strategy.distribute_datasets_from_function(train_fn))
    validation = None
    if has_validation:
        validation = (iter(validation_dataset), run.validation_steps)

    model = training.build_model(task, run, strategy)
    with strategy.scope():
        waits = input_wait.InputWait(lanes=replicas)
    steps = loop.Steps(strategy, model, steps_per_execution=config.steps_per_execution, jit_compile=config.jit_compile,
                       input_wait=waits)

    def lost_peer(error: tf.errors.OpError, resume: str) -> str | None:
        if not cluster.is_distributed:
            return None
        peer = peers.lost_peer(error, (cluster.task_type, cluster.task_index))
        return (f"lost {peer} of this {strategy_name} job ({type(error).__name__}: "
                f"{peers.error_summary(error)}); a restart resumes at {resume}")

    return training.train(
        task, config, cluster, run, steps, train_batches, train_spec[0], name=name, validation=validation,
        guard=lambda backup, sigterm: backup_lib.SynchronousGuard(backup, strategy, sigterm, steps.sync_state),
        lost_peer=lost_peer, graph=lambda: steps.train_graph(train_batches))
