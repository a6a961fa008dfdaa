"""The one place that maps a strategy name to a tf.distribute strategy."""

from __future__ import annotations

import logging
import os

from trainer.cluster import Cluster

log = logging.getLogger("trainer")

def choose(requested: str, cluster: Cluster) -> str:
    """`auto`: parameter_server with ps tasks, multi_worker_mirrored for any other cluster,
    mirrored (all local GPUs, or the CPU) for a single process. Reduction Server reducers are not
    ps tasks (trainer.cluster counts them apart): a job with them is multi_worker_mirrored."""
    if requested != "auto":
        return requested
    if cluster.num_ps:
        return "parameter_server"
    if cluster.is_distributed:
        return "multi_worker_mirrored"
    return "mirrored"


def collective_implementation(cluster: Cluster, num_gpus: int, net_plugin: str | None) -> tuple[str, str, int]:
    """(CommunicationImplementation name, why, logging level) for MultiWorkerMirrored.

    Reduction Server replaces NCCL's all-reduce between hosts through Google's NCCL network plugin,
    so the all-reduce must run on NCCL. TensorFlow's AUTO runs it on NCCL only when asked for
    (CollectiveParamResolverLocal::AssignCollectiveType: the "nccl" hint or collective_nccl),
    otherwise as a ring over gRPC, which never reaches the reducers."""
    if not cluster.num_reducers:
        return "AUTO", "", logging.DEBUG
    reducers = f"{cluster.num_reducers} Reduction Server reducer(s) in worker pool 2"
    if not num_gpus:
        return "AUTO", (f"{reducers}, and no GPU here: the all-reduce runs over gRPC and the reducers are not "
                        "used (Reduction Server serves NCCL between GPU hosts)"), logging.INFO
    if net_plugin is None:
        return "NCCL", (f"{reducers}, but NCCL finds no network plugin (libnccl-net.so) in this image, so it "
                        "all-reduces without them: add Google's google-reduction-server package to the image "
                        "(docs/gpus.md#reduction-server)"), logging.WARNING
    return "NCCL", f"{reducers}: all-reduce over NCCL, through its network plugin {net_plugin}", logging.INFO


def create(name: str, cluster: Cluster):
    """Creates the strategy. Call it before any other TensorFlow op: the multi-worker strategies
    configure the runtime, which is fixed once an op has run. TF_CONFIG must already be set."""
    import tensorflow as tf

    if name == "multi_worker_mirrored":
        options = None
        if cluster.num_reducers:
            from trainer.checks import gpu_stack

            gpus = len(tf.config.list_physical_devices("GPU"))  # lists devices; runs no op
            plugin = gpu_stack.nccl_net_plugin(os.environ, gpu_stack.installed_nccl()) if gpus else None
            implementation, why, level = collective_implementation(cluster, gpus, plugin)
            log.log(level, "%s", why)
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation))
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "one_device":
        device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if name == "parameter_server":
        # No variable_partitioner: Keras 3's layers do not train on sharded variables, so each
        # variable lives whole on one parameter server (round-robin over them).
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    raise ValueError(f"unknown strategy {name!r}")
