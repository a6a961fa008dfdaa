"""`run.json` beside the model: what produced it, for whoever finds the model later.

The chief writes it into the model directory after the export: the runtime's settings, the
task's own flags, the cluster, the precision the job trained in, each epoch's metrics and the
versions of what ran. (TensorFlow Model Garden keeps a `params.yaml` beside its models for the
same reason.)"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from typing import Any

from trainer import outputs
from trainer.cluster import Cluster
from trainer.runtime.config import TrainConfig
from trainer.tasks import Run

FILE_NAME = "run.json"


def _plain(value: Any) -> Any:
    """Flags as JSON: tuples as lists, anything unusual as its str()."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)


def record(config: TrainConfig, cluster: Cluster, run: Run, history: list[dict], versions: dict[str, str],
           optimizer: str = "") -> dict:
    settings = {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)
                if field.name != "task_flags"}
    return {
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "runtime": settings,
        "task_flags": {name: _plain(value) for name, value in sorted(vars(config.task_flags).items())},
        "cluster": json.loads(cluster.to_json()),
        "strategy": run.strategy,
        "replicas_in_sync": run.replicas_in_sync,
        "global_batch_size": run.global_batch_size,
        "steps_per_epoch": run.steps_per_epoch,
        "precision": run.mixed_precision,
        "optimizer": optimizer,  # its class: LossScaleOptimizer under mixed_float16
        "epochs": [{name: round(value, 6) for name, value in logs.items()} for logs in history],
        "versions": versions,
    }


def versions() -> dict[str, str]:
    import keras
    import tensorflow as tf

    return {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__}


def write(config: TrainConfig, cluster: Cluster, run: Run, history: list[dict], optimizer: str = "") -> str:
    """Writes MODEL_DIR/run.json (local or gs://); returns its path."""
    import tensorflow as tf

    path = outputs.join(config.model_dir, FILE_NAME)
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(json.dumps(record(config, cluster, run, history, versions(), optimizer), indent=2) + "\n")
    return path
