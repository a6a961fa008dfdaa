"""ParameterServerStrategy: the chief coordinates, workers and ps serve.

Workers and parameter servers only start a tf.distribute.Server and wait; the coordinator
(chief) runs the training loop (trainer.loop), whose `ClusterCoordinator` ships each call of the
train function to whichever worker is free. Variables live on the parameter servers, each one
whole on one of them (round-robin): Keras 3 layers do not train on TensorFlow's sharded
variables.

Failures, as TensorFlow handles them:
- a worker lost mid-training: the coordinator reschedules its steps on the others, and a worker
  that comes back rejoins (its dataset is rebuilt from the same dataset function);
- a parameter server lost: variables are gone, so the coordinator must restart; it exits with
  a message saying so, and the rerun resumes from the backup;
- the coordinator lost: rerun it, and it resumes the same way.
"""

from __future__ import annotations

import logging
import sys

import keras
import tensorflow as tf

from trainer import exits, outputs
from trainer.library import backup as backup_lib
from trainer.library import loop
from trainer.runtime import callbacks, plan, provenance, saving, storage
from trainer.runtime import strategy as strategy_lib
from trainer.cluster import Cluster
from trainer.runtime.config import TrainConfig
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
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(config.seed)
    global_batch = config.per_replica_batch_size * strategy.num_replicas_in_sync
    # Validation belongs to the side-car evaluator in this mode.
    examples = task.prepare(config.task_flags)
    steps_per_epoch = plan.steps_per_epoch(config, examples, global_batch)
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
    workers = cluster.num_workers - 1

    def make_run():
        return plan.make_run(config, cluster, "parameter_server", replicas_in_sync=strategy.num_replicas_in_sync,
                             num_input_pipelines=1, steps_per_epoch=steps_per_epoch, validation_steps=None,
                             shuffle_seed=None)

    # The coordinator traces the train step that every worker runs, so its policy is the job's;
    # it decides from its own devices (Vertex gives the chief the workers' machine type). The
    # export computes in float32 whatever this picks (trainer.runtime.saving).
    plan.choose_precision(task, make_run(), config)
    run_info = make_run()
    log.info(
        "strategy=parameter_server workers=%d ps=%d batch per step=%d steps_per_epoch=%d "
        "steps_per_execution=%d%s",
        workers, cluster.num_ps, global_batch, steps_per_epoch, config.steps_per_execution,
        f" train_examples={examples.train}" if examples and examples.train else "",
    )

    # Built on each worker; sharding follows the context (one pipeline: the whole dataset).
    train_fn, train_spec = plan.captured_spec(lambda context: task.train_dataset(run_info, context))
    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(train_fn))
    with strategy.scope():
        model = task.build_model(run_info)
        plan.compile_model(task, run_info, model)
    # Every worker steps on its own: the replicas stepping side by side are all of theirs.
    steps = loop.Steps(strategy, model, steps_per_execution=config.steps_per_execution, jit_compile=config.jit_compile,
                       coordinator=coordinator, input_lanes=workers * strategy.num_replicas_in_sync)
    steps.build(train_spec[0])

    backup = backup_lib.Backup(outputs.backup_dir(config.checkpoint_dir), model, steps_per_epoch, True,
                               config.backup_every_steps)
    start_epoch, start_step = backup_lib.resume_point(backup.restore(), steps_per_epoch)
    events, checkpoints = plan.between_epochs(task, run_info, config, model, chief=True, wait=steps.wait)
    with backup_lib.sigterm_flag() as sigterm:
        guard = backup_lib.CoordinatorGuard(backup, sigterm, steps.wait)
        try:
            with plan.data_errors(task, run_info):
                history = loop.fit(steps, iter(per_worker), epochs=config.epochs, steps_per_epoch=steps_per_epoch,
                                   start_epoch=start_epoch, start_step=start_step,
                                   events=callbacks.Composite([guard, *events]))
                if checkpoints.last is None:  # resumed from a backup taken after the last step
                    checkpoints.epoch_end(config.epochs, {})
        except backup_lib.Preempted as stop:
            print(f"{name}: preempted (SIGTERM): saved a backup; a restart resumes at epoch {stop.epoch} "
                  f"step {stop.step} (exit {exits.RETRYABLE})", file=sys.stderr)
            return exits.RETRYABLE
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
    backup.finish()
    saving.export(task, run_info, checkpoints.last, train_spec[0])
    summary = task.final_summary(history[-1], run_info) if history else None
    if summary:
        log.info("%s", summary)
    provenance.write(config, cluster, run_info, history, type(model.optimizer).__name__)
    return exits.OK
