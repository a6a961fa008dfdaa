"""Where each process writes: output directories per trial, and the save path per task.

Pure path arithmetic on strings, so it works the same for local paths and gs:// URLs and is
tested without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

DEFAULT_MODEL_DIR = "output/model"
# The variable trainer.launch gives every task of one launch, so that a job's state tells this
# launch's run from an earlier one's (trainer/runtime/ownership.py); shared here because the
# launcher runs no part of the Task runtime.
LAUNCH_ID = "TRAINER_LAUNCH_ID"


@dataclasses.dataclass(frozen=True)
class OutputDirs:
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str


def resolve_dirs(
    model_dir: str | None,
    checkpoint_dir: str | None,
    tensorboard_dir: str | None,
    environ: Mapping[str, str],
    trial: str | None,
) -> OutputDirs:
    """Flag, else the AIP_* variable Vertex AI sets, else a directory beside the model dir.

    Each directory is then made specific to the tuning trial, so parallel trials never write
    over each other.
    """
    if model_dir and all(environ.get(name) == path for name, path in local_defaults(trial).items()):
        # Only trainer.run's stand-ins for the platform's variables: the --model-dir given moves
        # the checkpoints and logs with it, as it would with no variable set.
        environ = {name: value for name, value in environ.items() if name not in AIP_VARIABLES}
    model_dir = model_dir or environ.get("AIP_MODEL_DIR") or DEFAULT_MODEL_DIR
    checkpoint_dir = (
        checkpoint_dir or environ.get("AIP_CHECKPOINT_DIR") or sibling(model_dir, "checkpoints")
    )
    tensorboard_dir = (
        tensorboard_dir or environ.get("AIP_TENSORBOARD_LOG_DIR") or sibling(model_dir, "logs")
    )
    return OutputDirs(
        model_dir=for_trial(model_dir, trial),
        checkpoint_dir=for_trial(checkpoint_dir, trial),
        tensorboard_dir=for_trial(tensorboard_dir, trial),
    )


AIP_VARIABLES = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


def local_defaults(trial: str | None) -> dict[str, str]:
    """The AIP_* values trainer.run sets where no platform set any (resolve_dirs with no flag and no
    variable): output/model and its siblings, per trial."""
    dirs = resolve_dirs(None, None, None, {}, trial)
    return dict(zip(AIP_VARIABLES, (dirs.model_dir, dirs.checkpoint_dir, dirs.tensorboard_dir)))


def sibling(path: str, name: str) -> str:
    """`gs://b/job/model/` -> `gs://b/job/NAME`; `model` -> `NAME`."""
    parent, sep, _ = path.rstrip("/").rpartition("/")
    if not sep:
        return name
    if parent.endswith(":/") or parent.endswith(":"):  # the model dir is a bucket root
        return f"{path.rstrip('/')}/{name}"
    return f"{parent}/{name}"


def for_trial(path: str, trial: str | None) -> str:
    """Appends the trial id, unless the platform already put it in the path.

    Vertex AI hyperparameter tuning already sets AIP_MODEL_DIR to `BASE/<trial>/model`; AI
    Platform and hand-set flags do not.
    """
    if not trial:
        return path
    subdir = f"trial-{trial}"
    components = path.rstrip("/").split("/")
    if trial in components or subdir in components:
        return path
    return join(path, subdir)


def join(*parts: str) -> str:
    head, *rest = parts
    for part in rest:
        head = f"{head.rstrip('/')}/{part.lstrip('/')}"
    return head


def backup_dir(checkpoint_dir: str) -> str:
    """The preemption backup (trainer.library.backup), shared by every task of the job."""
    return join(checkpoint_dir, "backup")
