"""`run.json` beside the model: what produced it, for whoever finds the model later.

The chief writes it into the model directory after the export: the runtime's settings, the
task's own flags, the cluster, the precision the job trained in, each epoch's metrics and, apart
from them, its time and its steps' wait for input, and the versions of what ran. (TensorFlow
Model Garden keeps a `params.yaml` beside its models for the same reason.)"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from typing import TYPE_CHECKING, Any

from trainer import outputs
from trainer.cluster import Cluster
from trainer.runtime.config import TrainConfig
from trainer.tasks import Run

if TYPE_CHECKING:  # pragma: no cover
    from trainer.runtime.callbacks import EpochTiming

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


def epoch(metrics: dict[str, float], timing: EpochTiming) -> dict:
    """One epoch's entry: its metrics as the loop logs them, then its seconds and input wait."""
    waits = timing.waits
    return {
        "metrics": {name: round(value, 6) for name, value in metrics.items()},
        "seconds": round(timing.seconds, 3),
        "input_wait": None if waits is None else {"share": round(waits.share, 6), "waited_seconds": round(waits.waited, 6),
                                                  "step_seconds": round(waits.stepped, 6)},
    }


def record(config: TrainConfig, cluster: Cluster, run: Run, history: list[dict], timings: list[EpochTiming],
           versions: dict[str, str], optimizer: str = "") -> dict:
    """run.json's content: `history`, the loop's metrics per epoch trained in this process;
    `timings`, the same epochs' (trainer.runtime.callbacks.Timings)."""
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
        "epochs": [epoch(metrics, timing) for metrics, timing in zip(history, timings, strict=True)],
        "versions": versions,
    }


def versions() -> dict[str, str]:
    import keras
    import tensorflow as tf

    return {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__}


def write(config: TrainConfig, cluster: Cluster, run: Run, history: list[dict], timings: list[EpochTiming],
          optimizer: str = "") -> str:
    """Writes MODEL_DIR/run.json (local or gs://); returns its path."""
    import tensorflow as tf

    path = outputs.join(config.model_dir, FILE_NAME)
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(json.dumps(record(config, cluster, run, history, timings, versions(), optimizer), indent=2) + "\n")
    return path
