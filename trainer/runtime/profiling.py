"""`--profile-steps FIRST-LAST`: a TensorFlow profiler trace of those training steps, written where
TensorBoard's profile tab reads it.

The trace goes to TENSORBOARD_DIR/train (the directory Keras' TensorBoard callback writes the
training scalars to, so TensorBoard shows both as one run) on the chief, and, with
`--profile-tasks all`, to TENSORBOARD_DIR/train-TASK (`train-worker-0`) on every other training
task. Inside each, the profiler writes `plugins/profile/<session>/<host>.xplane.pb`; TensorFlow
writes it through its own file systems, so a gs:// directory (Vertex AI's
AIP_TENSORBOARD_LOG_DIR) works as a local one does. Viewing it needs TensorBoard's profile plugin
(the `xprof` package) where TensorBoard runs, not in the training image.

The flags are parsed in trainer.runtime.config (`parse_profile_steps`), which must not load TensorFlow.
Steps are counted from 1 over the whole run. The trace starts before step FIRST begins and stops
after step LAST (or at its epoch's end, before validation), so every step in the range is whole
in it. Under ParameterServerStrategy the coordinator traces its own side of the steps
(scheduling them and waiting on the workers); it waits for the steps it scheduled to finish
before it stops.
"""

from __future__ import annotations

import logging
from typing import Callable

import tensorflow as tf

from trainer.library import loop

log = logging.getLogger("trainer")


def log_dir(tensorboard_dir: str, task_name: str, is_chief: bool) -> str:
    """Where this task's trace goes: TENSORBOARD_DIR/train on the chief, train-TASK elsewhere."""
    return f"{tensorboard_dir.rstrip('/')}/" + ("train" if is_chief else f"train-{task_name}")


def profiles_here(tasks: str, is_chief: bool) -> bool:
    return tasks == "all" or is_chief


class ProfileSteps(loop.Events):
    """Traces training steps `first` to `last` (counted from 1 over the run) into `directory`.

    The loop reports its steps after each call of the train function, so with
    --steps-per-execution N the trace starts and stops at the N-step calls around the range."""

    def __init__(self, directory: str, first: int, last: int, steps_per_epoch: int,
                 wait: Callable[[], None] = lambda: None):
        """`wait`: until the steps scheduled so far have run (a ParameterServer coordinator's)."""
        super().__init__()
        self.directory = directory
        self.first, self.last = first, last
        self.steps_per_epoch = steps_per_epoch
        self.wait = wait
        self.tracing = False
        self.finished = False

    def _start(self):
        if self.tracing or self.finished:
            return
        tf.profiler.experimental.start(self.directory)
        self.tracing = True
        log.info("profiling steps %d-%d into %s", self.first, self.last, self.directory)

    def _stop(self, done: int):
        if not self.tracing:
            return
        self.wait()
        tf.profiler.experimental.stop()
        self.tracing, self.finished = False, True
        log.info("profile of steps %d-%d written under %s/plugins/profile", self.first, min(self.last, done),
                 self.directory)

    def epoch_begin(self, epoch: int) -> None:
        if self.first <= (epoch - 1) * self.steps_per_epoch + 1 <= self.last:
            self._start()  # the range starts with this epoch

    def steps_done(self, epoch: int, step: int) -> None:
        done = (epoch - 1) * self.steps_per_epoch + step
        if done >= self.last or step == self.steps_per_epoch:
            # Validation is not training: a range that reaches the epoch's end stops there.
            self._stop(done)
        elif done + 1 >= self.first:
            self._start()

    def epoch_end(self, epoch: int, logs: dict) -> None:
        self._stop(epoch * self.steps_per_epoch)
