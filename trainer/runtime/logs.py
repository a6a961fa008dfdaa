"""How the trainer's processes log: one format, progress to stdout, problems to stderr.

Every process logs `HH:MM:SS trainer: ...` lines: progress (INFO) to stdout, warnings and errors
to stderr. Vertex AI's Cloud Logging gives every stderr line severity ERROR and every stdout line
INFO, so a run that logged its progress to stderr would read as a stream of errors
(GoogleCloudPlatform/vertex-ai-samples#242). In each process (`configure`), TensorFlow's
Python-side INFO lines, harmless and repeated in every task (one per collective all-reduce), are
left out here. What TensorFlow's C++ runtime writes straight to file descriptor 2 no Python
filter sees: trainer/process/relay.py leaves those lines out, from outside the process.
"""

from __future__ import annotations

import logging
import sys

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
    """The trainer's log format and streams, and TensorFlow's Python loggers at WARNING."""
    logging.basicConfig(level=logging.INFO, handlers=handlers())
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
