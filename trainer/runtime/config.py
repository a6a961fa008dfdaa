"""The runtime's flags and environment defaults, resolved once into a frozen `TrainConfig`.

`parse(argv, environ, cluster, task)` is pure: it reads the AIP_* output directories that Vertex
AI sets, applies the per-trial subdirectory for hyperparameter tuning, adds the task's own flags
(`Task.add_arguments`) and returns plain values, the task's flags as `task_flags`. Nothing below
it reads flags or the environment again.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Mapping, Sequence

from trainer import cli, outputs, precision
from trainer.cluster import Cluster
from trainer.tasks import Task

STRATEGIES = ("auto", "multi_worker_mirrored", "mirrored", "one_device", "parameter_server")
PROFILE_TASKS = ("chief", "all")


class ConfigError(ValueError):
    """A combination of flags and cluster that cannot work. str() is one line."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # Training.
    epochs: int
    steps_per_epoch: int | None
    per_replica_batch_size: int
    learning_rate: float
    seed: int
    # Strategy as asked for; `trainer.runtime.strategy.choose` turns `auto` into a concrete one.
    strategy: str
    validation_steps: int | None
    # Preemption: back up every N steps; 0: every epoch; None: auto (trainer.library.backup).
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
    # The task's own flags (Task.add_arguments), parsed.
    task_flags: argparse.Namespace = dataclasses.field(default_factory=argparse.Namespace)
    # A profiler trace of these training steps (first, last; from 1), on the chief or every task.
    profile_steps: tuple[int, int] | None = None
    profile_tasks: str = "chief"


def _backup_every(text: str) -> int | None:
    return None if text == "auto" else cli.non_negative_int(text)


def _learning_rate(text: str) -> float | None:
    return None if text == "auto" else cli.positive_float(text)


def parse_profile_steps(text: str) -> tuple[int, int]:
    """--profile-steps: 'FIRST-LAST' or 'STEP' -> (first, last), counted from 1, inclusive."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    first, last = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
    if not match or first < 1 or last < first:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST, steps counted from 1 with FIRST <= LAST (e.g. 10-15), "
                                         f"got {text!r}")
    return first, last


def build_parser(task: Task, prog: str = "python -m trainer.fit") -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser with the runtime's flags and the task's, and the names of the runtime's."""
    parser = cli.OneLineParser(
        prog=prog,
        description=(task.description or f"Train the {task.name} task") + " on the cluster described by "
        "TF_CONFIG, CLUSTER_SPEC or a JobSet pod's variables, or in one process when none is set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=cli.positive_int, default=2, help="training epochs")
    train.add_argument(
        "--steps-per-epoch", type=cli.positive_int, default=None,
        help="steps per epoch; by default the training examples the task reports divided by the global batch",
    )
    train.add_argument(
        "--per-replica-batch-size", type=cli.positive_int, default=64,
        help="examples per replica per step; the global batch is this times the replicas in sync",
    )
    train.add_argument(
        "--learning-rate", type=_learning_rate, default="auto",
        help=f"the optimizer's learning rate; auto: the task's default ({task.learning_rate:g} unless it depends "
        "on the task's flags)",
    )
    train.add_argument("--seed", type=int, default=42, help="seed for weights, shuffling and augmentation")
    train.add_argument(
        "--validation-steps", type=cli.positive_int, default=None,
        help="validation batches per evaluation; by default the whole validation set the task reports",
    )

    strategy = parser.add_argument_group("strategy")
    strategy.add_argument(
        "--strategy", choices=STRATEGIES, default="auto",
        help="auto: parameter_server when the cluster has ps tasks, multi_worker_mirrored for "
        "any other cluster, mirrored for a single process",
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
        help="where the chief saves the final model; default $AIP_MODEL_DIR, else ./output/model",
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
        "--mixed-precision", choices=precision.CHOICES, default=task.mixed_precision,
        help="compute dtype; variables stay float32. auto: float16 when every "
        "local GPU has compute capability 7.0+; on a CPU with bfloat16 instructions (AVX512-BF16, "
        "AMX), bfloat16 if timing the task's own model at start finds it 1.15x faster, agreed by "
        "every task; else float32. float16|bfloat16|off pin a policy (never measured); off: float32",
    )
    speed.add_argument("--jit-compile", action="store_true", help="compile the train step with XLA")
    speed.add_argument(
        "--steps-per-execution", type=cli.positive_int, default=1,
        help="train steps run per tf.function call; higher hides host overhead on accelerators",
    )

    tuning = parser.add_argument_group("hyperparameter tuning")
    tuning.add_argument(
        "--hypertune-metric", default=task.hypertune_metric,
        help="metric reported to Vertex AI tuning every epoch by the chief: the "
        "validation value when there is validation data, else the training value",
    )

    evaluator = parser.add_argument_group("side-car evaluator")
    evaluator.add_argument(
        "--eval-timeout", type=cli.positive_float, default=1800.0,
        help="seconds the evaluator waits for a new checkpoint before giving up",
    )

    diagnostics = parser.add_argument_group("diagnostics")
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
    runtime_names = {action.dest for action in parser._actions}
    task.add_arguments(parser.add_argument_group(f"the {task.name} task"))
    return parser, runtime_names


def parse(argv: Sequence[str] | None, environ: Mapping[str, str], cluster: Cluster, task: Task,
          prog: str = "python -m trainer.fit") -> TrainConfig:
    """Parses flags and fills output defaults from the environment.

    A malformed flag is an argparse error (exit 2); a combination that cannot work raises
    ConfigError.
    """
    parser, runtime_names = build_parser(task, prog)
    args = parser.parse_args(argv)
    task_flags = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in runtime_names})
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
        learning_rate=task.default_learning_rate(task_flags) if args.learning_rate is None else args.learning_rate,
        seed=args.seed,
        strategy=args.strategy,
        validation_steps=args.validation_steps,
        backup_every_steps=args.backup_every_steps,
        model_dir=dirs.model_dir,
        checkpoint_dir=dirs.checkpoint_dir,
        tensorboard_dir=dirs.tensorboard_dir,
        mixed_precision=args.mixed_precision,
        jit_compile=args.jit_compile,
        steps_per_execution=args.steps_per_execution,
        hypertune_metric=args.hypertune_metric,
        eval_timeout=args.eval_timeout,
        task_flags=task_flags,
        profile_steps=args.profile_steps,
        profile_tasks=args.profile_tasks,
    )
