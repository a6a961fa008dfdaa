"""How the trainer's processes log, and the known-harmless TensorFlow messages removed on purpose.

Every process logs `HH:MM:SS trainer: ...` lines: progress (INFO) to stdout, warnings and errors
to stderr. Vertex AI's Cloud Logging gives every stderr line severity ERROR and every stdout line
INFO, so a run that logged its progress to stderr would read as a stream of errors
(GoogleCloudPlatform/vertex-ai-samples#242). What TensorFlow prints that is
harmless and only repeats in every task is removed here, each with the reason, and nowhere else:

- in each trainer process (`configure`), the Python-side messages: TensorFlow's INFO lines
  (one per collective all-reduce) and one Keras warning our own code triggers (below);
- in `trainer.launch`, which relays every task's output, the lines TensorFlow's C++ runtime
  writes straight to the file descriptor, which no Python filter sees (`is_harmless`). Each task
  run on its own (a Vertex AI replica, a pod) still prints them once: they are harmless there too,
  and a filter inside the process would have to hold back stderr, where a fatal error's last
  line could then be lost.
"""

from __future__ import annotations

import logging
import re
import sys

# C++ runtime lines, matched anywhere in a line, and why each is harmless.
HARMLESS_LINES = {
    "Input of GeneratorDatasetOp::Dataset will not be optimized":
        "tf.distribute's own per-device prefetch (a MultiDeviceIterator, under every strategy's "
        "distribute_datasets_from_function) is a generator dataset that tf.data cannot rewrite; "
        "our pipeline before it is optimized as usual, and iterated alone it prints nothing",
    "All log messages before absl::InitializeLog() is called are written to STDERR":
        "absl saying it logs to stderr, where everything goes anyway",
}
_HARMLESS = re.compile("|".join(re.escape(text) for text in HARMLESS_LINES))

# Keras times the first batches' callbacks against the step. Our preemption vote
# (trainer.preemption.StepAgreement) reads a value the step computes, so it waits for the step
# to finish on the device, and Keras books that wait as the callback's time.
_KERAS_FALSE_ALARM = "Callback method `on_train_batch_end` is slow compared to the batch time"


def is_harmless(line: str) -> bool:
    return _HARMLESS.search(line) is not None


class _DropKerasFalseAlarm(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _KERAS_FALSE_ALARM not in record.getMessage()


class _Below(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def handlers() -> list[logging.Handler]:
    """INFO and below to stdout, WARNING and above to stderr, both in the trainer's format."""
    progress, problems = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    progress.addFilter(_Below(logging.WARNING))
    problems.setLevel(logging.WARNING)
    formatter = logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for handler in (progress, problems):
        handler.setFormatter(formatter)
    return [progress, problems]


def configure() -> None:
    """The trainer's log format and streams, and TensorFlow's Python loggers at WARNING without the
    false alarm."""
    logging.basicConfig(level=logging.INFO, handlers=handlers())
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("tensorflow").addFilter(_DropKerasFalseAlarm())
