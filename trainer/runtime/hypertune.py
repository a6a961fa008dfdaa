"""The metric a Vertex AI hyperparameter-tuning trial reports: a few lines of JSON in a file.

Vertex AI (and AI Platform before it) reads the trial's metric from a file the training writes:
`$CLOUD_ML_HP_METRIC_FILE`, else /tmp/hypertune/output.metrics. Each line is one JSON object:
the metric's tag and value (as a string), `global_step`, `trial` ($CLOUD_ML_TRIAL_ID), a
`timestamp` and a `checkpoint_path`; the file keeps the last 100 reports and is rewritten whole
each time. That is the format Google's cloudml-hypertune package writes (its 0.1.0.dev6 is a
source distribution that pip must build at install time); these few lines write the same file
without it.

Only the chief reports: the file is per machine, and every task would write its own.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Mapping

DEFAULT_PATH = "/tmp/hypertune/output.metrics"
KEPT_REPORTS = 100


class Reporter:
    """Writes the tuning service's metric file. Plain Python; no TensorFlow."""

    def __init__(self, environ: Mapping[str, str] = os.environ, clock=time.time):
        self.path = environ.get("CLOUD_ML_HP_METRIC_FILE") or DEFAULT_PATH
        self.trial = str(environ.get("CLOUD_ML_TRIAL_ID", 0))
        self.clock = clock
        self.reports: collections.deque = collections.deque(maxlen=KEPT_REPORTS)

    def report(self, tag: str, value: float, step: int, checkpoint_path: str = "") -> None:
        """Adds one report and rewrites the file. Raises OSError when it cannot be written."""
        self.reports.append({"timestamp": self.clock(), "trial": self.trial, tag: str(float(value)),
                             "global_step": str(int(step)), "checkpoint_path": checkpoint_path})
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        partial = f"{self.path}.partial-{os.getpid()}"
        with open(partial, "w") as handle:
            handle.writelines(json.dumps(entry, sort_keys=True) + "\n" for entry in self.reports)
        os.replace(partial, self.path)  # the service never reads a half-written file
