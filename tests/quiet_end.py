"""What a healthy job's tasks print once training has ended: no error line from any of them.

TensorFlow's coordination service logs `E0000 ... StartAbort UNAVAILABLE ...` in a task that is
left behind by another (trainer/library/ending.py says when); Cloud Logging shows it as an ERROR of a job
that succeeded. The tiers' healthy multi-worker runs check their output with `errors_after_training`.
"""

from __future__ import annotations

import re

# A line of TensorFlow's C++ runtime (absl: E, then the date as MMDD, then the time), of gRPC
# (the same prefix), a Python traceback, or a line a relay marked ERROR.
ERROR_LINE = re.compile(r"(?:^|\s)E\d{4} \d\d:\d\d:\d\d|Traceback \(most recent call last\)|\bERROR\b")
# The last epoch, as the runtime's epoch log (`epoch 3/3 ends`) and the level-1 example
# (`epoch 2/2: loss`) print it.
LAST_EPOCH = re.compile(r"\bepoch (\d+)/\1\b")


def errors_after_training(output: str, last_epoch: re.Pattern = LAST_EPOCH) -> list[str]:
    """The error lines after the first line that reports the last epoch, in any task's output
    (`output`: the launcher's, every line prefixed by its task, or a rehearsal's). Raises
    AssertionError when no line reports the last epoch: then the check would be empty."""
    lines = output.splitlines()
    ends = [i for i, line in enumerate(lines) if last_epoch.search(line)]
    assert ends, "no line reports the last epoch: " + output[-2000:]
    return [line for line in lines[ends[0] + 1:] if ERROR_LINE.search(line)]
