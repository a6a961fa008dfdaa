"""Entry point of every process of a job: `python -m trainer.task [flags]`.

It resolves who this process is from TF_CONFIG / CLUSTER_SPEC, parses the flags, sets the
process environment TensorFlow reads at start-up, and hands over to the code for its role:

| role                                   | runs                       |
|----------------------------------------|----------------------------|
| chief or worker, synchronous strategy  | trainer.train              |
| chief of a ParameterServerStrategy job | trainer.train_ps (coordinator) |
| worker or ps of such a job             | trainer.train_ps.serve     |
| evaluator                              | trainer.evaluator          |

Configuration errors end the process with one line on stderr and exit code 2. A healthy job
writes nothing to stderr in the images (trainer.relay).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Sequence

from trainer import cluster as cluster_lib
from trainer import config as config_lib
from trainer import logs
from trainer import strategy as strategy_lib

log = logging.getLogger("trainer")


class StartupError(RuntimeError):
    """Found before training starts (unwritable output, missing data); str() is one line."""


def prepare_environment(cluster: cluster_lib.Cluster, strategy_name: str, environ) -> None:
    """The variables TensorFlow reads once, at start-up. Must run before TensorFlow is imported."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from trainer import storage

    for key, value in storage.CLIENT_ENVIRONMENT.items():
        environ.setdefault(key, value)
    if cluster.tf_config is None or cluster.task_type == cluster_lib.EVALUATOR:
        # The evaluator is not part of the training cluster and must not try to join it.
        environ.pop("TF_CONFIG", None)
    else:
        environ["TF_CONFIG"] = json.dumps(cluster.tf_config)
    if strategy_name == "parameter_server":
        # Lets the coordinator see a lost worker as an error it can retry elsewhere, instead of
        # RPCs waiting forever (TensorFlow's ParameterServerStrategy guide).
        environ["GRPC_FAIL_FAST"] = "use_caller"


def check_writable(*paths: str) -> None:
    """Fails early, with one line, when an output directory cannot be created or written."""
    import tensorflow as tf

    for path in paths:
        try:
            tf.io.gfile.makedirs(path)
            probe = f"{path.rstrip('/')}/.write-probe-{os.getpid()}"
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("ok")
            tf.io.gfile.remove(probe)
        except (tf.errors.OpError, OSError) as error:
            from trainer import exits, storage

            verdict = storage.failure(error)
            if verdict and verdict[0] == exits.RETRYABLE:
                raise  # Cloud Storage is down, not the path wrong: main reports it as retryable
            message = getattr(error, "message", None) or str(error)
            raise StartupError(f"cannot write to {path}: {message.splitlines()[0]}") from None


def main(argv: Sequence[str] | None = None) -> int:
    logs.configure()
    try:
        # HOSTNAME from the kernel when the environment lacks it: a JobSet pod checks its
        # cluster against its own hostname.
        cluster = cluster_lib.resolve(cluster_lib.environ_with_hostname(os.environ))
        config = config_lib.parse(argv, os.environ, cluster)
    except (cluster_lib.ClusterConfigError, config_lib.ConfigError) as error:
        print(f"trainer.task: error: {error}", file=sys.stderr)
        return 2
    strategy_name = strategy_lib.choose(config.strategy, cluster)
    log.info("cluster: %s", cluster.to_json())
    log.info("role: %s, strategy: %s, model dir: %s", cluster.task_name, strategy_name, config.model_dir)
    prepare_environment(cluster, strategy_name, os.environ)

    from trainer import sources, storage

    try:
        # Every task, before anything writes: makedirs under a missing bucket never returns.
        storage.check_buckets([config.model_dir, config.checkpoint_dir, config.tensorboard_dir, config.data_dir,
                               config.dataset.value, config.eval_dataset.value if config.eval_dataset else None])
        return _run_role(config, cluster, strategy_name)
    except (StartupError, sources.DataError, storage.StorageError) as error:
        print(f"trainer.task: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        verdict = storage.failure(error)
        if verdict is None:
            raise
        code, line = verdict
        print(f"trainer.task: error: {line}", file=sys.stderr)
        return code


def _run_role(config: config_lib.TrainConfig, cluster: cluster_lib.Cluster, strategy_name: str) -> int:
    if cluster.task_type == cluster_lib.EVALUATOR:
        from trainer import evaluator

        return evaluator.run(config, cluster)
    if strategy_name == "parameter_server":
        from trainer import train_ps

        if cluster.task_type in (cluster_lib.WORKER, cluster_lib.PS):
            if cluster.task_type == cluster_lib.WORKER and config.dataset.scheme == "synthetic":
                # Workers read the files the coordinator's dataset function names. On separate
                # machines (Vertex, Kubernetes) only the coordinator's disk has its copy, so each
                # worker makes the same, deterministic files at the same path first.
                from trainer import sources

                sources.load(config.dataset, config.data_dir, "train")
            return train_ps.serve(cluster)
        check_writable(config.model_dir, config.checkpoint_dir)
        return train_ps.run(config, cluster)

    from trainer import train

    if cluster.is_chief:
        check_writable(config.model_dir, config.checkpoint_dir)
    return train.run(config, cluster, strategy_name)


if __name__ == "__main__":
    from trainer import relay

    relay.run(main)
