"""The start and the end every training role shares: a synchronous job's chief and workers
(roles/synchronous.py) and a ParameterServer job's coordinator (roles/parameter_server.py).

    run, examples = start(...)          seeds, the task's data sizes, the precision, the Run
    model = build_model(task, run, strategy)
    ...                                 the role's own: its datasets, its Steps, its guard
    return train(...)                   the epochs, then the end: an exit code

`start` chooses the precision once, before any model is built, and passes it on in the `Run`.
`train` builds the steps' variables, resumes from the backup, trains under the SIGTERM guard the
role gives, and ends the process as the exit-code contract says: a preemption or a lost peer in
one line and exit 143; training done, the backup removed and, on the chief, the export, the
task's summary and run.json, exit 0.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf

from trainer import exits, outputs, precision
from trainer.cluster import Cluster
from trainer.library import backup as backup_lib
from trainer.library import loop
from trainer.runtime import callbacks, peers, plan, provenance, saving, storage
from trainer.runtime.config import ConfigError, TrainConfig
from trainer.runtime.data_errors import data_errors
from trainer.tasks import Examples, Run, Task

log = logging.getLogger("trainer")

# The batch the bfloat16 probe times a task's model at, at most: enough for the arithmetic to
# dominate, small enough that a ResNet50 at 300 px measures in seconds on 2 cores.
PROBE_BATCH = 16


def start(task: Task, config: TrainConfig, cluster: Cluster, strategy: tf.distribute.Strategy, strategy_name: str, *,
          input_pipelines: int, shuffle_seed: int | None, validates: bool,
          agree: Callable[[list[float]], list[float]] | None = None) -> tuple[Run, Examples | None]:
    """The `Run` for this training process, and the examples the task reported. `validates`: the
    role validates (the validation steps are worked out); `agree`: every task's mean of a list
    of numbers, for a synchronous job whose tasks must choose the same precision."""
    keras.utils.set_random_seed(config.seed)
    examples = task.prepare(config.task_flags)
    global_batch = config.per_replica_batch_size * strategy.num_replicas_in_sync
    # Made before the precision is chosen, as the probe sees it: the Keras default, float32.
    run = plan.make_run(config, cluster, strategy_name, replicas_in_sync=strategy.num_replicas_in_sync,
                        num_input_pipelines=input_pipelines,
                        steps_per_epoch=plan.steps_per_epoch(config, examples, global_batch),
                        validation_steps=plan.validation_steps(config, examples, global_batch) if validates else None,
                        shuffle_seed=shuffle_seed, mixed_precision="float32")
    policy = choose_precision(task, dataclasses.replace(run, trains=False), config, agree)
    return dataclasses.replace(run, mixed_precision=policy), examples


def choose_precision(task: Task, probe: Run, config: TrainConfig, agree=None) -> str:
    """Sets the job's Keras policy (trainer.precision) before its model is built, and returns it;
    `auto` on a CPU with bfloat16 instructions times the task's own model in both policies, on a
    batch of its own data (the validation data's first, else the training data's), built with
    `probe`. Every task of a synchronous job calls it at the same point (`agree`)."""
    context = tf.distribute.InputContext()

    def measure():
        with data_errors(task, probe):
            dataset = task.validation_dataset(probe, context) or task.train_dataset(probe, context)
            x, _, _ = keras.utils.unpack_x_y_sample_weight(next(iter(dataset)))
        x = tf.nest.map_structure(lambda t: t[:PROBE_BATCH], x)
        return precision.measure_model(lambda: task.build_model(probe), x)

    return precision.apply(config.mixed_precision, agree=agree, measure=measure)


def legacy_keras(value: Any) -> str | None:
    """The class name of a legacy Keras 2 (tf_keras) object, else None."""
    kind = type(value)
    return f"{kind.__module__}.{kind.__name__}" if kind.__module__.split(".")[0] == "tf_keras" else None


def build_model(task: Task, run: Run, strategy: tf.distribute.Strategy) -> keras.Model:
    """The task's model, built and compiled in the strategy's scope with its optimizer, loss and
    metrics, after making sure they are Keras 3 objects the loop can train: a legacy tf_keras one
    is refused with one line that names the way out."""
    with strategy.scope():
        model = task.build_model(run)
        parts = {"build_model": model, "optimizer": task.optimizer(run), "loss": task.loss(run)}
        metrics = task.metrics(run)
        for method, value in [*parts.items(), *(("metrics", metric) for metric in metrics or [])]:
            kind = legacy_keras(value)
            if kind:
                raise ConfigError(
                    f"the {task.name} task's {method} gives a legacy Keras 2 object ({kind}); the runtime trains Keras 3: "
                    "use `import keras` (TensorFlow 2.21's tf.keras is Keras 3 too) instead of tf_keras or the "
                    "legacy-Keras switch (docs/keras.md#from-tf-keras)")
        if not isinstance(model, keras.Model):
            raise ConfigError(f"the {task.name} task's build_model gives {type(model).__module__}."
                              f"{type(model).__name__}, not a keras.Model")
        model.compile(optimizer=parts["optimizer"], loss=parts["loss"], metrics=metrics)
    try:
        loop.check_trainable(model)
    except loop.UnsupportedModel as error:
        raise ConfigError(f"the {task.name} task's model: {error}") from None
    return model


def captured_spec(dataset_fn):
    """`dataset_fn` wrapped so that the element_spec of the first dataset it builds is kept in
    the returned list: what `loop.Steps.build` needs, known before any batch is read."""
    specs: list = []

    def wrapped(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = dataset_fn(context)
        specs.append(dataset.element_spec)
        return dataset

    return wrapped, specs


Guard = Callable[[backup_lib.Backup, threading.Event], loop.Events]
# What a role says of a lost peer, given the error and where a restart resumes: one line, or
# None when the error is not the loss of a peer to this role.
LostPeer = Callable[[tf.errors.OpError, str], "str | None"]


def train(task: Task, config: TrainConfig, cluster: Cluster, run: Run, steps: loop.Steps, train_batches: Iterator,
          element_spec, *, name: str, guard: Guard, lost_peer: LostPeer,
          validation: tuple[Iterator, int] | None = None, graph: Callable[[], tf.Graph] | None = None) -> int:
    """Trains the role's `steps` on `train_batches` (one input pipeline's batches are
    `element_spec`) and ends it; returns the exit code. `guard`: the role's SIGTERM and backup
    hook, made from the backup and the SIGTERM flag; `name`: the command's, for its error lines."""
    with data_errors(task, run):
        steps.build(element_spec)
    backup = backup_lib.Backup(outputs.backup_dir(config.checkpoint_dir), steps.model, run.steps_per_epoch,
                               run.is_chief, config.backup_every_steps)
    start_epoch, start_step = backup_lib.resume_point(backup.restore(), run.steps_per_epoch)
    between, checkpoints, timings = callbacks.for_job(run, config, steps, graph=graph)
    with backup_lib.sigterm_flag() as sigterm:
        try:
            with data_errors(task, run):
                history = loop.fit(steps, train_batches, epochs=config.epochs, steps_per_epoch=run.steps_per_epoch,
                                   start_epoch=start_epoch, start_step=start_step, validation=validation,
                                   callbacks=[guard(backup, sigterm), *between])
                if checkpoints.last is None:  # resumed from a backup taken after the last step
                    steps.sync_state()
                    checkpoints.epoch_end(config.epochs, {})
        except backup_lib.Preempted as stop:
            print(f"{name}: preempted (SIGTERM): saved a backup; a restart resumes at epoch {stop.epoch} "
                  f"step {stop.step} (exit {exits.RETRYABLE})", file=sys.stderr)
            return exits.RETRYABLE
        except peers.LOST_PEER_ERRORS as error:
            line = None if storage.failure(error) else lost_peer(error, backup.describe_resume())
            if line is None:
                raise
            print(f"{name}: error: {line} (exit {exits.RETRYABLE})", file=sys.stderr)
            return exits.RETRYABLE
    model = steps.model
    same = " (every worker's are the same)" if cluster.is_distributed and steps.coordinator is None else ""
    log.info("trained %d epochs of %d steps; weights %s%s", config.epochs, run.steps_per_epoch,
             saving.fingerprint(model), same)
    backup.finish()
    if run.is_chief:
        saving.export(task, run, checkpoints.last, element_spec)
        summary = task.final_summary(history[-1], run) if history else None
        if summary:
            log.info("%s", summary)
        provenance.write(config, cluster, run, history, timings.epochs, type(model.optimizer).__name__)
    return exits.OK
