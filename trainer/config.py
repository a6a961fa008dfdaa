"""Command-line flags and environment defaults, resolved once into a frozen `TrainConfig`.

`parse(argv, environ, cluster)` is pure: it reads the AIP_* output directories that Vertex AI
sets, applies the per-trial subdirectory for hyperparameter tuning, and returns plain values.
Nothing below it reads flags or the environment again.
"""

from __future__ import annotations

import argparse
import os
import re
import dataclasses
from typing import Mapping, Sequence

from trainer import outputs, precision
from trainer.cluster import Cluster

# --learning-rate auto: Adam's rate for fine-tuning pretrained weights (the codelab's 1e-4, small
# enough to keep the ImageNet features) and for training from scratch (--weights none), where
# every weight starts random and Adam's usual 1e-3 is the rate the learning tests measured.
TRANSFER_LEARNING_RATE = 1e-4
SCRATCH_LEARNING_RATE = 1e-3

STRATEGIES = ("auto", "multi_worker_mirrored", "mirrored", "one_device", "parameter_server")
CACHE_MODES = ("auto", "always", "never")
DATASET_SCHEMES = ("tfds", "tfrecord", "synthetic")
ARCHITECTURES = ("resnet50", "small")
PROFILE_TASKS = ("chief", "all")


class ConfigError(ValueError):
    """A combination of flags and cluster that cannot work. str() is one line."""


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where examples come from: `tfds:cassava`, `tfrecord:GLOB` or `synthetic:N`."""

    scheme: str
    value: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.value}"

    @property
    def synthetic_size(self) -> int:
        return int(self.value)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # Training.
    epochs: int
    steps_per_epoch: int | None
    per_replica_batch_size: int
    learning_rate: float
    image_size: int
    seed: int
    # Strategy as asked for; `trainer.strategy.choose` turns `auto` into a concrete one.
    strategy: str
    # Data.
    dataset: DatasetSpec
    eval_dataset: DatasetSpec | None
    data_dir: str | None
    cache_images: str
    shuffle_buffer: int
    validation_steps: int | None
    max_bad_examples: int
    # Model.
    weights: str
    architecture: str
    # Preemption: back up every N steps; 0: every epoch; None: auto (trainer.preemption).
    backup_every_steps: int | None
    # Outputs, already specific to this trial.
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str
    # Speed.
    mixed_precision: str  # as asked for; trainer.precision decides on each machine
    jit_compile: bool
    steps_per_execution: int
    # Tuning.
    hypertune_metric: str
    # Evaluator side-car.
    eval_timeout: float
    # Diagnostics: each worker appends the example ids it fed to training here.
    trace_input_dir: str | None
    # A profiler trace of these training steps (first, last; from 1), on the chief or every task.
    profile_steps: tuple[int, int] | None = None
    profile_tasks: str = "chief"


def _positive_int(text: str) -> int:
    try:
        number = float(text)  # tuning services may pass a discrete value as "64.0"
        value = int(number)
        if value != number:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    return 0 if text.strip() in ("0", "0.0") else _positive_int(text)


def _backup_every(text: str) -> int | None:
    return None if text == "auto" else _non_negative_int(text)


def _learning_rate(text: str) -> float | None:
    return None if text == "auto" else _positive_float(text)


def default_learning_rate(weights: str) -> float:
    """--learning-rate auto: from scratch with --weights none, else fine-tuning."""
    return SCRATCH_LEARNING_RATE if weights == "none" else TRANSFER_LEARNING_RATE


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def parse_profile_steps(text: str) -> tuple[int, int]:
    """--profile-steps: 'FIRST-LAST' or 'STEP' -> (first, last), counted from 1, inclusive."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    first, last = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
    if not match or first < 1 or last < first:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST, steps counted from 1 with FIRST <= LAST (e.g. 10-15), "
                                         f"got {text!r}")
    return first, last


def _dataset_spec(text: str) -> DatasetSpec:
    scheme, sep, value = text.partition(":")
    if not sep or scheme not in DATASET_SCHEMES or not value:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of tfds:NAME, tfrecord:GLOB, synthetic:N"
        )
    if scheme == "synthetic":
        _positive_int(value)
    return DatasetSpec(scheme, value)


class _OneLineErrors(argparse.ArgumentParser):
    """A wrong flag is one line on stderr and exit 2. argparse's usage block is forty lines, which a
    job's log (where every stderr line reads as an error, and a restarted replica prints it again)
    would bury the reason under."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="python -m trainer.task",
        description="Train the cassava classifier (ResNet50 transfer learning) on the cluster "
        "described by TF_CONFIG or CLUSTER_SPEC, or in one process when neither is set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=_positive_int, default=2, help="training epochs")
    train.add_argument(
        "--steps-per-epoch", type=_positive_int, default=None,
        help="steps per epoch; by default the training examples divided by the global batch",
    )
    train.add_argument(
        "--per-replica-batch-size", type=_positive_int, default=64,
        help="examples per replica per step; the global batch is this times the replicas in sync",
    )
    train.add_argument(
        "--learning-rate", type=_learning_rate, default="auto",
        help=f"Adam learning rate; auto: {TRANSFER_LEARNING_RATE:g} to fine-tune pretrained weights, "
        f"{SCRATCH_LEARNING_RATE:g} from scratch (--weights none), where it also ramps up linearly over the "
        f"first epoch (trainer.model)",
    )
    train.add_argument("--image-size", type=_positive_int, default=300, help="square input size in pixels")
    train.add_argument("--seed", type=int, default=42, help="seed for weights, shuffling and augmentation")

    strategy = parser.add_argument_group("strategy")
    strategy.add_argument(
        "--strategy", choices=STRATEGIES, default="auto",
        help="auto: parameter_server when the cluster has ps tasks, multi_worker_mirrored for "
        "any other cluster, mirrored for a single process",
    )

    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset", type=_dataset_spec, default=DatasetSpec("tfds", "cassava"),
        help="tfds:NAME (TensorFlow Datasets), tfrecord:GLOB (TFRecords of JPEG + label, as "
        "written by `python -m trainer.prepare`) or synthetic:N (N generated cassava-like images)",
    )
    data.add_argument(
        "--eval-dataset", type=_dataset_spec, default=None,
        help="validation data, same forms as --dataset; by default the validation split of "
        "tfds and synthetic data, none for tfrecord",
    )
    data.add_argument(
        "--data-dir", default=None,
        help="TFDS data dir (gs:// allowed), also where synthetic data is cached; by default "
        "TFDS's own default and ~/.cache/cassava-trainer",
    )
    data.add_argument(
        "--cache-images", choices=CACHE_MODES, default="auto",
        help="keep decoded, resized images in memory after the first epoch; auto: when they "
        "fit in a quarter of the available memory",
    )
    data.add_argument("--shuffle-buffer", type=_positive_int, default=1024, help="examples in the shuffle buffer")
    data.add_argument(
        "--max-bad-examples", type=_non_negative_int, default=100,
        help="undecodable images each worker skips (naming each) in one pass over its data before "
        "the job stops with exit 2: enough for a few broken uploads, while a job whose data is "
        "mostly unreadable stops within seconds",
    )
    data.add_argument(
        "--validation-steps", type=_positive_int, default=None,
        help="validation batches per evaluation; by default the whole validation set",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--weights", default="imagenet",
        help="ResNet50 initial weights: imagenet, none, or a path to a weights file",
    )
    model.add_argument(
        "--architecture", choices=ARCHITECTURES, default="resnet50",
        help="resnet50 (the product), or small: a few conv layers with the same head, for smoke "
        "runs and tests of the distributed machinery",
    )

    faults = parser.add_argument_group("preemption")
    faults.add_argument(
        "--backup-every-steps", type=_backup_every, default="auto",
        help="synchronous jobs back up the training state every N steps, so a job killed without "
        "warning loses fewer than N steps (on SIGTERM they save at once). auto: when 50 times "
        "the last backup's duration has passed (at least a minute), so backups cost about 2%% of "
        "the time on any device; 0: once per epoch. ParameterServer jobs back up per epoch",
    )

    out = parser.add_argument_group("outputs")
    out.add_argument(
        "--model-dir", default=None,
        help="where the chief saves the final SavedModel; default $AIP_MODEL_DIR, else ./output/model",
    )
    out.add_argument(
        "--checkpoint-dir", default=None,
        help="checkpoints and the preemption backup; default $AIP_CHECKPOINT_DIR, else "
        "'checkpoints' beside the model dir",
    )
    out.add_argument(
        "--tensorboard-dir", default=None,
        help="TensorBoard logs; default $AIP_TENSORBOARD_LOG_DIR, else 'logs' beside the model dir",
    )

    speed = parser.add_argument_group("speed")
    speed.add_argument(
        "--mixed-precision", choices=precision.CHOICES, default="auto",
        help="compute dtype; variables and the softmax stay float32. auto: float16 when every "
        "local GPU has compute capability 7.0+; on a CPU with bfloat16 instructions (AVX512-BF16, "
        "AMX), bfloat16 if a few seconds' measurement at start finds it 1.15x faster, agreed by "
        "every task; else float32. float16|bfloat16|off pin a policy (never measured); off: float32",
    )
    speed.add_argument("--jit-compile", action="store_true", help="compile the train step with XLA")
    speed.add_argument(
        "--steps-per-execution", type=_positive_int, default=1,
        help="train steps run per tf.function call; higher hides host overhead on accelerators",
    )

    tuning = parser.add_argument_group("hyperparameter tuning")
    tuning.add_argument(
        "--hypertune-metric", default="accuracy",
        help="metric reported to Vertex AI / AI Platform tuning every epoch by the chief: the "
        "validation value when there is validation data, else the training value",
    )

    evaluator = parser.add_argument_group("side-car evaluator")
    evaluator.add_argument(
        "--eval-timeout", type=_positive_float, default=1800.0,
        help="seconds the evaluator waits for a new checkpoint before giving up",
    )

    diagnostics = parser.add_argument_group("diagnostics")
    diagnostics.add_argument(
        "--trace-input-dir", default=None,
        help="each worker appends the ids of the examples it trains on to a file here "
        "(slow; for checking input sharding)",
    )
    diagnostics.add_argument(
        "--profile-steps", type=parse_profile_steps, default=None, metavar="FIRST-LAST",
        help="capture a TensorFlow profiler trace of these training steps (counted from 1 over the run, "
        "e.g. 10-15) into the TensorBoard directory (--tensorboard-dir, $AIP_TENSORBOARD_LOG_DIR on "
        "Vertex AI), for TensorBoard's profile tab (docs/performance.md)",
    )
    diagnostics.add_argument(
        "--profile-tasks", choices=PROFILE_TASKS, default="chief",
        help="which tasks capture --profile-steps: the chief (TENSORBOARD_DIR/train), or every "
        "training task (the others to TENSORBOARD_DIR/train-TASK)",
    )
    return parser


def parse(argv: Sequence[str] | None, environ: Mapping[str, str], cluster: Cluster) -> TrainConfig:
    """Parses flags and fills output defaults from the environment.

    A malformed flag is an argparse error (exit 2); a combination that cannot work raises
    ConfigError.
    """
    args = build_parser().parse_args(argv)
    if args.strategy == "parameter_server" and cluster.num_reducers:
        raise ConfigError(
            f"--strategy parameter_server: this job's worker pool 2 holds {cluster.num_reducers} Reduction Server "
            "reducer(s), not parameter servers; Reduction Server serves MultiWorkerMirrored's NCCL all-reduce "
            "(--strategy auto or multi_worker_mirrored)"
        )
    if args.strategy == "parameter_server" and cluster.num_ps == 0:
        raise ConfigError(
            "--strategy parameter_server needs ps tasks in the cluster (Vertex worker pool 2, "
            "`--ps` for trainer.launch), and this cluster has none"
        )
    if args.weights not in ("imagenet", "none") and "://" not in args.weights:
        if not os.path.exists(args.weights):
            raise ConfigError(f"--weights {args.weights}: no such file (use imagenet, none or a path)")

    dirs = outputs.resolve_dirs(
        model_dir=args.model_dir,
        checkpoint_dir=args.checkpoint_dir,
        tensorboard_dir=args.tensorboard_dir,
        environ=environ,
        trial=cluster.trial,
    )
    return TrainConfig(
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        per_replica_batch_size=args.per_replica_batch_size,
        learning_rate=default_learning_rate(args.weights) if args.learning_rate is None else args.learning_rate,
        image_size=args.image_size,
        seed=args.seed,
        strategy=args.strategy,
        dataset=args.dataset,
        eval_dataset=args.eval_dataset,
        data_dir=args.data_dir,
        cache_images=args.cache_images,
        shuffle_buffer=args.shuffle_buffer,
        validation_steps=args.validation_steps,
        max_bad_examples=args.max_bad_examples,
        weights=args.weights,
        architecture=args.architecture,
        backup_every_steps=args.backup_every_steps,
        model_dir=dirs.model_dir,
        checkpoint_dir=dirs.checkpoint_dir,
        tensorboard_dir=dirs.tensorboard_dir,
        mixed_precision=args.mixed_precision,
        jit_compile=args.jit_compile,
        steps_per_execution=args.steps_per_execution,
        hypertune_metric=args.hypertune_metric,
        eval_timeout=args.eval_timeout,
        trace_input_dir=args.trace_input_dir,
        profile_steps=args.profile_steps,
        profile_tasks=args.profile_tasks,
    )
