"""`--profile-steps FIRST-LAST`: a TensorFlow profiler trace of those training steps, written where
TensorBoard's profile tab reads it.

The trace goes to TENSORBOARD_DIR/train (the directory Keras' TensorBoard callback writes the
training scalars to, so TensorBoard shows both as one run) on the chief, and, with
`--profile-tasks all`, to TENSORBOARD_DIR/train-TASK (`train-worker-0`) on every other training
task. Inside each, the profiler writes `plugins/profile/<session>/<host>.xplane.pb`; TensorFlow
writes it through its own file systems, so a gs:// directory (Vertex AI's
AIP_TENSORBOARD_LOG_DIR) works as a local one does. Viewing it needs TensorBoard's profile plugin
(the `xprof` package) where TensorBoard runs, not in the training image.

The flags are parsed in trainer.config (`parse_profile_steps`), which must not load TensorFlow.
Steps are counted from 1 over the whole run, as Keras' own `profile_batch` counts them (with
--steps-per-execution N, each count is one execution of N steps). The trace
starts before step FIRST begins and stops before step LAST + 1 begins (or before validation, or
at the end of training), so every step in the range is whole in it, with the step markers
(`train`, with its epoch and step numbers) that TensorBoard's step-time views group by. Under
ParameterServerStrategy the coordinator traces its own side of the steps (scheduling them and
waiting on the workers); it waits for the steps it scheduled to finish before it stops.
"""

from __future__ import annotations

import logging

import tensorflow as tf

log = logging.getLogger("trainer")


def log_dir(tensorboard_dir: str, task_name: str, is_chief: bool) -> str:
    """Where this task's trace goes: TENSORBOARD_DIR/train on the chief, train-TASK elsewhere."""
    return f"{tensorboard_dir.rstrip('/')}/" + ("train" if is_chief else f"train-{task_name}")


def profiles_here(tasks: str, is_chief: bool) -> bool:
    return tasks == "all" or is_chief


class ProfileSteps(tf.keras.callbacks.Callback):
    """Traces training steps `first` to `last` (counted from 1 over the run) into `directory`."""

    def __init__(self, directory: str, first: int, last: int):
        super().__init__()
        # Takes no logs, so ParameterServerStrategy allows its batch hooks (tf-keras refuses other
        # batch-level callbacks there: their logs are not ready when the hooks run).
        self._supports_tf_logs = True
        self.directory = directory
        self.first, self.last = first, last
        self.done = 0  # steps finished in this run
        self.tracing = False
        self.finished = False

    def _start(self):
        if self.tracing or self.finished:
            return
        tf.profiler.experimental.start(self.directory)
        self.tracing = True
        log.info("profiling steps %d-%d into %s", self.first, self.last, self.directory)

    def _stop(self):
        if not self.tracing:
            return
        coordinator = getattr(self.model, "_cluster_coordinator", None)
        if coordinator is not None:
            coordinator.join()  # the steps scheduled so far have run on the workers
        tf.profiler.experimental.stop()
        self.tracing, self.finished = False, True
        log.info("profile of steps %d-%d written under %s/plugins/profile", self.first, min(self.last, self.done),
                 self.directory)

    def on_epoch_begin(self, epoch, logs=None):
        if self.done + 1 == self.first:
            self._start()

    def on_train_batch_begin(self, batch, logs=None):
        if self.done == self.last:
            self._stop()

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        steps = (self.params or {}).get("steps")
        # The next step is the first: start now, unless the epoch ends here (then its validation
        # would be traced too, and on_epoch_begin starts it).
        if self.done + 1 == self.first and (steps is None or batch + 1 < steps):
            self._start()

    def on_test_begin(self, logs=None):
        self._stop()  # validation is not training: a range that reaches it ends at the epoch's end

    def on_epoch_end(self, epoch, logs=None):
        if self.done >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        self._stop()
