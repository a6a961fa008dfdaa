"""The exported model serves what clients send: encoded image bytes in, class names out, through
the same decode and resize that validation runs; `serving.predict` uses it from the command line.
(The multi-worker and parameter-server exports are checked in test_mwms.py and
test_parameter_server.py.)"""

from __future__ import annotations

import base64
import json
import subprocess

import numpy as np
import pytest

import tensorflow as tf

from helpers import REPO, STORED_AND_USED, clean_env, run_module
from cassava import data, model as model_lib, records, signature as serving, synthetic


def photos(count: int, seed: int = 7) -> list[bytes]:
    """Real encoded photos of several sizes, and one PNG: what a client would send."""
    rng = np.random.default_rng(seed)
    encoded = []
    for index in range(count):
        image = synthetic.make_image(rng, index % 5, size=(int(rng.integers(80, 400)), int(rng.integers(80, 400))))
        encoded.append((tf.io.encode_png if index == count - 1 else tf.io.encode_jpeg)(image).numpy())
    return encoded


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_root):
    """A one-process (mirrored) training run's exported model, trained in bfloat16: the export
    computes in float32 whatever the job trained in, so its answers agree to 1e-5 across
    TensorFlow versions (a bfloat16 graph's differ by 4e-3 between TF 2.15 and 2.21)."""
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    result = run_module("cassava.task", "--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2",
                        "--image-size", "48", "--architecture", "small", "--weights", "none", "--mixed-precision", "bfloat16",
                        "--per-replica-batch-size", "4", "--data-dir", str(data_root), "--model-dir", str(model_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir


def validation_pipeline_images(encoded: list[bytes], image_size: int, directory) -> np.ndarray:
    """The images the validation pipeline makes of these bytes (written as a dataset, read back)."""
    paths, _ = records.write_shards([(e, 0, f"photo-{i}") for i, e in enumerate(encoded)], str(directory), "validation", 1)
    split = data.Split("validation", len(encoded), synthetic.CLASS_NAMES, tuple(paths))
    options = data.PipelineOptions(image_size=image_size, per_replica_batch_size=len(encoded), training=False, cache=False)
    (images, _), = list(data.make_dataset(split, options))
    return images.numpy()


def trained_keras_model(model_dir) -> "tf.keras.Model":
    """The job's model as Keras computes it: cassava's model built in float32 with the job's final
    weights (its last epoch's checkpoint, as trainer.runtime.saving wrote it)."""
    from trainer.runtime import saving

    model = model_lib.build(len(synthetic.CLASS_NAMES), 48, "none", "small")
    saving.weights_checkpoint(model).read(tf.train.latest_checkpoint(str(model_dir.parent / "checkpoints"))).expect_partial()
    return model


def test_serving_default_on_jpeg_bytes_matches_the_keras_model_on_the_validation_pipeline(trained, tmp_path):
    encoded = photos(6)
    loaded = tf.saved_model.load(str(trained))
    served = loaded.signatures[serving.BYTES_SIGNATURE](image_bytes=tf.constant(encoded))

    expected = trained_keras_model(trained).predict(validation_pipeline_images(encoded, 48, tmp_path), verbose=0)

    probabilities = served["probabilities"].numpy()
    assert probabilities.shape == (6, 5)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5, rtol=0)
    assert served["class_index"].numpy().tolist() == expected.argmax(axis=1).tolist()
    names = [name.decode() for name in served["class_name"].numpy()]
    assert names == [synthetic.CLASS_NAMES[i] for i in expected.argmax(axis=1)]


# Vertex AI's newest prebuilt TensorFlow prediction runtime (tf2-cpu.2-15) runs TensorFlow 2.15;
# scripts/test.sh builds this environment from requirements/serving-runtime.lock.
SERVING_RUNTIME_PYTHON = REPO / ".venv-serving" / "bin" / "python"
_SERVE_IN_RUNTIME = """
import json, sys
import tensorflow as tf
photos = [open(path, "rb").read() for path in sys.argv[2:]]
outputs = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](image_bytes=tf.constant(photos))
print(json.dumps({"tensorflow": tf.__version__, "probabilities": outputs["probabilities"].numpy().tolist(),
                  "class_name": [n.decode() for n in outputs["class_name"].numpy()]}))
"""


def test_vertex_prediction_runtimes_tensorflow_serves_the_export_alike(trained, tmp_path):
    assert SERVING_RUNTIME_PYTHON.exists(), "no .venv-serving: scripts/test.sh builds it"
    encoded = photos(4, seed=5)
    paths = []
    for index, content in enumerate(encoded):
        paths.append(tmp_path / f"{index}.{'png' if index == 3 else 'jpg'}")
        paths[-1].write_bytes(content)
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")}
    result = subprocess.run([str(SERVING_RUNTIME_PYTHON), "-c", _SERVE_IN_RUNTIME, str(trained), *map(str, paths)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    runtime = json.loads(result.stdout.strip().splitlines()[-1])
    assert runtime["tensorflow"] == "2.15.1"
    here = tf.saved_model.load(str(trained)).signatures[serving.BYTES_SIGNATURE](image_bytes=tf.constant(encoded))
    np.testing.assert_allclose(runtime["probabilities"], here["probabilities"].numpy(), atol=1e-5, rtol=0)
    assert runtime["class_name"] == [n.decode() for n in here["class_name"].numpy()]


def test_the_export_stores_each_weight_once(trained):
    """trainer.export leaves ExportArchive.track out: with it, Keras 3.15 stored every weight twice
    (keras-team/keras#23553), and each server restored both copies."""
    scope: dict = {}
    exec(STORED_AND_USED, scope)
    stored, used = scope["stored_and_used"](str(trained))
    assert stored == used == trained_keras_model(trained).count_params(), (stored, used)


def test_the_pixel_signature_takes_uint8_images_and_answers_alike(trained, tmp_path):
    encoded = photos(3, seed=2)
    loaded = tf.saved_model.load(str(trained))
    pixels = validation_pipeline_images(encoded, 48, tmp_path)
    by_pixels = loaded.signatures[serving.PIXELS_SIGNATURE](image=tf.constant(pixels))
    by_bytes = loaded.signatures[serving.BYTES_SIGNATURE](image_bytes=tf.constant(encoded))
    np.testing.assert_allclose(by_pixels["probabilities"].numpy(), by_bytes["probabilities"].numpy(), atol=1e-6)
    assert by_pixels["class_name"].numpy().tolist() == by_bytes["class_name"].numpy().tolist()
    spec = loaded.signatures[serving.PIXELS_SIGNATURE].structured_input_signature[1]["image"]
    assert spec.dtype == tf.uint8 and spec.shape.as_list() == [None, 48, 48, 3]


def test_predict_prints_each_files_prediction_as_the_signature_answers(trained, tmp_path):
    paths = []
    for index, encoded in enumerate(photos(3)):
        path = tmp_path / f"leaf-{index}.{'png' if index == 2 else 'jpg'}"
        path.write_bytes(encoded)
        paths.append(str(path))
    result = run_module("serving.predict", str(trained), *paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # TensorFlow's load-time lines are left out (serving/quiet_tensorflow.py)
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [row[0] for row in rows] == paths
    printed = [json.loads(row[1]) for row in rows]
    loaded = tf.saved_model.load(str(trained))
    served = loaded.signatures[serving.BYTES_SIGNATURE](image_bytes=tf.constant([open(p, "rb").read() for p in paths]))
    assert [p["class_name"] for p in printed] == [name.decode() for name in served["class_name"].numpy()]
    assert [p["class_index"] for p in printed] == served["class_index"].numpy().tolist()
    np.testing.assert_allclose([p["probabilities"] for p in printed], served["probabilities"].numpy(), atol=1e-6, rtol=0)


def test_predict_vertex_request_carries_the_files_bytes(trained, tmp_path):
    encoded = photos(2)
    paths = []
    for index, content in enumerate(encoded):
        (tmp_path / f"{index}.jpg").write_bytes(content)
        paths.append(str(tmp_path / f"{index}.jpg"))
    result = run_module("serving.predict", str(trained), *paths, "--vertex-request")
    assert result.returncode == 0, result.stderr[-3000:]
    body = json.loads(result.stdout)
    assert [base64.b64decode(i["image_bytes"]["b64"]) for i in body["instances"]] == encoded
    assert all(list(instance) == ["image_bytes"] for instance in body["instances"])


def test_predict_names_a_file_it_cannot_classify(trained, tmp_path):
    good, bad = tmp_path / "good.jpg", tmp_path / "bad.jpg"
    good.write_bytes(photos(1)[0])
    bad.write_bytes(photos(1)[0][:300])  # a truncated upload
    result = run_module("serving.predict", str(trained), str(good), str(bad))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"serving.predict: error: {bad}: not a whole PNG image"]  # photos(1) is a PNG
    text = tmp_path / "notes.jpg"
    text.write_bytes(b"not an image at all")  # passes no header check: the model's decoder refuses it
    refused = run_module("serving.predict", str(trained), str(good), str(text))
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1].startswith(f"serving.predict: error: {text}: the model refused it: Unknown image file format")
    missing = run_module("serving.predict", str(tmp_path / "no-model"), str(good))
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        f"serving.predict: error: {tmp_path / 'no-model'}: no saved_model.pb there (the --model-dir of a finished training job)"]
    absent = run_module("serving.predict", str(trained), str(tmp_path / "absent.jpg"))
    assert absent.returncode == 2 and absent.stderr.splitlines() == [
        f"serving.predict: error: {tmp_path / 'absent.jpg'}: cannot read it (NotFoundError)"]
    both = run_module("serving.predict", str(trained), str(good), "--instances", str(good))
    assert both.returncode == 2 and both.stderr.splitlines() == [
        "python -m serving.predict: error: give either FILEs or --instances FILE (--help lists the flags)"]
