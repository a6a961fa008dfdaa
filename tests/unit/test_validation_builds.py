"""How often a synchronous worker builds its task's validation data (trainer/runtime/roles/
synchronous.py): once per input pipeline, in the context the strategy gives, whether or not there
is any; and a task with validation data whose size nobody reports stops with one line. In this
process, on the CPU, with a task whose model stops the role before it trains."""

from __future__ import annotations

import pytest
import tensorflow as tf

from trainer import cluster as cluster_lib
from trainer.runtime import config as config_lib
from trainer.runtime.config import ConfigError
from trainer.runtime.roles import synchronous
from trainer.tasks import Examples, Task


class ModelReached(Exception):
    """Raised by build_model: the role got past its datasets."""


class Counted(Task):
    name = "counted"

    def __init__(self, validation: bool, reports_size: bool):
        self.validation, self.reports_size = validation, reports_size
        self.contexts: list[tuple[int, int, int]] = []  # one per validation_dataset call

    def prepare(self, flags):
        return Examples(64, 16 if self.reports_size else None)

    def train_dataset(self, run, context):
        batch = context.get_per_replica_batch_size(run.global_batch_size)
        return tf.data.Dataset.from_tensors((tf.ones([batch, 4]), tf.ones([batch, 1]))).repeat()

    def validation_dataset(self, run, context):
        self.contexts.append((context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync))
        if not self.validation:
            return None
        batch = context.get_per_replica_batch_size(run.global_batch_size)
        return tf.data.Dataset.from_tensors((tf.ones([batch, 4]), tf.ones([batch, 1])))

    def build_model(self, run):
        raise ModelReached()


def train(task: Task, tmp_path) -> None:
    cluster = cluster_lib.resolve({})  # one process
    config = config_lib.parse(["--model-dir", str(tmp_path / "model"), "--epochs", "1", "--mixed-precision", "off",
                               "--per-replica-batch-size", "4"], {}, cluster, task)
    synchronous.train(task, config, cluster, "mirrored", "counted")


@pytest.mark.parametrize("validation", [True, False], ids=["with validation data", "without"])
def test_the_validation_data_is_built_once_in_the_strategys_context(tmp_path, validation):
    task = Counted(validation=validation, reports_size=True)
    with pytest.raises(ModelReached):
        train(task, tmp_path)
    # One input pipeline of one replica here: one build (a probe beforehand made it two).
    assert task.contexts == [(1, 0, 1)]


def test_validation_data_of_no_reported_size_stops_with_one_line_before_the_model(tmp_path):
    task = Counted(validation=True, reports_size=False)
    with pytest.raises(ConfigError) as error:
        train(task, tmp_path)
    assert str(error.value) == "the task has validation data but does not report its size: pass --validation-steps"
    assert len(task.contexts) == 1
