"""What the Keras 3 runtime refuses, and what its loop guarantees, in real processes: a legacy
tf_keras Task or a model with its own train_step is one line and exit 2; float16 trains with
loss scaling across two workers, and a step whose gradients overflow on one replica is skipped by
every replica; a synchronous step's wait for input is never longer than the step, the step's time
holds its update, a regularized loss is the same on any number of replicas, and a model is traced
as Keras' own `fit` traces it."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys

import pytest

from helpers import REPO, clean_env, run_module

FIXTURES = REPO / "tests" / "fixtures" / "tasks"


def fixture_env() -> dict:
    return clean_env(PYTHONPATH=f"{REPO}:{FIXTURES}")


# A legacy object needs tf-keras, which follows TensorFlow late (none for 2.22.0rc0): where it is not
# installed there is no legacy object to refuse.
NEEDS_TF_KERAS = pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="no tf-keras installed")


# One process: the same two models under Keras 3's own `fit` and under the loop; prints what each did.
_TRACED_AS_FIT_TRACES = """
import json
import numpy as np
import keras
import tensorflow as tf
from trainer.library import loop

class PythonIf(keras.layers.Layer):
    def call(self, x):
        if keras.ops.sum(x) > 0:  # a Python `if` on a tensor: AutoGraph would make it a tf.cond
            return x * 2.0
        return x

class OpsCond(keras.layers.Layer):
    def call(self, x):
        return keras.ops.cond(keras.ops.sum(x) > 0, lambda: x * 2.0, lambda: x)

def model(layer):
    inputs = keras.Input((3,))
    m = keras.Model(inputs, keras.layers.Dense(1)(layer()(inputs)))
    m.compile(optimizer="sgd", loss="mse")
    return m

x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
said = {}
for name, layer in (("python_if", PythonIf), ("ops_cond", OpsCond)):
    for trainer in ("fit", "loop"):
        try:
            m = model(layer)
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
            if trainer == "fit":
                m.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0)
            else:
                strategy = tf.distribute.get_strategy()
                steps = loop.Steps(strategy, m)
                steps.build(dataset.element_spec)
                loop.fit(steps, iter(dataset), epochs=1, steps_per_epoch=2)
            said[f"{name} {trainer}"] = "trained"
        except Exception as error:
            said[f"{name} {trainer}"] = type(error).__name__
print(json.dumps(said))
"""


def test_the_loop_traces_a_model_as_keras_fit_does_without_autograph():
    """The loop's functions are traced as written (trainer/library/loop.py), as Keras 3's trainer
    traces its steps: a layer that branches in Python on a tensor fails under both alike, and one
    that branches with keras.ops.cond trains under both."""
    result = subprocess.run([sys.executable, "-c", _TRACED_AS_FIT_TRACES], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said == {"python_if fit": "OperatorNotAllowedInGraphError", "python_if loop": "OperatorNotAllowedInGraphError",
                    "ops_cond fit": "trained", "ops_cond loop": "trained"}, said


@pytest.mark.parametrize("reference, says", [
    pytest.param("legacy_task:LegacyTask", r"the legacy task's build_model gives a legacy Keras 2 object "
                 r"\(tf_keras\.src\.\S+\); the runtime trains Keras 3: use `import keras`", marks=NEEDS_TF_KERAS),
    pytest.param("legacy_task:LegacyOptimizer", r"the legacy-optimizer task's optimizer gives a legacy Keras 2 object "
                 r"\(tf_keras\.src\.optimizers\.\S+\)", marks=NEEDS_TF_KERAS),
    ("legacy_task:OwnTrainStep", r"the own-step task's model: Custom overrides train_step, which this loop does not "
                                 r"call: override compute_loss and compute_metrics instead"),
])
def test_what_the_loop_cannot_train_is_refused_with_one_line(tmp_path, reference, says):
    result = run_module("trainer.fit", "--task", reference, "--epochs", "1", "--steps-per-epoch", "2",
                        "--mixed-precision", "off", "--model-dir", str(tmp_path / "model"), env=fixture_env(), timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if " error: " in line]
    assert len(errors) == 1 and re.search(says, errors[0]), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "model" / "saved_model.pb").exists()


def test_float16_trains_on_two_workers_where_only_one_workers_gradients_overflow(tmp_path):
    """mixed_float16 (a GPU's policy, emulated here on the CPU): Keras 3 wraps the optimizer in a
    LossScaleOptimizer, the loop scales the loss and lets it unscale the gradients. The worker's
    first batch overflows float16 and the chief's does not (tests/fixtures/tasks/overflow_task.py):
    both skip that step together, where before they parted at the gradients' all-reduce and the
    job hung (CI, 600 s). Until this turn the test trained cassava.task on synthetic images, whose
    first step overflowed on both workers or on neither in most runs; cassava's float16 path is
    tests/integration/test_precision_runs.py's."""
    out = tmp_path / "out"
    result = run_module("trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--", "python", "-m",
                        "trainer.fit", "--task", "overflow_task:OneWorkerOverflows", "--epochs", "1",
                        "--steps-per-epoch", "4", "--per-replica-batch-size", "4", "--mixed-precision", "float16",
                        "--model-dir", str(out / "model"), env=fixture_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    record = json.loads((out / "model" / "run.json").read_text())
    assert record["precision"] == "mixed_float16" and record["optimizer"] == "LossScaleOptimizer"
    loss = float(re.search(r"^\[chief-0\] .*epoch 1/1 ends: loss=(\S+) ", result.stdout, re.M).group(1))
    assert math.isfinite(loss)  # the scaled float16 gradients were unscaled before the update
    fingerprints = set(re.findall(r"trainer: trained 1 epochs of 4 steps; weights (\w+)", result.stdout))
    assert len(fingerprints) == 1


_OVERFLOW = """
import json
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from trainer import loop

keras.mixed_precision.set_global_policy("mixed_float16")
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")


def dataset_fn(context):
    # One input pipeline: its batches go to replica 0, then replica 1. The first step's second
    # batch overflows float16 once scaled (its gradient is about 3e4 x 2**15); the rest do not.
    targets = tf.data.Dataset.from_tensor_slices([4.25, 3e4, 4.25, 4.25])
    return targets.map(lambda target: (tf.ones([2, 4]), tf.fill([2, 1], target))).repeat()


steps = loop.Steps(strategy, model)
steps.build(dataset_fn(tf.distribute.InputContext()).element_spec)
iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
states = []
for _ in range(2):
    steps.train(iterator, 1)
    states.append({"kernel": model.layers[0].kernel.numpy().ravel().tolist(),
                   "scale": float(model.optimizer.dynamic_scale.numpy()),
                   "iterations": int(model.optimizer.iterations.numpy())})
print(json.dumps(states))
"""


def test_a_step_where_one_replicas_gradients_overflow_is_skipped_by_every_replica():
    """Two replicas in one process, the second's first batch overflowing: the step changes no
    weight, halves the loss scale and is not counted; the next, finite on both, trains. Keras
    3.15 alone takes the first replica's verdict here and sums the second's inf into the kernel."""
    result = subprocess.run([sys.executable, "-c", _OVERFLOW], cwd=REPO, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    skipped, trained = json.loads(result.stdout.strip().splitlines()[-1])
    assert skipped == {"kernel": [1.0] * 4, "scale": 2.0 ** 14, "iterations": 0}, skipped
    assert trained["iterations"] == 1 and trained["scale"] == 2.0 ** 14, trained
    assert all(math.isfinite(w) and w != 1.0 for w in trained["kernel"]), trained


_WAITS = """
import json
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from trainer.library import input_wait
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    wait = input_wait.InputWait(lanes=2)

@tf.function
def step(waited, stepped):
    def replica():
        context = tf.distribute.get_replica_context()
        index = context.replica_id_in_sync_group
        # Replica 0 waited 0.8 s of its 1.0 s step; replica 1 waited 0.1 s of a 0.5 s step.
        wait.record(tf.gather(waited, index), tf.gather(stepped, index))
    strategy.run(replica)

step(tf.constant([0.8, 0.1]), tf.constant([1.0, 0.5]))
waits = wait.results(strategy)
print(json.dumps({"waited": waits.waited, "stepped": waits.stepped, "share": waits.share}))
"""


def test_a_synchronous_steps_wait_is_its_slowest_replicas_and_never_longer_than_the_step():
    """Each replica books the step's longest wait (0.8 s), capped by its own step's time (0.5 s
    for the faster one): 1.3 s of 1.5 s over two lanes, never more than the time it is part of."""
    result = subprocess.run([sys.executable, "-c", _WAITS], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["waited"] == pytest.approx(0.65) and results["stepped"] == pytest.approx(0.75)
    assert results["share"] == pytest.approx(0.65 / 0.75)


_SLOW_UPDATE = """
import json
import time
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from trainer import loop
from trainer.library import input_wait

SLEEP = float(__import__("sys").argv[1])


class SlowSGD(keras.optimizers.SGD):
    # Each variable's update waits SLEEP seconds for its gradient, after the all-reduce, in an op
    # that touches no resource: as an update and a collective are to TensorFlow's automatic
    # control dependencies, nothing orders it before the step counter's move.
    def update_step(self, gradient, variable, learning_rate):
        slow = tf.numpy_function(lambda g: (time.sleep(SLEEP), g)[1], [gradient], gradient.dtype, stateful=False)
        super().update_step(tf.ensure_shape(slow, gradient.shape), variable, learning_rate)


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=SlowSGD(0.1), loss="mse")
dataset = tf.data.Dataset.from_tensors((tf.ones([2, 4]), tf.zeros([2, 2]))).repeat()
with strategy.scope():
    waits = input_wait.InputWait(lanes=2)
steps = loop.Steps(strategy, model, input_wait=waits)
steps.build(dataset.element_spec)
iterator = iter(strategy.distribute_datasets_from_function(lambda context: dataset))
for _ in range(4):  # the first call is not counted (trainer/library/loop.py)
    steps.train(iterator, 1)
print(json.dumps({"stepped": waits.results(strategy).stepped}))
"""


def test_a_steps_time_holds_its_update_after_the_all_reduce():
    """The step's end waits for every variable's update: an optimizer whose updates each sleep
    SLEEP seconds books at least that per step. (The optimizer's step counter is no such mark:
    nothing orders its move after the updates, and a step timed to it booked none of the sleep.)"""
    sleep = 0.2
    result = subprocess.run([sys.executable, "-c", _SLOW_UPDATE, str(sleep)], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["stepped"] >= 3 * sleep, results


_REGULARIZED = """
import json
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from trainer import loop

x = tf.reshape(tf.range(16, dtype=tf.float32), (4, 4)) / 16.0
y = tf.ones((4, 1))
losses = {}
for name, strategy in (("one", tf.distribute.OneDeviceStrategy("/cpu:0")),
                       ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
            1, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.5))])
        model.compile(optimizer="sgd", loss="mse")
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()  # the same global batch of 4 each time
    steps = loop.Steps(strategy, model)
    steps.build(dataset.element_spec)
    steps.test(iter(strategy.experimental_distribute_dataset(dataset)), 1)
    losses[name] = steps.results()["loss"]
print(json.dumps(losses))
"""


def test_a_regularized_loss_is_the_same_on_two_replicas_as_on_one():
    """The loss of one global batch, regularization included, whether one replica or two compute
    it: Keras 3.15 divides the compiled loss and `model.losses` alike by the replicas in sync, and
    the loop lets it (correcting `model.losses` again would drop them on two replicas)."""
    result = subprocess.run([sys.executable, "-c", _REGULARIZED], cwd=REPO, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = json.loads(result.stdout.strip().splitlines()[-1])
    kernel_penalty = 0.5 * 4  # L2(0.5) over four weights of 1
    assert losses["one"] > kernel_penalty and losses["two"] == pytest.approx(losses["one"], rel=1e-5), losses
