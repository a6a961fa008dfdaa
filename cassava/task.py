"""The cassava leaf-disease classifier as a `trainer.tasks.Task`, and its command:

    python -m cassava.task [runtime flags] [cassava flags]

ResNet50 transfer learning on TFDS `cassava` (5 classes), or on TFRecords written by
`python -m cassava.prepare`, or on generated look-alike images (`synthetic:N`). Everything about
how it trains on a cluster (strategy, batch, precision, backups, saving, evaluator, tuning) is
the runtime's (trainer.fit); this module says only what the cassava model and data are, through
the same public interface any user's task has.

TensorFlow is imported inside the methods, so that `--help` and a flag error answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os

from trainer import cli, fit
from trainer.tasks import Examples, Run, Task

log = logging.getLogger("trainer")

# --learning-rate auto: Adam's rate for fine-tuning pretrained weights (the codelab's 1e-4, small
# enough to keep the ImageNet features) and for training from scratch (--weights none), where
# every weight starts random and Adam's usual 1e-3 is the rate the learning tests measured.
TRANSFER_LEARNING_RATE = 1e-4
SCRATCH_LEARNING_RATE = 1e-3

CACHE_MODES = ("auto", "always", "never")
# cassava.model.BATCH_NORM_MOMENTUM (which says why 0.9), repeated here so that parsing the
# command line does not import TensorFlow; tests/unit/test_learning_defaults.py checks they agree.
DEFAULT_BATCH_NORM_MOMENTUM = 0.9


ARCHITECTURES = ("resnet50", "small")


def default_learning_rate(weights: str) -> float:
    """--learning-rate auto: from scratch with --weights none, else fine-tuning."""
    return SCRATCH_LEARNING_RATE if weights == "none" else TRANSFER_LEARNING_RATE


class CassavaTask(Task):
    name = "cassava"
    description = "Train the cassava leaf-disease classifier (ResNet50 transfer learning)"
    hypertune_metric = "accuracy"

    def __init__(self):
        self.train_split = None
        self.validation_split = None
        self.weights = None  # --weights as a local file (fetch), where this process trains the model

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from cassava import spec as sources

        parser.add_argument("--image-size", type=cli.positive_int, default=300, help="square input size in pixels")
        parser.add_argument(
            "--dataset", type=sources.dataset_spec, default=sources.DatasetSpec("tfds", "cassava"),
            help="tfds:NAME (TensorFlow Datasets), tfrecord:GLOB (TFRecords of JPEG + label, as "
            "written by `python -m cassava.prepare`) or synthetic:N (N generated cassava-like images)",
        )
        parser.add_argument(
            "--eval-dataset", type=sources.dataset_spec, default=None,
            help="validation data, same forms as --dataset; by default the validation split of "
            "tfds and synthetic data, none for tfrecord",
        )
        parser.add_argument(
            "--data-dir", default=None,
            help="TFDS data dir (gs:// allowed), also where synthetic data is cached; by default "
            "TFDS's own default and ~/.cache/cassava-trainer",
        )
        parser.add_argument(
            "--cache-images", choices=CACHE_MODES, default="auto",
            help="keep decoded, resized images in memory after the first epoch; auto: when they "
            "fit in a quarter of the available memory",
        )
        parser.add_argument("--shuffle-buffer", type=cli.positive_int, default=1024, help="examples in the shuffle buffer")
        parser.add_argument(
            "--max-bad-examples", type=cli.non_negative_int, default=100,
            help="undecodable images each worker skips (naming each) in one pass over its data before "
            "the job stops with exit 2: enough for a few broken uploads, while a job whose data is "
            "mostly unreadable stops within seconds",
        )
        parser.add_argument(
            "--weights", default="imagenet",
            help="ResNet50 initial weights: imagenet, none, or a path to a weights file",
        )
        parser.add_argument(
            "--batch-norm-momentum", type=cli.fraction, default=DEFAULT_BATCH_NORM_MOMENTUM,
            help="ResNet50's batch-normalisation momentum: the weight of the old moving statistics at each step. "
            f"{DEFAULT_BATCH_NORM_MOMENTUM} by default, from scratch and fine-tuning (cassava/model.py says why); "
            "Keras' own is 0.99 (benchmarks/time_to_accuracy.py runs both)",
        )
        parser.add_argument(
            "--architecture", choices=ARCHITECTURES, default="resnet50",
            help="resnet50 (the product), or small: a few conv layers with the same head, for smoke "
            "runs and tests of the distributed machinery",
        )
        parser.add_argument(
            "--trace-input-dir", default=None,
            help="each worker appends the ids of the examples it trains on to a file here "
            "(slow; for checking input sharding)",
        )

    def default_learning_rate(self, flags: argparse.Namespace) -> float:
        return default_learning_rate(flags.weights)

    def input_paths(self, flags: argparse.Namespace) -> list[str]:
        specs = [flags.dataset, flags.eval_dataset]
        return [flags.data_dir, *(spec.value for spec in specs if spec is not None and spec.scheme == "tfrecord")]

    def fetch(self, flags: argparse.Namespace) -> None:
        """ImageNet's weights downloaded, a gs:// weights file copied, before the cluster forms."""
        from cassava import model, sources

        try:
            self.weights = model.fetch_weights(flags.weights, flags.architecture)
        except model.WeightsUnavailable as error:
            raise sources.DataError(str(error)) from None

    def prepare(self, flags: argparse.Namespace) -> Examples:
        from cassava import sources

        if flags.weights not in ("imagenet", "none") and "://" not in flags.weights and not os.path.exists(flags.weights):
            raise sources.DataError(f"--weights {flags.weights}: no such file (use imagenet, none or a path)")
        self.train_split = sources.load(flags.dataset, flags.data_dir, "train")
        eval_spec = flags.eval_dataset or sources.default_validation(flags.dataset)
        self.validation_split = sources.load(eval_spec, flags.data_dir, "validation") if eval_spec else None
        if self.validation_split is not None and self.validation_split.class_names != self.train_split.class_names:
            raise sources.DataError(
                f"--eval-dataset {eval_spec} has classes {', '.join(self.validation_split.class_names)}, but --dataset "
                f"{flags.dataset} has {', '.join(self.train_split.class_names)}; both must describe the same classes")
        log.info("classes: %d (%s)", self.train_split.num_classes, ", ".join(self.train_split.class_names))
        return Examples(self.train_split.num_examples,
                        self.validation_split.num_examples if self.validation_split else None)

    def _options(self, run: Run, split, training: bool, examples_read: int | None, trace_path: str | None = None):
        from cassava import data

        flags = run.flags
        return data.PipelineOptions(
            image_size=flags.image_size,
            per_replica_batch_size=run.per_replica_batch_size,
            training=training,
            # Not for a dataset the runtime only looks into (run.trains False: one batch to time the
            # model): tf.data warns on stderr when a cache is left half read.
            cache=run.trains and data.should_cache(flags.cache_images, split.num_examples, flags.image_size,
                                                   run.num_input_pipelines, examples_read),
            shuffle_buffer=flags.shuffle_buffer,
            seed=run.shuffle_seed,
            trace_path=trace_path,
            max_bad_examples=flags.max_bad_examples,
        )

    def train_dataset(self, run: Run, context):
        from cassava import data
        from trainer import inputs

        trace_path = None
        if run.flags.trace_input_dir and run.trains:
            if run.strategy == "parameter_server":
                log.warning("--trace-input-dir is ignored under parameter_server: datasets run on remote workers")
            else:
                os.makedirs(run.flags.trace_input_dir, exist_ok=True)
                trace_path = os.path.join(run.flags.trace_input_dir, f"{run.task_name}.ids")
        options = self._options(run, self.train_split, True, run.examples_per_pipeline, trace_path)
        log.info("data: train_examples=%d sharding=%s (%d files over %d input pipelines)",
                 self.train_split.num_examples, inputs.sharding_mode(self.train_split.num_files, context.num_input_pipelines),
                 self.train_split.num_files, context.num_input_pipelines)
        return data.make_dataset(self.train_split, options, context)

    def validation_dataset(self, run: Run, context):
        from cassava import data

        if self.validation_split is None:
            return None
        read = None
        if run.validation_steps:
            read = run.epochs * run.validation_steps * run.global_batch_size // max(run.num_input_pipelines, 1)
        return data.make_dataset(self.validation_split, self._options(run, self.validation_split, False, read), context)

    def build_model(self, run: Run):
        from cassava import model

        # Built to read a checkpoint into or to time it: no pretrained weights to fetch.
        weights = (self.weights or run.flags.weights) if run.trains else "none"
        return model.build(self.train_split.num_classes, run.flags.image_size, weights,
                           run.flags.architecture, run.seed, run.flags.batch_norm_momentum)

    def loss(self, run: Run):
        from cassava import model

        return model.LOSS

    def metrics(self, run: Run) -> list:
        from cassava import model

        return model.metrics()

    def optimizer(self, run: Run):
        from cassava import model

        return model.optimizer(run.learning_rate, model.warmup_steps(run.flags.weights, run.steps_per_epoch))

    def export(self, trained, path: str, run: Run) -> None:
        """A SavedModel with the serving signatures cassava.signature writes (the runtime hands
        over the model in float32, trainer.runtime.saving)."""
        from cassava import signature

        signature.save(trained, path, self.train_split.class_names, run.flags.image_size)

    def describe_error(self, error: BaseException, run: Run) -> str | None:
        """The input pipeline's "too many undecodable images" and "label outside the classes"."""
        from cassava import data, sources

        bad_label = data.label_outside_classes(error)
        if bad_label is not None:
            return sources.label_error(*bad_label, self.train_split.class_names)
        if data.too_many_bad_examples(error):
            return (f"more than {run.flags.max_bad_examples} undecodable images in one pass over this task's data "
                    f"(--max-bad-examples); the images skipped are named above")
        return None

    def final_summary(self, logs: dict, run: Run) -> str | None:
        return accuracy_meaning(logs, self.train_split.num_classes)


def accuracy_meaning(logs: dict, num_classes: int) -> str | None:
    """One line saying what the last epoch's accuracy means: a share of images classified right,
    against what guessing would score. A newcomer cannot tell 0.2 from learning without it."""
    name = "val_accuracy" if "val_accuracy" in logs else "accuracy" if "accuracy" in logs else None
    if name is None:
        return None
    value, chance = float(logs[name]), 1.0 / num_classes
    images = "validation images" if name == "val_accuracy" else "training images (no validation data)"
    if value >= 2 * chance:
        verdict = f"{value / chance:.1f}x chance: the model learned"
    elif value > 1.25 * chance:
        verdict = "above chance but not far: train longer or on more data"
    else:
        verdict = "no better than guessing: the model has not learned (yet)"
    return (f"final {name}={value:.4f}: the share of {images} whose class the model ranks first; "
            f"guessing among {num_classes} classes scores {chance:.2f}, so this is {verdict}")



def main(argv: list[str] | None = None) -> int:
    """`python -m cassava.task`'s work in this process, for callers that set up the process
    themselves (tests under tfds's mock data, say); returns the exit code."""
    return fit.main(CassavaTask(), argv, prog="python -m cassava.task")


if __name__ == "__main__":
    fit.run(CassavaTask())
