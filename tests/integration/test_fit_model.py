"""`trainer.loop.fit_model` with Keras' own callbacks, across two real worker processes
(trainer.launch --replicas 2): EarlyStopping stops both workers at the same epoch, TensorBoard and
ModelCheckpoint write the chief's files alone (the worker's checkpoints go to a scratch directory,
removed), a `compute_loss` override written before Keras 3.3 (no `training` argument) trains, and
a stop that only one worker's callback asks for stops every worker at the same step."""

from __future__ import annotations

import json
import os

from helpers import REPO, clean_env, run_module

SCRIPT = """
import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

from trainer.loop import fit_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps-per-epoch", type=int, default=6)
parser.add_argument("--stop-on-chief-at-step", type=int, default=0)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}-{task['index']}"


class Pre33Loss(keras.Model):
    # compute_loss as Keras documented it before 3.3: no `training` argument. The constant makes
    # the override's part of the logged loss visible.
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return super().compute_loss(x, y, y_pred, sample_weight) + 10.0


class StopOnChief(keras.callbacks.Callback):
    # Asks for a stop on the chief alone: the workers must still stop together.
    def on_train_batch_end(self, batch, logs=None):
        if name == "chief-0" and batch + 1 == args.stop_on_chief_at_step:
            self.model.stop_training = True


def rows(seed):
    x = tf.random.stateless_normal((256, 4), seed=(seed, 0))
    return tf.data.Dataset.from_tensor_slices((x, 1.0 + tf.reduce_sum(x, axis=1, keepdims=True)))


with strategy.scope():
    inputs = keras.Input((4,))
    model = Pre33Loss(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])

callbacks = [keras.callbacks.TensorBoard(os.path.join(args.out, "logs")),
             keras.callbacks.ModelCheckpoint(os.path.join(args.out, "checkpoints", "epoch-{epoch}.keras"))]
if args.stop_on_chief_at_step:
    callbacks.append(StopOnChief())
else:
    # No epoch improves on the first by a million: patience 1 stops after the second epoch.
    callbacks.append(keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=1e6))
history = fit_model(model, rows(1).repeat().batch(16), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                    validation_data=rows(2).batch(16), validation_steps=2, callbacks=callbacks)
with open(os.path.join(args.out, f"{name}.json"), "w") as handle:
    json.dump({"epochs": history.epoch, "loss": history.history["loss"],
               "steps": int(model.optimizer.iterations.numpy()),
               "weights": [float(np.sum(w)) for w in model.get_weights()]}, handle)
"""


def launched(tmp_path, *flags: str):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    result = run_module("trainer.launch", "--replicas", "2", "--work-dir", str(tmp_path / "work"), "--", "python",
                        str(script), "--out", str(out), *flags, env=clean_env(PYTHONPATH=str(REPO)), timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    seen = {task: json.loads((out / f"{task}.json").read_text()) for task in ("chief-0", "worker-0")}
    return result, out, seen


def event_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("events.out.tfevents."))


def test_early_stopping_tensorboard_and_checkpoints_across_two_workers_with_a_pre_3_3_loss(tmp_path):
    result, out, seen = launched(tmp_path)
    chief, worker = seen["chief-0"], seen["worker-0"]
    # EarlyStopping stopped both after the second of five epochs, at the same step and weights.
    assert chief["epochs"] == worker["epochs"] == [0, 1], seen
    assert chief["steps"] == worker["steps"] == 12 and chief["weights"] == worker["weights"], seen
    # The pre-3.3 override's loss is the one trained and logged (its constant, over 2 replicas).
    assert all(loss > 10 for loss in chief["loss"]), chief
    # TensorBoard: the chief's events alone, training and validation.
    assert len(event_files(out / "logs" / "train")) == 1 and len(event_files(out / "logs" / "validation")) == 1
    # ModelCheckpoint: the chief's files at the path given; the worker's went to its scratch, removed.
    assert sorted(os.listdir(out / "checkpoints")) == ["epoch-1.keras", "epoch-2.keras"]
    assert os.listdir(tmp_path / "work" / "worker-0" / "tmp") == []
    # Keras' progress bar, on the chief alone.
    assert [line for line in result.stdout.splitlines() if "Epoch " in line] == ["[chief-0] Epoch 1/5",
                                                                                 "[chief-0] Epoch 2/5"], result.stdout[-3000:]


def test_a_stop_one_workers_callback_asks_for_stops_every_worker_at_that_step(tmp_path):
    _, _, seen = launched(tmp_path, "--stop-on-chief-at-step", "3", "--epochs", "3")
    chief, worker = seen["chief-0"], seen["worker-0"]
    assert chief["epochs"] == worker["epochs"] == [0], seen
    assert chief["steps"] == worker["steps"] == 3 and chief["weights"] == worker["weights"], seen
