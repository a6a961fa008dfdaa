"""The runtime image as users meet it: a user's unchanged script under `python -m trainer.run --`
sees TensorFlow 2.21's own Keras (Keras 3 behind both `import keras` and `tf.keras`; nothing in the
image sets TF_USE_LEGACY_KERAS), a level-1 script that chooses legacy Keras itself still trains, a
user's image FROM the runtime sets only its command, and gcloud's autopackaging, requirements.txt
and all, builds and runs on it as the image's unprivileged user."""

from __future__ import annotations

import os

import pytest

from containers import build_image, sh
from helpers import REPO

# Images and containers of their own names, no rehearsal: beside the rehearsals, on any worker (tests/parallel.py).
pytestmark = pytest.mark.no_rehearsal

# A user's script as keras.io and older tutorials mix them: Keras 3 layers (`import keras`) in a
# `tf.keras.Sequential`, compiled with a `tf.keras` optimizer. Under TF_USE_LEGACY_KERAS=1 both fail
# (the optimizer: "Could not interpret optimizer identifier"; the layer: "The added layer must be an
# instance of class Layer").
MIXED_KERAS = """
import numpy as np
import keras
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu")])
model.add(keras.layers.Dense(1))
model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
x = np.random.default_rng(0).random((256, 4), dtype="float32")
losses = model.fit(x, x.sum(axis=1, keepdims=True), epochs=5, batch_size=32, verbose=0).history["loss"]
print("keras", keras.__version__, "tf.keras is keras 3:", tf.keras.optimizers.Adam is keras.optimizers.Adam)
print("trained:", losses[-1] < losses[0])
"""
# A level-1 script that chooses legacy Keras itself, by importing tf_keras.
TF_KERAS = """
import numpy as np
import tf_keras

model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu", input_shape=(4,)), tf_keras.layers.Dense(1)])
model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss="mse")
x = np.random.default_rng(0).random((256, 4), dtype="float32")
losses = model.fit(x, x.sum(axis=1, keepdims=True), epochs=5, batch_size=32, verbose=0).history["loss"]
print("tf_keras", tf_keras.__version__, "trained:", losses[-1] < losses[0])
"""
# ... and one that chooses it through TF_USE_LEGACY_KERAS=1 in its job's environment.
LEGACY_TF_KERAS = """
import os
import numpy as np
import tensorflow as tf

assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
x = np.random.default_rng(0).random((256, 4), dtype="float32")
losses = model.fit(x, x.sum(axis=1, keepdims=True), epochs=5, batch_size=32, verbose=0).history["loss"]
print("tf.keras is", type(model).__module__.split(".")[0], "trained:", losses[-1] < losses[0])
"""


def script_folder(tmp_path, name: str, text: str):
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    for path in (tmp_path, folder):  # readable by the image's user, uid 1000
        os.chmod(path, 0o755)
    os.chmod(folder / name, 0o644)
    return folder


def run_script(engine, image, folder, name, *options):
    tool, env = engine
    # The image's own entry point, `python -m trainer.run --`, runs the command given.
    return sh(tool, "run", "--rm", "-v", f"{folder}:/scripts:ro", *options, image, "python", f"/scripts/{name}",
              env=env, check=False)


def test_a_script_mixing_keras_3_layers_and_a_tf_keras_optimizer_trains_unchanged_under_trainer_run(
        engine, runtime_cpu_image, tmp_path):
    folder = script_folder(tmp_path, "mixed.py", MIXED_KERAS)
    result = run_script(engine, runtime_cpu_image, folder, "mixed.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "keras 3.15.1 tf.keras is keras 3: True" in result.stdout
    assert "trained: True" in result.stdout
    # and the same script fails as the issue found once legacy Keras is chosen: the test can fail
    legacy = run_script(engine, runtime_cpu_image, folder, "mixed.py", "-e", "TF_USE_LEGACY_KERAS=1")
    assert legacy.returncode != 0 and "trained:" not in legacy.stdout


def test_a_level_1_script_that_chooses_legacy_keras_itself_still_trains(engine, runtime_cpu_image, tmp_path):
    folder = script_folder(tmp_path, "tf_keras_script.py", TF_KERAS)
    result = run_script(engine, runtime_cpu_image, folder, "tf_keras_script.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tf_keras 2.21.0 trained: True" in result.stdout
    folder = script_folder(tmp_path, "legacy.py", LEGACY_TF_KERAS)
    result = run_script(engine, runtime_cpu_image, folder, "legacy.py", "-e", "TF_USE_LEGACY_KERAS=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tf.keras is tf_keras trained: True" in result.stdout


def build(engine, context, tag: str, runtime: str):
    return build_image(engine, "--build-arg", f"BASE_IMAGE={runtime}", "-t", tag, str(context), check=False)


def test_a_users_image_from_the_runtime_sets_only_its_command(engine, runtime_cpu_image, tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    (context / "task.py").write_text(MIXED_KERAS + "import os, json; print('task', json.loads(os.environ['TF_CONFIG'])['task'])\n")
    (context / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY task.py /usr/app/task.py\n"
                                        'CMD ["python", "/usr/app/task.py"]\n')
    built = build(engine, context, "localhost/own-command:test", runtime_cpu_image)
    assert built.returncode == 0, built.stderr[-3000:]
    tool, env = engine
    # The chief of a 2-replica job (a single replica gets no TF_CONFIG: one process needs none).
    spec = '{"cluster": {"workerpool0": ["c:2222"], "workerpool1": ["w:2222"]}, "task": {"type": "workerpool0", "index": 0}}'
    result = sh(tool, "run", "--rm", "-e", f"CLUSTER_SPEC={spec}", "localhost/own-command:test", env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # trainer.run, the entry point, turned Vertex AI's CLUSTER_SPEC into the script's TF_CONFIG
    assert "task {'type': 'chief', 'index': 0}" in result.stdout and "trained: True" in result.stdout


# A small pure-Python package from PyPI that the runtime does not carry, pinned with its hashes.
REQUIREMENTS = ("colorama==0.4.6 --hash=sha256:08695f5cb7ed6e0531a20572697297273c47b8cae5a63ffc6d6ed5c201be6e44 "
                "--hash=sha256:4f1d9991f5acc0ca119f9d443620b77f9d6b33703e51011c16baf57afb285fc6\n")


def test_gcloud_autopackaging_with_a_requirements_file_builds_and_runs_as_the_images_user(
        engine, runtime_cpu_image, tmp_path):
    """The Dockerfile `gcloud ai custom-jobs local-run --executor-image-uri=RUNTIME --local-package-path=.
    --script=task.py` generates for a folder with a requirements.txt (tests/fixtures/autopackaging/
    Dockerfile has its lines, from the Cloud SDK's command_lib/ai/docker/build.py; gcloud adds the
    requirements lines after its ENV lines). Its `mkdir` and `pip install` run as the image's user."""
    context = tmp_path / "package"
    context.mkdir()
    (context / "requirements.txt").write_text(REQUIREMENTS)
    (context / "task.py").write_text("import colorama, keras\nprint('colorama', colorama.__version__, "
                                     "'keras', keras.__version__)\n")
    fixture = (REPO / "tests" / "fixtures" / "autopackaging" / "Dockerfile").read_text()
    gcloud_requirements = ('# Found requirements.txt file, thus to the docker container.\n'
                           'COPY ["./requirements.txt", "./requirements.txt"]\n'
                           'RUN pip install --no-cache-dir -r ./requirements.txt\n')
    head, copy_source = fixture.split('COPY [".", "."]')
    (context / "Dockerfile").write_text(head + gcloud_requirements + 'COPY [".", "."]' + copy_source)
    built = build(engine, context, "localhost/autopackaged-requirements:test", runtime_cpu_image)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    tool, env = engine
    result = sh(tool, "run", "--rm", "localhost/autopackaged-requirements:test", env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "colorama 0.4.6 keras 3.15.1" in result.stdout
    assert sh(tool, "run", "--rm", "--entrypoint", "id", "localhost/autopackaged-requirements:test", "-u",
              env=env).stdout.strip() == "1000"
