"""A plain multi-worker training script: level 1 of docs/your-own-code.md, your script unchanged.

It knows nothing of the runtime that runs it. TensorFlow's MultiWorkerMirroredStrategy reads the
cluster from TF_CONFIG, and the script saves to AIP_MODEL_DIR, as Vertex AI's documentation asks;
`python -m trainer.run` sets both wherever the platform did not. It fits y = 1 + x . w on
generated rows with Keras 3, the Keras TensorFlow 2.21 ships, in a custom training loop written
as TensorFlow's tutorial "Custom training loop with Keras and MultiWorkerMirroredStrategy" writes
one: Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy once two workers run
(keras-team/keras#20585). The export's serving signature takes `features` (4 floats) and answers
`y`, so the prediction server serves it as it is (docs/serving.md).

    python task.py [--epochs N] [--steps-per-epoch N] [--batch-size N]
"""

import argparse
import json
import os
import tempfile

import keras
import tensorflow as tf

WEIGHTS = (1.0, -2.0, 3.0, 0.5)


def is_chief(tf_config: dict) -> bool:
    """The task that keeps the export and prints progress: the chief, else worker 0, else the only one."""
    task = tf_config.get("task", {})
    if not task:
        return True
    if "chief" in tf_config.get("cluster", {}):
        return task.get("type") == "chief"
    return task.get("type") == "worker" and task.get("index") == 0


def rows(global_batch: int) -> tf.data.Dataset:
    """Generated rows, repeated, in global batches. Every worker makes the same rows and keeps its
    share of each batch (DATA sharding, said explicitly: generated rows come from no files to
    share out, and the default, AUTO, would warn that it falls back to DATA)."""
    x = tf.random.stateless_normal((4096, len(WEIGHTS)), seed=(1, 0))
    y = 1.0 + tf.linalg.matvec(x, tf.constant(WEIGHTS))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=2).repeat()
            .batch(global_batch, drop_remainder=True).with_options(options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32, help="examples per worker and step")
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    chief = is_chief(json.loads(os.environ.get("TF_CONFIG") or "{}"))
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    with strategy.scope():
        features = keras.Input((len(WEIGHTS),), name="features")
        model = keras.Model(features, {"y": keras.ops.squeeze(keras.layers.Dense(1)(features), -1)})
        optimizer = keras.optimizers.Adam(0.05)
        optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(batch):
        def step(inputs, target):
            with tf.GradientTape() as tape:
                error = model(inputs, training=True)["y"] - target
                # The mean over the global batch: each replica's share, summed across them by the all-reduce.
                loss = tf.nn.compute_average_loss(tf.square(error), global_batch_size=global_batch)
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return loss

        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    batches = iter(strategy.experimental_distribute_dataset(rows(global_batch)))
    for epoch in range(1, args.epochs + 1):
        loss = sum(float(train_step(next(batches))) for _ in range(args.steps_per_epoch)) / args.steps_per_epoch
        if chief:
            print(f"epoch {epoch}/{args.epochs}: loss {loss:.4f} ({strategy.num_replicas_in_sync} replicas)", flush=True)

    # Every worker saves (the strategy's variables are read by all of them together); only the
    # chief's copy is kept.
    model_dir = os.environ["AIP_MODEL_DIR"] if chief else tempfile.mkdtemp()
    model.export(model_dir, verbose=False)
    if chief:
        print(f"saved to {model_dir}", flush=True)


if __name__ == "__main__":
    main()
