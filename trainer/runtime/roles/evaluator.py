"""The side-car evaluator: evaluates each new checkpoint on the validation data.

It is not part of the training cluster (it never joins TensorFlow's cluster), so it works the
same next to a MultiWorkerMirrored or a ParameterServer job: it watches the checkpoint
directory, evaluates the newest checkpoint it has not seen, writes the results as TensorBoard
summaries under `<tensorboard dir>/eval`, and exits after the final epoch's checkpoint. If no
new checkpoint appears within --eval-timeout seconds it gives up with exit code 2.
"""

from __future__ import annotations

import logging
import re
import sys
import time

import tensorflow as tf

from trainer import outputs
from trainer.runtime import plan, saving
from trainer.runtime.data_errors import data_errors
from trainer.cluster import Cluster
from trainer.runtime.config import TrainConfig
from trainer.tasks import DataError, Task

log = logging.getLogger("trainer")
POLL_SECONDS = 2.0


class EvaluatorTimeout(RuntimeError):
    """No new checkpoint in time. str() is one line."""


def checkpoint_epoch(path: str) -> int:
    """The epoch of a checkpoint trainer.runtime.saving wrote (`.../epoch-3`), -1 for anything else."""
    match = re.search(r"epoch-(\d+)$", path)
    return int(match.group(1)) if match else -1


def newest_checkpoint(checkpoint_dir: str, last_epoch: int | None = None) -> str | None:
    """The newest epoch checkpoint in `checkpoint_dir` (`.../epoch-N`), found by listing the index
    files, which the saver writes after the data files (and which an object store shows whole or
    not at all), not from the `checkpoint` state file tf.train.latest_checkpoint reads: TensorFlow's
    Cloud Storage client keeps a file's size for 5 s (GCS_STAT_CACHE_MAX_AGE), so a state file
    rewritten within them is read cut short ("ParseError ... Checkpoint ignored" on stderr) and the
    newest epoch is missed until then. Listings are not cached. Epochs past `last_epoch`, the
    job's count, are not this job's and never chosen."""
    prefixes = [path[:-len(".index")] for path in tf.io.gfile.glob(outputs.join(checkpoint_dir, "epoch-*.index"))]
    prefixes = [path for path in prefixes if last_epoch is None or checkpoint_epoch(path) <= last_epoch]
    return max(prefixes, key=checkpoint_epoch, default=None)


def wait_for_new_checkpoint(checkpoint_dir: str, after_epoch: int, timeout: float, last_epoch: int | None = None) -> str:
    """The newest checkpoint past `after_epoch` and at most `last_epoch` (newest_checkpoint). One
    whose index a local disk still holds half-written fails to load, and run() waits for the next
    poll."""
    deadline = time.monotonic() + timeout
    while True:
        latest = newest_checkpoint(checkpoint_dir, last_epoch)
        if latest and checkpoint_epoch(latest) > after_epoch:
            return latest
        if time.monotonic() > deadline:
            raise EvaluatorTimeout(
                f"no new checkpoint in {checkpoint_dir} for {timeout:.0f}s (--eval-timeout); "
                f"last evaluated epoch: {after_epoch if after_epoch > 0 else 'none'}"
            )
        time.sleep(POLL_SECONDS)


def evaluate(task: Task, config: TrainConfig, cluster: Cluster, name: str) -> int:
    """Evaluates each new checkpoint until the final epoch's; returns the exit code. `name`: the
    command's name, for its error lines."""
    # It evaluates in float32 whatever the job trains in (trainer.runtime.saving builds the model so).
    examples = task.prepare(config.task_flags)
    # The whole validation set each time, unless --validation-steps says otherwise.
    steps = plan.validation_steps(config, examples, config.per_replica_batch_size)
    run = plan.make_run(config, cluster, "evaluator", replicas_in_sync=1, num_input_pipelines=1,
                        steps_per_epoch=config.steps_per_epoch or 1, validation_steps=steps, shuffle_seed=config.seed,
                        mixed_precision="float32")
    dataset = task.validation_dataset(run, tf.distribute.InputContext())
    if dataset is None:
        raise DataError(f"the evaluator needs validation data, and the {task.name} task has none with these flags")
    if steps is not None:
        dataset = dataset.repeat()  # exactly `steps` batches, however the last one falls
    writer = tf.summary.create_file_writer(outputs.join(config.tensorboard_dir, "eval"))
    log.info("evaluator: watching %s for epochs up to %d", config.checkpoint_dir, config.epochs)

    last_epoch = 0
    while last_epoch < config.epochs:
        try:
            checkpoint = wait_for_new_checkpoint(config.checkpoint_dir, last_epoch, config.eval_timeout, config.epochs)
        except EvaluatorTimeout as error:
            print(f"{name}: error: evaluator: {error}", file=sys.stderr)
            return 2
        try:
            model = saving.model_from_checkpoint(task, run, checkpoint, dataset.element_spec)
        except saving.CheckpointMismatch as error:
            raise DataError(f"evaluator: {error}: the evaluator needs the training job's own flags") from None
        except tf.errors.OpError as error:
            # Training may replace a checkpoint while it is read; the next one will do.
            log.warning("evaluator: could not read %s (%s); waiting for the next", checkpoint,
                        (error.message or "").splitlines()[0][:200])
            time.sleep(POLL_SECONDS)
            continue
        with data_errors(task, run):
            results = model.evaluate(dataset, steps=steps, return_dict=True, verbose=0)
        last_epoch = checkpoint_epoch(checkpoint)
        with writer.as_default(step=last_epoch):
            for metric, value in results.items():
                tf.summary.scalar(f"eval_{metric}", value)
        writer.flush()
        log.info("evaluator: epoch %d: %s", last_epoch, " ".join(f"{k}={v:.4f}" for k, v in sorted(results.items())))
    log.info("evaluator: evaluated the final checkpoint (epoch %d)", last_epoch)
    return 0
