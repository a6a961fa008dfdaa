"""The exported model as the server sees it: one serving signature of a SavedModel, its inputs and
outputs read from the SavedModel itself, called with plain arrays.

Any SavedModel serves whose signature (`serving_default` unless --signature names another) takes
its inputs by name with a first, batch, dimension, as TensorFlow Serving and Vertex AI's prebuilt
containers require (https://www.tensorflow.org/tfx/serving/signature_defs): an image model's one
string tensor of encoded images (`image_bytes`), a table's one 1-D tensor per column, anything
else of the numeric, boolean or string types JSON can carry. The server knows nothing else about
the model: what an input means, the class names a classifier answers with, the preprocessing,
all of that is the export's own.

This is the only module of serving/ that calls TensorFlow (through serving.quiet_tensorflow);
everything above it works with `Tensor` descriptions and numpy arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from serving import quiet_tensorflow

DEFAULT_SIGNATURE = "serving_default"
# TensorFlow's dtype names that JSON values can be read into, and the numpy type they are read as.
# bfloat16 has no numpy type: it is read as float32 and cast when the model is called.
NUMPY_TYPES = {
    "float16": np.float16, "float32": np.float32, "float64": np.float64, "bfloat16": np.float32,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_, "string": np.object_,
}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One input or output of the signature, for a single instance: the batch dimension left out."""

    dtype: str  # TensorFlow's name: float32, int64, string, ...
    shape: tuple[int | None, ...]  # None where any size goes

    def describe(self) -> str:
        return self.dtype + ("[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]" if self.shape else "")


class ModelError(RuntimeError):
    """A model this server cannot serve, or no model at all; str() is one line."""


class Refused(Exception):
    """The model refused the inputs it was called with (TensorFlow's InvalidArgumentError: an image
    its decoder cannot read, a category its lookup does not know); str() is TensorFlow's first line."""


class Model:
    """A loaded signature: `inputs` and `outputs` by name, and calls with one array per input whose
    first dimension is the batch."""

    def __init__(self, function, name: str, inputs: dict[str, Tensor], outputs: dict[str, Tensor]):
        self._function = function
        self.name = name
        self.inputs = inputs
        self.outputs = outputs

    def describe(self) -> str:
        """`NAME(input dtype[shape], ...) -> output dtype[shape], ...`, for the log and errors."""
        def listed(tensors: Mapping[str, Tensor]) -> str:
            return ", ".join(f"{name} {spec.describe()}" for name, spec in tensors.items())

        return f"{self.name}({listed(self.inputs)}) -> {listed(self.outputs)}"

    def __call__(self, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for a batch (one array per input, batch first), each with the batch first.
        Raises Refused when TensorFlow refuses the inputs."""
        tf = quiet_tensorflow.import_tensorflow()
        tensors = {}
        for name, spec in self.inputs.items():
            tensor = tf.constant(columns[name])
            tensors[name] = tf.cast(tensor, spec.dtype) if tensor.dtype.name != spec.dtype else tensor
        try:
            outputs = self._function(**tensors)
        except tf.errors.InvalidArgumentError as error:
            raise Refused(first_line(error.message)) from None
        except UnicodeDecodeError:  # TensorFlow's message quoted bytes that are not text (a binary category)
            raise Refused("TensorFlow refused it with a message that is not UTF-8 text") from None
        return {name: outputs[name].numpy() for name in self.outputs}


def first_line(message: str) -> str:
    """The line of a TensorFlow error message that says what is wrong. A function's error reads
    "Graph execution error:", "Detected at node N defined at ...", a call stack, then the reason,
    then the node in `[[...]]` and the op in `[Op:...]`: the last line before those is the reason."""
    lines = [line.strip() for line in (message or "").splitlines()]
    reasons = [line for line in lines if line and not line.startswith("[[")]
    if not reasons:
        return "no reason given"
    return reasons[-1].split(" [[", 1)[0].split(" [Op:", 1)[0].strip()[:300]


def load(model_dir: str, signature: str = DEFAULT_SIGNATURE) -> Model:
    """The signature `signature` of the SavedModel at `model_dir` (local or gs://, through
    TensorFlow's own file systems). Raises ModelError (one line) for a directory that holds no
    SavedModel, a missing signature, or one whose inputs a JSON request cannot fill."""
    tf = quiet_tensorflow.import_tensorflow()
    if not tf.io.gfile.exists(f"{model_dir.rstrip('/')}/saved_model.pb"):
        raise ModelError(f"{model_dir}: no saved_model.pb there (the --model-dir of a finished training job)")
    loaded = tf.saved_model.load(model_dir)
    function = loaded.signatures.get(signature)
    if function is None:
        available = ", ".join(sorted(loaded.signatures)) or "none"
        raise ModelError(f"{model_dir}: no signature {signature!r} (it has: {available}); --signature chooses one")
    args, kwargs = function.structured_input_signature
    if args or not kwargs:
        raise ModelError(f"{model_dir}: signature {signature!r} takes no named inputs")
    inputs = {name: _tensor(model_dir, f"input {name!r}", spec) for name, spec in sorted(kwargs.items())}
    outputs = function.structured_outputs
    if not isinstance(outputs, Mapping) or not outputs:
        raise ModelError(f"{model_dir}: signature {signature!r} has no named outputs")
    outputs = {name: _tensor(model_dir, f"output {name!r}", spec) for name, spec in sorted(outputs.items())}
    return Model(function, signature, inputs, outputs)


def _tensor(model_dir: str, what: str, spec) -> Tensor:
    if spec.dtype.name not in NUMPY_TYPES:
        raise ModelError(f"{model_dir}: {what} is {spec.dtype.name}, which no JSON value is read into "
                         f"(it takes: {', '.join(NUMPY_TYPES)})")
    if spec.shape.rank is None or spec.shape.rank == 0:
        raise ModelError(f"{model_dir}: {what} has no batch dimension: instances are sent along a first dimension")
    return Tensor(spec.dtype.name, tuple(spec.shape.as_list()[1:]))


def warm_up_instance(inputs: Mapping[str, Tensor]) -> dict[str, np.ndarray] | None:
    """An instance to make the model's first call with, before any client does, or None when no
    made-up instance is likely to be taken: zeros for numbers, and for a binary string input
    (named `..._bytes`, TensorFlow Serving's convention) a small grey JPEG, what an image model
    decodes. A text input (a category a lookup may not know) gets none: a refused call makes
    TensorFlow log a warning on stderr, which a healthy start must not, so the first client pays
    for the first call instead."""
    if any(spec.dtype == "string" and not name.endswith("_bytes") for name, spec in inputs.items()):
        return None
    tf = quiet_tensorflow.import_tensorflow()
    grey = tf.io.encode_jpeg(np.full((64, 64, 3), 128, np.uint8)).numpy()
    instance = {}
    for name, spec in inputs.items():
        shape = tuple(1 if d is None else d for d in spec.shape)
        if spec.dtype == "string":
            instance[name] = np.full(shape, grey, dtype=object)
        else:
            instance[name] = np.zeros(shape, NUMPY_TYPES[spec.dtype])
    return instance
