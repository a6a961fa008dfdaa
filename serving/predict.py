"""Answers instances from files with an exported model, as the prediction server would answer them.

    python -m serving.predict MODEL_DIR FILE [FILE ...]
    python -m serving.predict MODEL_DIR --instances INSTANCES.jsonl
    python -m serving.predict MODEL_DIR ... --vertex-request > request.json

With FILEs, each file's bytes are one instance: for a model whose signature takes one string input,
such as an image classifier's `image_bytes` (encoded images, which the model decodes itself). With
--instances, each line of a JSON Lines file is one instance as a request carries it, for any model:
`{"distance_km": 3.2, "passengers": 1, "hour": 8, "payment_type": "card", "pickup_zone": "airport"}`
for a table's columns. MODEL_DIR, the files and the instances file may be gs:// paths.

It prints one line per instance: where it came from (the file, or the instances file and its line
number), a tab, and the prediction as JSON, exactly what the server answers for it
(serving/answers.py): it reads the instances (serving/instances.py) and calls the model
(serving/predictor.py) through the server's own code. With --vertex-request it prints instead the
JSON body of a Vertex AI prediction request for the instances, for `curl` or
`gcloud ai endpoints predict --json-request`.

A missing model, a missing file, or an instance the model cannot take (a file that is not a whole
image, a value of the wrong type, an image the model's decoder refuses) is one line naming it, and
exit 2.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Sequence

from serving import flags, instances, model as model_lib, predictor as predictor_lib, quiet_tensorflow

# Instances per call of the signature: bounds memory for long file lists.
BATCH = 32
# Whatever the number of instances given, they go to the model BATCH at a time.
_NO_LIMIT = 2 ** 62


class PredictError(RuntimeError):
    """str() is one line."""


def read_bytes(path: str) -> bytes:
    tf = quiet_tensorflow.import_tensorflow()
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    except (tf.errors.OpError, OSError) as error:
        raise PredictError(f"{path}: cannot read it ({type(error).__name__})") from None


def raw_instances(model: model_lib.Model, files: Sequence[str], instances_file: str | None) -> list[tuple[str, object]]:
    """(where it came from, the instance as a request carries it) for each instance given: a
    file's bytes as `{"b64": ...}`, the value alone (a request may send it so to a model of one
    input), or a line of the instances file."""
    if files:
        names = list(model.inputs)
        if len(names) != 1 or model.inputs[names[0]].dtype != "string" or model.inputs[names[0]].shape:
            raise PredictError(f"signature {model.describe()} takes other inputs than one file's bytes: "
                               "give its instances as JSON Lines with --instances FILE")
        return [(path, {"b64": base64.b64encode(read_bytes(path)).decode("ascii")}) for path in files]
    raw = []
    for number, line in enumerate(read_bytes(instances_file).decode("utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            try:
                raw.append((f"{instances_file}:{number}", json.loads(line)))
            except (json.JSONDecodeError, RecursionError) as error:
                raise PredictError(f"{instances_file}:{number}: not a JSON value ({error})") from None
    if not raw:
        raise PredictError(f"{instances_file}: no instances in it (one JSON value a line)")
    return raw


def answer(predictor: predictor_lib.Predictor, read: Sequence[tuple[str, instances.Instance]]) -> list[tuple[str, object]]:
    """(where it came from, its prediction) for each instance, BATCH at a time through `predictor`."""
    chunks: list[list[tuple[str, instances.Instance]]] = []
    for source, instance in read:
        alike = chunks and len(chunks[-1]) < BATCH and all(
            chunks[-1][0][1][name].shape == array.shape for name, array in instance.items())
        if alike:
            chunks[-1].append((source, instance))
        else:
            chunks.append([(source, instance)])
    futures = [predictor.submit([instance for _, instance in chunk]) for chunk in chunks]
    results = []
    for chunk, future in zip(chunks, futures):
        try:
            results += zip([source for source, _ in chunk], future.result())
        except predictor_lib.RefusedInstance as refused:
            raise PredictError(f"{chunk[refused.index][0]}: the model refused it: {refused.reason}") from None
    return results


def build_parser() -> flags.OneLineParser:
    """The command's flags; errors are one line (serving.flags)."""
    parser = flags.OneLineParser(prog="python -m serving.predict", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", help="the exported SavedModel (a training job's model directory; gs:// allowed)")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="one instance each, its bytes the model's one string input (an image classifier's images)")
    parser.add_argument("--instances", metavar="FILE", default=None,
                        help="JSON Lines, one instance a line as a request carries it (any model)")
    parser.add_argument("--signature", default=model_lib.DEFAULT_SIGNATURE, help="the SavedModel's signature to use")
    parser.add_argument("--vertex-request", action="store_true",
                        help="print the JSON body of a Vertex AI prediction request for the instances instead")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m serving.predict`: prints the answers (or the request); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.files) == bool(args.instances):
        parser.error("give either FILEs or --instances FILE")
    try:
        model = model_lib.load(args.model_dir, args.signature)
        raw = raw_instances(model, args.files, args.instances)
        limits = instances.Limits(_NO_LIMIT, instances.DEFAULT_MAX_IMAGE_PIXELS)
        read = [(source, instances.instance(source, value, model.inputs, limits)) for source, value in raw]
        if args.vertex_request:
            # By the input's name, as Vertex's prebuilt containers also take it.
            named = [{next(iter(model.inputs)): value} for _, value in raw] if args.files else [value for _, value in raw]
            print(json.dumps({"instances": named}))
            return 0
        predictor = predictor_lib.Predictor(model, BATCH)
        try:
            for source, prediction in answer(predictor, read):
                print(f"{source}\t{json.dumps(prediction)}")
        finally:
            predictor.close()
    except (PredictError, model_lib.ModelError, instances.BadRequest) as error:
        print(f"serving.predict: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
