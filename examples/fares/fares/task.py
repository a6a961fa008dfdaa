"""Taxi-fare regression as a `trainer.tasks.Task`: a user's own model on the training images.

    python -m fares.task --train-files 'DIR/train-*.csv' --eval-files 'DIR/eval-*.csv' [runtime flags]

A small network predicts a trip's fare from its distance, passengers, hour, payment type and
pickup zone (CSV files as `python -m fares.generate` writes them; local, gs:// or /gcs/), with
the Huber loss, reporting mean absolute error to hyperparameter tuning. The runtime (trainer.fit)
does the rest: strategy, batch, backups and resume, saving from the chief, the evaluator, tuning.
The export's serving signature takes the raw columns by name and answers `fare`.

It uses only the runtime's public interface (trainer.tasks, trainer.fit, trainer.inputs,
trainer.cli), and Keras 3 (`import keras`). TensorFlow is imported inside the methods, so that
`--help` and a flag error answer at once.
"""

from __future__ import annotations

import argparse

from trainer import cli, fit
from trainer.tasks import Examples, Run, Task


def hidden_units(text: str) -> tuple[int, ...]:
    """--hidden-units: layer widths, e.g. 64,32."""
    try:
        units = tuple(cli.positive_int(part) for part in text.split(","))
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"expected widths such as 64,32: {error}") from None
    return units


class FaresTask(Task):
    name = "fares"
    description = "Train a taxi-fare regressor on CSV files"
    hypertune_metric = "mae"
    learning_rate = 3e-3

    def __init__(self):
        self.train = None  # fares.data.Summary of the training files, from prepare
        self.validation = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--train-files", required=True, metavar="GLOB",
                            help="training CSV files (local, gs:// or /gcs/), one header line each")
        parser.add_argument("--eval-files", default=None, metavar="GLOB", help="validation CSV files, same form")
        parser.add_argument("--hidden-units", type=hidden_units, default=(64, 32), help="widths of the hidden layers")
        parser.add_argument("--dropout", type=cli.fraction, default=0.1, help="dropout after each hidden layer")
        parser.add_argument("--huber-delta", type=cli.positive_float, default=2.0,
                            help="the Huber loss is quadratic for errors below this many currency units, linear above")

    def input_paths(self, flags: argparse.Namespace) -> list[str]:
        return [pattern for pattern in (flags.train_files, flags.eval_files) if pattern]

    def prepare(self, flags: argparse.Namespace) -> Examples:
        from fares import data

        self.train = data.summarize(flags.train_files, "--train-files")
        self.validation = data.summarize(flags.eval_files, "--eval-files") if flags.eval_files else None
        return Examples(self.train.rows, self.validation.rows if self.validation else None)

    def train_dataset(self, run: Run, context):
        from fares import data

        return data.dataset(self.train.files, context.get_per_replica_batch_size(run.global_batch_size), context,
                            training=True, seed=run.shuffle_seed)

    def validation_dataset(self, run: Run, context):
        from fares import data

        if self.validation is None:
            return None
        return data.dataset(self.validation.files, context.get_per_replica_batch_size(run.global_batch_size), context,
                            training=False, seed=run.seed)

    def build_model(self, run: Run):
        from fares import model

        return model.build(self.train, run.flags.hidden_units, run.flags.dropout, run.seed)

    def loss(self, run: Run):
        import keras

        return keras.losses.Huber(delta=run.flags.huber_delta)

    def metrics(self, run: Run) -> list:
        import keras

        return [keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")]

    def export(self, trained, path: str, run: Run) -> None:
        from fares import model

        model.save(trained, path)

    def describe_error(self, error: BaseException, run: Run) -> str | None:
        from fares import data

        bad = data.is_bad_csv(error)
        if bad is None:
            return None
        return f"a row of the CSV files cannot be read ({bad}); check --train-files and --eval-files"

    def final_summary(self, logs: dict, run: Run) -> str | None:
        """The last epoch's error against the error of always predicting the average fare."""
        name = "val_mae" if "val_mae" in logs else "mae" if "mae" in logs else None
        if name is None or self.train is None:
            return None
        baseline = (self.train.variances["fare"] ** 0.5)
        return (f"final {name}={float(logs[name]):.3f}: the model's fares are off by that much on average; the "
                f"training fares' standard deviation is {baseline:.3f}")


if __name__ == "__main__":
    fit.run(FaresTask())
