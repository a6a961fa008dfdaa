"""ParameterServerStrategy: the chief coordinates, workers and ps serve.

Workers and parameter servers only start a tf.distribute.Server and wait; the coordinator
(chief) runs the training loop (trainer/library/loop.py), whose `ClusterCoordinator` ships each call of the
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

import tensorflow as tf

from trainer import outputs
from trainer.cluster import Cluster
from trainer.library import backup as backup_lib
from trainer.library import input_wait, loop
from trainer.runtime import strategy as strategy_lib
from trainer.runtime import training
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


def train(task: Task, config: TrainConfig, cluster: Cluster, name: str) -> int:
    """The coordinator; returns the exit code. `name`: the command's name, for its error lines."""
    strategy = strategy_lib.create("parameter_server", cluster)  # before any other TensorFlow op
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    # ParameterServerStrategy hands every worker the same dataset function with a one-pipeline
    # InputContext (TensorFlow keeps no input synchronization between workers), so each worker
    # reads the whole dataset. Unseeded shuffling gives each its own order; a shared --seed would
    # make every worker train on the same sequence. Validation belongs to the side-car evaluator.
    # The coordinator traces the train step that every worker runs, so the precision it chooses is
    # the job's; it decides from its own devices (Vertex gives the chief the workers' machine
    # type). The export computes in float32 whatever this picks (trainer.runtime.saving).
    run, examples = training.start(task, config, cluster, strategy, "parameter_server", input_pipelines=1,
                                   shuffle_seed=None, validates=False)
    elsewhere = remote_workers(cluster)
    on_this_disk = [path for path in task.input_paths(config.task_flags)
                    if path and "://" not in path and not path.startswith("/gcs/")]
    if elsewhere and on_this_disk:
        # The workers open these paths themselves; a file missing there is read as missing data,
        # and the job waits on data that never comes.
        log.warning("the workers (%s) read the training data themselves, and %s is on this machine's disk: "
                    "put the data in Cloud Storage (gs:// or /gcs/) or on a volume every worker mounts",
                    ", ".join(elsewhere), on_this_disk[0])
    workers = cluster.num_workers - 1
    log.info(
        "strategy=parameter_server workers=%d ps=%d batch per step=%d steps_per_epoch=%d "
        "steps_per_execution=%d%s",
        workers, cluster.num_ps, run.global_batch_size, run.steps_per_epoch, config.steps_per_execution,
        f" train_examples={examples.train}" if examples and examples.train else "",
    )

    # Built on each worker; sharding follows the context (one pipeline: the whole dataset).
    train_fn, train_spec = training.captured_spec(lambda context: task.train_dataset(run, context))
    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(train_fn))
    model = training.build_model(task, run, strategy)
    with strategy.scope():
        # Every worker steps on its own: the replicas stepping side by side are all of theirs.
        waits = input_wait.InputWait(lanes=workers * strategy.num_replicas_in_sync)
    steps = loop.Steps(strategy, model, steps_per_execution=config.steps_per_execution, jit_compile=config.jit_compile,
                       coordinator=coordinator, input_wait=waits)

    def lost_peer(error: tf.errors.OpError, resume: str) -> str:
        first_line = (error.message or type(error).__name__).strip().splitlines()[0]
        return (f"lost a parameter server ({type(error).__name__}: {first_line[:200]}); the coordinator must be "
                f"restarted: a restart resumes at {resume} from {outputs.backup_dir(config.checkpoint_dir)}")

    return training.train(task, config, cluster, run, steps, iter(per_worker), train_spec[0], name=name,
                          guard=lambda backup, sigterm: backup_lib.CoordinatorGuard(backup, sigterm, steps.wait),
                          lost_peer=lost_peer)
