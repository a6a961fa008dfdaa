"""Synchronous training: MultiWorkerMirroredStrategy across workers, or Mirrored/OneDevice in
one process. Each worker builds its own input pipeline over its own shard of the data."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys

import tensorflow as tf

from trainer import (callbacks, data, exits, model as model_lib, outputs, precision, preemption, profiling, saving,
                     sources, storage)
from trainer import strategy as strategy_lib
from trainer.cluster import Cluster
from trainer.config import TrainConfig

log = logging.getLogger("trainer")


def backup_dir(config: TrainConfig) -> str:
    return outputs.join(config.checkpoint_dir, "backup")


def checkpoint_pattern(config: TrainConfig) -> str:
    """Per-epoch weights, which the side-car evaluator watches for."""
    return outputs.join(config.checkpoint_dir, "epoch-{epoch:04d}")


def epoch_plan(config: TrainConfig, train: data.Split, validation: data.Split | None, global_batch: int):
    """(steps per epoch, validation steps): a whole pass over each split unless the flags say."""
    steps = config.steps_per_epoch or max(1, train.num_examples // global_batch)
    validation_steps = None
    if validation is not None:
        validation_steps = config.validation_steps or max(1, validation.num_examples // global_batch)
    return steps, validation_steps


def pipeline_options(config: TrainConfig, split: data.Split, training: bool, num_pipelines: int, trace_path=None,
                     examples_read: int | None = None):
    """`examples_read`: what one pipeline reads over the whole job, when known (a job that reads
    less than a pass does not cache)."""
    return data.PipelineOptions(
        image_size=config.image_size,
        per_replica_batch_size=config.per_replica_batch_size,
        training=training,
        cache=data.should_cache(config.cache_images, split.num_examples, config.image_size, num_pipelines,
                                examples_read),
        shuffle_buffer=config.shuffle_buffer,
        seed=config.seed,
        trace_path=trace_path,
        max_bad_examples=config.max_bad_examples,
    )


@contextlib.contextmanager
def bad_data_stops_the_job(config: TrainConfig, class_names):
    """The input pipeline's "too many undecodable images" and "label outside the classes" become
    one line and exit 2."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        bad_label = data.label_outside_classes(error)
        if bad_label is not None:
            raise sources.DataError(sources.label_error(*bad_label, class_names)) from None
        if not data.too_many_bad_examples(error):
            raise
        raise sources.DataError(
            f"more than {config.max_bad_examples} undecodable images in one pass over this task's data "
            f"(--max-bad-examples); the images skipped are named above") from None


def load_splits(config: TrainConfig) -> tuple[data.Split, data.Split | None]:
    train = sources.load(config.dataset, config.data_dir, "train")
    eval_spec = config.eval_dataset or sources.default_validation(config.dataset)
    validation = sources.load(eval_spec, config.data_dir, "validation") if eval_spec else None
    if validation is not None and validation.class_names != train.class_names:
        raise sources.DataError(
            f"--eval-dataset {eval_spec} has classes {', '.join(validation.class_names)}, but --dataset "
            f"{config.dataset} has {', '.join(train.class_names)}; both must describe the same classes")
    return train, validation


# What a task sees when a peer of its collective is gone: the RPC fails at once, or the
# collective is aborted or times out.
LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                    tf.errors.DeadlineExceededError)


def error_summary(error: tf.errors.OpError) -> str:
    """The informative line of a collective's error (TF puts "Graph execution error:" first)."""
    lines = [line.strip() for line in (error.message or "").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File "))]
    telling = next((line for line in lines if re.search(r"abort|unhealthy|connect|socket|unavailable|deadline", line, re.I)), None)
    return (telling or (lines[0] if lines else type(error).__name__))[:200]


def lost_peer(error: tf.errors.OpError) -> str:
    """The peer a collective error names (`worker-1`), or "a peer task"."""
    match = re.search(r"/job:(\w+)/replica:\d+/task:(\d+)", error.message or "")
    return f"{match.group(1)}-{match.group(2)}" if match else "a peer task"


def mean_over_tasks(strategy: tf.distribute.Strategy):
    """A function from this task's list of numbers to their mean over every replica of the job
    (one all-reduce), for decisions every task must make alike."""

    @tf.function
    def mean(values):
        per_replica = strategy.run(lambda: tf.identity(values))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    return lambda values: [float(v) for v in mean(tf.constant(values, tf.float32)).numpy()]


def run(config: TrainConfig, cluster: Cluster, strategy_name: str) -> int:
    strategy = strategy_lib.create(strategy_name, cluster)  # before any other TensorFlow op
    # Before any model is built; every task of the job then trains in the same policy.
    precision.apply(config.mixed_precision, agree=mean_over_tasks(strategy) if cluster.is_distributed else None)
    replicas = strategy.num_replicas_in_sync
    global_batch = config.per_replica_batch_size * replicas
    tf.keras.utils.set_random_seed(config.seed)

    train_split, validation_split = load_splits(config)
    steps, validation_steps = epoch_plan(config, train_split, validation_split, global_batch)
    num_pipelines = max(cluster.num_workers, 1)
    log.info(
        "strategy=%s replicas=%d global_batch=%d (%d per replica) steps_per_epoch=%d "
        "train_examples=%d sharding=%s",
        strategy_name, replicas, global_batch, config.per_replica_batch_size, steps,
        train_split.num_examples, data.sharding_mode(train_split.num_files, num_pipelines),
    )
    log.info("classes: %d (%s)", train_split.num_classes, ", ".join(train_split.class_names))

    trace_path = None
    if config.trace_input_dir:
        os.makedirs(config.trace_input_dir, exist_ok=True)
        trace_path = os.path.join(config.trace_input_dir, f"{cluster.task_name}.ids")
    def read_per_pipeline(steps_per_epoch: int) -> int:
        return config.epochs * steps_per_epoch * global_batch // num_pipelines

    train_options = pipeline_options(config, train_split, True, num_pipelines, trace_path, read_per_pipeline(steps))
    train_dataset = strategy.distribute_datasets_from_function(
        lambda context: data.make_dataset(train_split, train_options, context)
    )
    validation_dataset = None
    if validation_split is not None:
        validation_options = pipeline_options(config, validation_split, False, num_pipelines,
                                              examples_read=read_per_pipeline(validation_steps))
        validation_dataset = strategy.distribute_datasets_from_function(
            lambda context: data.make_dataset(validation_split, validation_options, context).repeat()
        )

    with strategy.scope():
        model = model_lib.build(train_split.num_classes, config.image_size, config.weights, config.architecture, config.seed)
        model_lib.compile_model(model, config.learning_rate, config.steps_per_execution, config.jit_compile,
                                 model_lib.warmup_steps(config.weights, steps), input_lanes=replicas)

    # First, so that a resumed run starts at the step it reached.
    backup = preemption.StepBackup(backup_dir(config), config.backup_every_steps, steps, cluster.is_chief,
                                   per_epoch=config.backup_every_steps == 0)
    callback_list = [
        backup,
        preemption.StepAgreement(backup, strategy, cluster.is_chief),
        tf.keras.callbacks.ModelCheckpoint(checkpoint_pattern(config), save_weights_only=True),
        tf.keras.callbacks.TensorBoard(config.tensorboard_dir),
        # Progress from the chief only: every worker would print the same metrics again.
        callbacks.EpochLog(config.epochs, with_metrics=cluster.is_chief, num_classes=train_split.num_classes),
    ]
    if cluster.is_chief:
        callback_list.append(callbacks.HypertuneReport(config.hypertune_metric))
    if config.profile_steps and profiling.profiles_here(config.profile_tasks, cluster.is_chief):
        callback_list.append(profiling.ProfileSteps(
            profiling.log_dir(config.tensorboard_dir, cluster.task_name, cluster.is_chief), *config.profile_steps))

    try:
        with bad_data_stops_the_job(config, train_split.class_names):
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
        print(f"trainer.task: preempted (SIGTERM): saved a backup; a restart resumes at epoch {stop.epoch} "
              f"step {stop.step} (exit {exits.RETRYABLE})", file=sys.stderr)
        return exits.RETRYABLE
    except LOST_PEER_ERRORS as error:
        if not cluster.is_distributed or storage.failure(error):
            raise
        print(f"trainer.task: error: lost {lost_peer(error)} of this {strategy_name} job ({type(error).__name__}: "
              f"{error_summary(error)}); a restart resumes at {backup.describe_resume()} (exit {exits.RETRYABLE})",
              file=sys.stderr)
        return exits.RETRYABLE
    saving.save_model(model, config, cluster, train_split.class_names)
    return exits.OK
