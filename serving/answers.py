"""What a prediction answer holds: the model's outputs for each instance as JSON values, in
TensorFlow Serving's row format (https://www.tensorflow.org/tfx/serving/api_rest), which Vertex AI's
prebuilt TensorFlow containers answer with, so that one client serves both.

- A signature with several outputs answers each instance with an object of them by name
  (an image classifier's `{"class_name": "cmd", "class_index": 3, "probabilities": [...]}`).
- A signature with one output answers each instance with that output's value alone
  (a regression's `12.5`).
- Strings are text; an output whose name ends in `_bytes`, or whose bytes are not UTF-8, is
  `{"b64": "..."}`. Floats that are not finite are written `NaN`, `Infinity` and `-Infinity`, as
  TensorFlow Serving writes them (Python's json and JavaScript read them).
"""

from __future__ import annotations

import base64
import json
from typing import Mapping

import numpy as np


def prediction(outputs: Mapping[str, np.ndarray]) -> object:
    """One instance's answer from its row of each output."""
    values = {name: _json_value(name, row) for name, row in outputs.items()}
    return next(iter(values.values())) if len(values) == 1 else values


def body(predictions: list) -> bytes:
    """The response body for a request's predictions."""
    return json.dumps({"predictions": predictions}, allow_nan=True).encode()


def _json_value(name: str, row) -> object:
    row = np.asarray(row)  # a row of a 1-D output is a scalar: numpy's, or bytes for a string
    value = row.tolist()
    return _strings(value, binary=name.endswith("_bytes")) if row.dtype.kind in "OS" else value


def _strings(value, binary: bool):
    if isinstance(value, list):
        return [_strings(item, binary) for item in value]
    if isinstance(value, bytes):
        if not binary:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode("ascii")}
    return value
