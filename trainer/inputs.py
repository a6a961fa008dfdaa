"""Small helpers for a task's datasets (trainer.tasks.Task.train_dataset)."""

from __future__ import annotations

import tensorflow as tf


def shard(dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This input pipeline's share: every N-th element, N the job's input pipelines. Shard a
    dataset of file names before reading them where there are enough files (each worker then
    reads only its own), else the records before any expensive parsing."""
    if context.num_input_pipelines <= 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


def per_replica_batch(run_global_batch: int, context: tf.distribute.InputContext) -> int:
    """The batch one replica of this pipeline takes: the global batch split over the replicas."""
    return context.get_per_replica_batch_size(run_global_batch)


def without_autoshard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks a dataset the task has sharded itself, so tf.distribute does not shard it again."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
