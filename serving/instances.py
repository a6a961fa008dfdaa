"""What a prediction request holds, read without TensorFlow against the model's own inputs: one array
per input for each instance, or one line saying what is wrong with the request.

A request body is TensorFlow Serving's row format, which Vertex AI's prebuilt TensorFlow containers
take and its custom-container contract passes on (https://www.tensorflow.org/tfx/serving/api_rest):
`{"instances": [INSTANCE, ...]}`, each INSTANCE an object with one value per input of the signature,
or, for a signature with one input, that input's value alone. So an image classifier whose one
input is `image_bytes` takes `{"instances": [{"image_bytes": {"b64": "..."}}]}`, and a table's
`{"instances": [{"distance_km": 3.2, "passengers": 1, "payment_type": "card", ...}]}`. A value
has the input's shape without its batch dimension: a number or string for a 1-D input, nested
lists for more. Binary strings come as `{"b64": "..."}` (base64), any other string as JSON text.
Other top-level keys, such as Vertex's `parameters`, are ignored, except a `signature_name` that
names another signature than the one served.

Before a binary value that starts as an image does (serving.images.kind) reaches the model, its
header says what it would cost to decode: an image that is not whole, or that declares more
pixels than --max-image-pixels, is refused by its header, and nothing decodes it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Mapping

import numpy as np

from serving import images
from serving.model import NUMPY_TYPES, Tensor

# A 12 MP phone photo is well inside; a 40 MP image decodes to 120 MB of pixels.
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
# A float read into an integer input must be exact: float64 holds every integer up to 2**53.
_EXACT_FLOAT_INTEGERS = 2 ** 53


class BadRequest(ValueError):
    """What is wrong with a request, in one line for the client; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Limits:
    max_instances: int  # instances per request
    max_image_pixels: int  # width x height (x frames) of one image, from its header


Instance = dict[str, np.ndarray]


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def example(inputs: Mapping[str, Tensor]) -> str:
    """One request body of the shape `inputs` take, for error messages: `{"instances": [...]}`."""

    def value(name: str, spec: Tensor) -> str:
        if spec.shape:
            return "[...]"
        if spec.dtype == "string":
            return '{"b64": "..."}' if name.endswith("_bytes") else '"..."'
        return {"b": "false", "f": "0.0"}.get(np.dtype(NUMPY_TYPES[spec.dtype]).kind, "0")

    fields = ", ".join(f'"{name}": {value(name, spec)}' for name, spec in inputs.items())
    return '{"instances": [{' + fields + '}]}'


def parse(body: bytes, inputs: Mapping[str, Tensor], limits: Limits, signature: str | None = None) -> list[Instance]:
    """The instances of a request body, in order, each one array per input; raises BadRequest
    naming the first problem. `signature`: the one served, which a `signature_name` must name."""
    try:
        request = json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest("request body is not JSON: it is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise BadRequest(f"request body is not JSON: {error}") from None
    except RecursionError:
        raise BadRequest("request body is not JSON this server reads: it is nested too deeply") from None
    if not isinstance(request, dict):
        raise BadRequest(f"request body is {_kind(request)}; expected {example(inputs)}")
    if "instances" not in request:
        raise BadRequest(f"request has no \"instances\"; expected {example(inputs)}")
    named = request.get("signature_name")
    if signature is not None and named is not None and named != signature:
        raise BadRequest(f"\"signature_name\" is {json.dumps(named)}; this server serves {json.dumps(signature)} only")
    listed = request["instances"]
    if not isinstance(listed, list):
        raise BadRequest(f"\"instances\" is {_kind(listed)}; expected {example(inputs)}")
    if not listed:
        raise BadRequest("\"instances\" is empty: send at least one instance")
    if len(listed) > limits.max_instances:
        raise BadRequest(f"\"instances\" holds {len(listed)} instances; this server takes at most "
                         f"{limits.max_instances} per request (--max-instances)")
    read = [instance(f"instances[{index}]", value, inputs, limits) for index, value in enumerate(listed)]
    check_same_shapes(read)
    return read


def instance(where: str, value: object, inputs: Mapping[str, Tensor], limits: Limits) -> Instance:
    """One instance (`where` names it in errors): an object of one value per input, or the value
    alone for a signature of one input."""
    names = list(inputs)
    if len(names) == 1 and not (isinstance(value, dict) and set(value) == set(names)):
        return {names[0]: _value(where, value, inputs[names[0]], limits)}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} is {_kind(value)}; expected an object with the model's inputs: {', '.join(names)}")
    missing = [name for name in names if name not in value]
    unknown = sorted(str(key) for key in value if key not in inputs)
    if unknown:
        raise BadRequest(f"{where}.{unknown[0]} is no input of the model; its inputs: {', '.join(names)}")
    if missing:
        raise BadRequest(f"{where} has no \"{missing[0]}\"; the model's inputs: {', '.join(names)}")
    return {name: _value(f"{where}.{name}", value[name], spec, limits) for name, spec in inputs.items()}


def check_same_shapes(instances: list[Instance]) -> None:
    """The instances of one request go to the model together: where an input takes any size, they
    must still agree (TensorFlow Serving's row format asks the same)."""
    for index, read in enumerate(instances[1:], start=1):
        for name, array in read.items():
            if array.shape != instances[0][name].shape:
                raise BadRequest(f"instances[{index}].{name} has shape {list(array.shape)}, instances[0].{name} "
                                 f"{list(instances[0][name].shape)}: one request's instances must agree")


def _value(where: str, value, spec: Tensor, limits: Limits) -> np.ndarray:
    array = _strings(where, value, spec, limits) if spec.dtype == "string" else _numbers(where, value, spec)
    if array.ndim != len(spec.shape) or any(want is not None and got != want for got, want in zip(array.shape, spec.shape)):
        raise BadRequest(f"{where} has shape {list(array.shape)}; the model takes {spec.describe()}")
    return array


def _numbers(where: str, value, spec: Tensor) -> np.ndarray:
    target = np.dtype(NUMPY_TYPES[spec.dtype])
    wanted = f"{where} is not {spec.describe()}"
    try:
        array = np.asarray(value)
    except ValueError:  # lists of different lengths
        raise BadRequest(f"{wanted}: its lists differ in length") from None
    found = array.dtype.kind
    if target.kind == "b":
        ok = found == "b"
    elif target.kind in "iu":
        ok = found in "iu" or (found == "f" and bool(np.all(np.abs(array) < _EXACT_FLOAT_INTEGERS))
                               and bool(np.all(array == np.floor(array))))
        if ok and array.size:
            info = np.iinfo(target)
            low, high = (int(array.min()), int(array.max()))
            if low < info.min or high > info.max:
                raise BadRequest(f"{wanted}: {low if low < info.min else high} is out of its range")
    else:
        ok = found in "iuf"
    if not ok:
        got = "text" if found in "US" else "true/false" if found == "b" else "a fraction" if found == "f" else "not numbers"
        raise BadRequest(f"{wanted} (got {got})")
    return array.astype(target)


def _strings(where: str, value, spec: Tensor, limits: Limits) -> np.ndarray:
    shape: list[int] = []
    flat: list[bytes] = []

    def walk(item, depth: int, at: str) -> None:
        if depth == len(spec.shape):
            flat.append(_string(at, item, limits))
            return
        if not isinstance(item, list):
            raise BadRequest(f"{at} is {_kind(item)}; the model takes {spec.describe()}")
        if len(shape) == depth:
            shape.append(len(item))
        elif shape[depth] != len(item):
            raise BadRequest(f"{where} is not {spec.describe()}: its lists differ in length")
        for index, element in enumerate(item):
            walk(element, depth + 1, f"{at}[{index}]")

    walk(value, 0, where)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(shape + [0] * (len(spec.shape) - len(shape)))


def _string(where: str, value, limits: Limits) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    text = value.get("b64") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(text, str):
        raise BadRequest(f"{where} is {_kind(value)}; expected a string or {{\"b64\": \"...\"}}"
                         f"{' (got keys ' + ', '.join(sorted(map(str, value))) + ')' if isinstance(value, dict) else ''}")
    try:
        # Line breaks are allowed: `base64 FILE` wraps its output at 76 characters.
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}.b64 is not base64") from None
    if images.kind(data):
        size = images.pixels(data)
        if size is None:
            raise BadRequest(f"{where}: not a whole {images.kind(data).upper()} image")
        if size > limits.max_image_pixels:
            raise BadRequest(f"{where}: its header declares {size:,} pixels; this server decodes at most "
                             f"{limits.max_image_pixels:,} per image (--max-image-pixels)")
    return data
