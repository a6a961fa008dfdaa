"""Small helpers for a task's datasets (trainer.tasks.Task.train_dataset): each input pipeline's
share of the data.

Shard by file where there are at least as many files as input pipelines: each pipeline then opens
only its own files. With fewer files, every pipeline reads every file and keeps every N-th record
(`shard_records`; tf.data's DATA policy), which costs each worker a read of the whole dataset but still gives each its
own examples. TensorFlow's FILE auto-sharding refuses that case with "Could not apply FILE based
sharding"; these helpers fall back, and say so once per process.
"""

from __future__ import annotations

import logging

import tensorflow as tf

log = logging.getLogger("trainer")
# The names of tf.data's AutoShardPolicy values that mean the same.
FILE, DATA = "FILE", "DATA"
_said: set[tuple[int, int]] = set()


def sharding_mode(num_files: int, num_pipelines: int) -> str:
    """FILE when every input pipeline can get at least one whole file, else DATA (by record)."""
    return FILE if num_pipelines <= 1 or num_files >= num_pipelines else DATA


def shard(dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This input pipeline's share: every N-th element, N the job's input pipelines."""
    if context.num_input_pipelines <= 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


def shard_files(files: tf.data.Dataset, num_files: int, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """`files` (a dataset of `num_files` file names, or of tuples starting with one) for this
    pipeline: every N-th file in FILE mode, all of them otherwise; shard the records with
    `shard_records` after reading them, in the same mode. Says so when it falls back."""
    pipelines = context.num_input_pipelines
    if sharding_mode(num_files, pipelines) == FILE:
        return shard(files, context)
    if (num_files, pipelines) not in _said:
        _said.add((num_files, pipelines))
        log.info("data: %d file(s) for %d input pipelines: each pipeline reads every file and keeps every "
                 "%d-th record (sharding by record; give the data at least %d files to shard by file)",
                 num_files, pipelines, pipelines, pipelines)
    return files


def shard_records(records: tf.data.Dataset, num_files: int, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Every N-th record in DATA mode (the files were not sharded), the records as they are in
    FILE mode. In DATA mode every pipeline must read the files in the same order."""
    if sharding_mode(num_files, context.num_input_pipelines) == FILE:
        return records
    return shard(records, context)


def without_autoshard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks a dataset the task has sharded itself, so tf.distribute does not shard it again."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
