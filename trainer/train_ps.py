"""ParameterServerStrategy: the chief coordinates, workers and ps serve.

Workers and parameter servers only start a tf.distribute.Server and wait; the coordinator
(chief) runs `model.fit`, which ships each step to whichever worker is free. Variables live on
the parameter servers, large ones split across them by size.

Failures, as TensorFlow handles them:
- a worker lost mid-training: the coordinator reschedules its steps on the others, and a worker
  that comes back rejoins (its dataset is rebuilt from the same dataset function);
- a parameter server lost: variables are gone, so the coordinator must restart; it exits with
  a message saying so, and the rerun resumes from BackupAndRestore's backup;
- the coordinator lost: rerun it, and it resumes the same way.
"""

from __future__ import annotations

import collections
import logging
import re
import sys

import tensorflow as tf

from trainer import exits, outputs, plan, precision, preemption, saving, storage, strategy as strategy_lib
from trainer.cluster import Cluster
from trainer.config import TrainConfig
from trainer.tasks import Task

log = logging.getLogger("trainer")


def serve(cluster: Cluster) -> int:
    """Runs this worker's or parameter server's TensorFlow server until the job ends it."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    log.info("serving as %s at %s", cluster.task_name, server.target)
    server.join()
    return 0


def remote_workers(cluster: Cluster) -> list[str]:
    """The workers' addresses that are not this machine's."""
    hosts = (cluster.tf_config or {}).get("cluster", {}).get("worker", [])
    return [h for h in hosts if h.rsplit(":", 1)[0] not in ("localhost", "127.0.0.1", "[::1]", "::1")]


def run(task: Task, config: TrainConfig, cluster: Cluster, name: str) -> int:
    """The coordinator. `name`: the command's name, for its error lines."""
    strategy = strategy_lib.create("parameter_server", cluster)  # before any other TensorFlow op
    # The coordinator traces the train step that every worker runs, so its policy is the job's;
    # it decides from its own devices (Vertex gives the chief the workers' machine type). The
    # export below computes in float32 whatever this picks (trainer.saving).
    precision.apply(config.mixed_precision)
    tf.keras.utils.set_random_seed(config.seed)
    global_batch = config.per_replica_batch_size * strategy.num_replicas_in_sync
    # Validation belongs to the side-car evaluator in this mode.
    examples = task.prepare(config.task_flags)
    steps = plan.steps_per_epoch(config, examples, global_batch)
    elsewhere = remote_workers(cluster)
    on_this_disk = [path for path in task.input_paths(config.task_flags)
                    if path and "://" not in path and not path.startswith("/gcs/")]
    if elsewhere and on_this_disk:
        # The workers open these paths themselves; a file missing there is read as missing data,
        # and the job waits on data that never comes.
        log.warning("the workers (%s) read the training data themselves, and %s is on this machine's disk: "
                    "put the data in Cloud Storage (gs:// or /gcs/) or on a volume every worker mounts",
                    ", ".join(elsewhere), on_this_disk[0])
    # ParameterServerStrategy hands every worker the same dataset function with a one-pipeline
    # InputContext (TensorFlow keeps no input synchronization between workers), so each worker
    # reads the whole dataset. Unseeded shuffling gives each its own order; a shared --seed would
    # make every worker train on the same sequence.
    run_info = plan.make_run(config, cluster, "parameter_server", replicas_in_sync=strategy.num_replicas_in_sync,
                             num_input_pipelines=1, steps_per_epoch=steps, validation_steps=None,
                             shuffle_seed=None)
    log.info(
        "strategy=parameter_server workers=%d ps=%d batch per step=%d steps_per_epoch=%d "
        "steps_per_execution=%d%s",
        cluster.num_workers - 1, cluster.num_ps, global_batch, steps, config.steps_per_execution,
        f" train_examples={examples.train}" if examples and examples.train else "",
    )

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Built on each worker; sharding follows the context (one pipeline: the whole dataset).
        return task.train_dataset(run_info, context)

    with strategy.scope():
        model = task.build_model(run_info)
        # Every worker steps on its own: the replicas stepping side by side are all of theirs.
        plan.compile_model(task, run_info, model, config,
                           input_lanes=(cluster.num_workers - 1) * strategy.num_replicas_in_sync)
    log.info("variables sharded over ps: %s", describe_sharding(model))

    # Epoch backups: tf-keras runs no batch hooks on a ParameterServer coordinator.
    backup = preemption.StepBackup(outputs.backup_dir(config.checkpoint_dir), None, steps, is_chief=True, per_epoch=True)
    callback_list = [backup, *plan.common_callbacks(task, run_info, config, log_metrics=True, report=True)]
    try:
        with plan.data_errors(task, run_info):
            model.fit(
                tf.keras.utils.experimental.DatasetCreator(dataset_fn),
                epochs=config.epochs,
                steps_per_epoch=steps,
                callbacks=callback_list,
                verbose=0,  # EpochLog reports each epoch
            )
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as error:
        if storage.failure(error):
            raise  # trainer.fit reports it
        first_line = (error.message or type(error).__name__).strip().splitlines()[0]
        print(
            f"{name}: error: lost a parameter server ({type(error).__name__}: {first_line[:200]}); "
            f"the coordinator must be restarted: a restart resumes at {backup.describe_resume()} "
            f"from {outputs.backup_dir(config.checkpoint_dir)} (exit {exits.RETRYABLE})",
            file=sys.stderr,
        )
        return exits.RETRYABLE
    saving.save_unsharded(task, run_info, outputs.checkpoint_pattern(config.checkpoint_dir).format(epoch=config.epochs))
    return exits.OK


def describe_sharding(model: tf.keras.Model) -> str:
    """`head/kernel x2, ...` for every variable split over several parameter servers (Keras lists
    a sharded variable's shards as `NAME/part_K`)."""
    shards = collections.Counter(
        match.group(1) for v in model.trainable_variables if (match := re.match(r"(.*)/part_\d+:0$", v.name))
    )
    return ", ".join(f"{name} x{count}" for name, count in sorted(shards.items())) or "none"
