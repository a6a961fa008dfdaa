"""The interface between the runtime and a model: subclass `Task`, hand it to `trainer.fit`.

A task says what to train; the runtime decides how. The runtime owns the strategy and its scope,
the training loop (trainer.loop: Keras 3 on every strategy), the global batch (per-replica batch
x replicas in sync), the mixed-precision policy every task of the job agrees on, step backups and
the SIGTERM vote, the exits a platform restarts on, saving from the chief, the side-car
evaluator, the hyperparameter-tuning report, profiling and the input-wait line. A task supplies
the model and the datasets, and optionally its own flags, optimizer, metrics and export, all of
them Keras 3 (`import keras`):

    import keras
    from trainer import fit
    from trainer.tasks import Run, Task

    class MyTask(Task):
        def train_dataset(self, run: Run, context):
            ...  # this input pipeline's share, batched at context.get_per_replica_batch_size(run.global_batch_size)

        def build_model(self, run: Run) -> keras.Model:
            ...

        def loss(self, run: Run):
            return "mse"

    if __name__ == "__main__":
        fit.run(MyTask())

Every method receives the `Run`: the runtime's decisions for this process, plus the task's own
flags. The runtime calls them in this order, in every process that needs them:

| method                     | chief / worker | PSS coordinator | PSS worker | evaluator |
|----------------------------|----------------|-----------------|------------|-----------|
| add_arguments              | yes            | yes             | yes        | yes       |
| input_paths                | yes            | yes             | yes        | yes       |
| fetch                      | yes            | yes             |            |           |
| prepare                    | yes            | yes             | yes        | yes       |
| train_dataset              | yes            | builds the fn   | runs it    |           |
| validation_dataset         | yes            |                 |            | yes       |
| build_model, loss, metrics | yes            | yes             |            | yes       |
| optimizer                  | yes            | yes             |            |           |
| export                     | the chief      | yes             |            |           |

Nothing here imports TensorFlow: a task module can be imported, and its flags listed, cheaply.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import keras
    import tensorflow as tf


class DataError(ValueError):
    """Input the job cannot train on (missing files, wrong labels, unreadable data). Raise it from
    any method: the process prints `error: <message>` on one line and exits 2, which no platform
    retries. str() must be one line."""


@dataclasses.dataclass(frozen=True)
class Examples:
    """How many examples `prepare` found; None where it cannot tell (a stream)."""

    train: int | None
    validation: int | None = None


@dataclasses.dataclass(frozen=True)
class Run:
    """What the runtime decided for this process. Plain values; no TensorFlow object."""

    flags: argparse.Namespace  # the task's own flags (Task.add_arguments), parsed
    strategy: str  # multi_worker_mirrored, mirrored, one_device or parameter_server
    task_name: str  # chief-0, worker-1, evaluator-0 (chief-0 in a single process)
    is_chief: bool  # saves the model, reports to hyperparameter tuning, logs the metrics
    num_input_pipelines: int  # datasets the job builds at once: the workers of MWMS, 1 per PSS worker
    replicas_in_sync: int  # replicas each step spans (1 on a PSS coordinator: each worker steps alone)
    per_replica_batch_size: int
    epochs: int
    steps_per_epoch: int  # known before any dataset or model is built
    validation_steps: int | None  # validation batches per evaluation; None when unknown
    learning_rate: float
    seed: int
    # The seed for shuffling and augmentation: `seed`, except None on ParameterServer workers, each
    # of which reads the whole dataset, so a shared seed would give every worker the same order.
    shuffle_seed: int | None
    model_dir: str  # where the chief's export goes
    checkpoint_dir: str
    tensorboard_dir: str
    mixed_precision: str  # the Keras policy the job computes in: float32, mixed_bfloat16, mixed_float16
    # False when the runtime builds the model or a dataset only to look at it, not to train it:
    # to read a checkpoint into (the export, the evaluator) or to time a batch (--mixed-precision
    # auto). Skip pretrained weights (they are overwritten or not needed) and side effects then.
    trains: bool = True

    @property
    def global_batch_size(self) -> int:
        return self.per_replica_batch_size * self.replicas_in_sync

    @property
    def examples_per_pipeline(self) -> int:
        """Training examples one input pipeline delivers over the whole job."""
        return self.epochs * self.steps_per_epoch * self.global_batch_size // max(self.num_input_pipelines, 1)


class Task:
    """Subclass it; override `train_dataset`, `build_model` and `loss` at least.

    Class attributes set the defaults of runtime flags that depend on the model:
    `hypertune_metric` (--hypertune-metric), `learning_rate` (--learning-rate) and
    `mixed_precision` (--mixed-precision; "auto" times the task's own model where that decides,
    trainer.precision)."""

    name: ClassVar[str] = "task"
    hypertune_metric: ClassVar[str] = "loss"
    learning_rate: ClassVar[float] = 1e-3
    mixed_precision: ClassVar[str] = "auto"
    description: ClassVar[str] = ""  # --help's first line

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The task's own flags (hyperparameters, data locations). A bad value is reported as a
        one-line error by the parser. They arrive parsed as `run.flags`."""

    def default_learning_rate(self, flags: argparse.Namespace) -> float:
        """--learning-rate when the flag is not given; may depend on the task's flags."""
        return self.learning_rate

    def input_paths(self, flags: argparse.Namespace) -> Sequence[str]:
        """Paths the task will read (gs:// or local). Their buckets are checked, with the output
        directories', before anything else runs: a missing bucket is one line and exit 2."""
        return ()

    def fetch(self, flags: argparse.Namespace) -> None:
        """Downloads what building the model to train needs (pretrained weights), in every process
        that trains it, before the cluster forms: TensorFlow may be imported, no op may run. A
        download that fails is `DataError`: one line in each of those processes and exit 2, with no
        half-formed cluster to report on it."""

    def prepare(self, flags: argparse.Namespace) -> Examples | None:
        """Called once per process before any dataset or model: read metadata, generate files the
        datasets need. Returns the dataset sizes, from which the steps per epoch follow when
        --steps-per-epoch is not given; None when unknown (then --steps-per-epoch is required)."""
        return None

    def train_dataset(self, run: Run, context: "tf.distribute.InputContext") -> "tf.data.Dataset":
        """This input pipeline's training batches, as (features, labels) or (features, labels,
        weights), repeating forever. The runtime may read a batch of it (or of the validation
        data) before training to time the model in each precision (`run.trains` False then). Shard with `context` (`trainer.inputs.shard`), batch at
        `context.get_per_replica_batch_size(run.global_batch_size)`."""
        raise NotImplementedError(f"{type(self).__name__} must define train_dataset(run, context)")

    def validation_dataset(self, run: Run, context: "tf.distribute.InputContext") -> "tf.data.Dataset | None":
        """Validation batches (not repeated), or None for none: the same answer for every input
        pipeline. A worker builds it once per input pipeline, and learns from the first whether
        there is any. The runtime repeats it and reads --validation-steps batches per
        evaluation, by default the validation examples `prepare` reported over the global batch."""
        return None

    def build_model(self, run: Run) -> "keras.Model":
        """The Keras 3 model, uncompiled. Built inside the strategy's scope under the job's
        precision policy: keep the last layer in float32 (`dtype="float32"`) for a stable loss.
        The runtime builds it again, in float32 and outside any strategy, to export it and to
        evaluate checkpoints (`run.trains` False): it must build the same weights in the same order."""
        raise NotImplementedError(f"{type(self).__name__} must define build_model(run)")

    def loss(self, run: Run) -> Any:
        """What Keras 3's `Model.compile(loss=...)` takes."""
        raise NotImplementedError(f"{type(self).__name__} must define loss(run)")

    def metrics(self, run: Run) -> list:
        """What Keras 3's `Model.compile(metrics=...)` takes; the hypertune metric must be among
        them (or be the loss)."""
        return []

    def optimizer(self, run: Run) -> Any:
        """A new Keras 3 optimizer; Adam at `run.learning_rate` unless overridden."""
        import keras

        return keras.optimizers.Adam(run.learning_rate)

    def export(self, model: "keras.Model", path: str, run: Run) -> None:
        """Saves the trained model to `path` (local or gs://). Only the chief (or a ParameterServer
        job's coordinator) calls it, with the model built again in float32 outside any strategy,
        holding the final epoch's weights and compiled with `loss` and `metrics`, no optimizer.
        The default writes a SavedModel whose `serving_default` signature calls the model
        (Keras 3's `Model.export`)."""
        model.export(path, format="tf_saved_model", verbose=False)

    def describe_error(self, error: BaseException, run: Run) -> str | None:
        """One line for an error raised while training that is the data's fault (the job then
        exits 2), or None to let the runtime handle it."""
        return None

    def final_summary(self, logs: dict, run: Run) -> str | None:
        """A line the chief logs after training, from the last epoch's metrics; None for none."""
        return None
