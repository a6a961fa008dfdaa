"""The task's word on an error: an error its `describe_error` says is its data's ends the
process with one line and exit 2 (trainer.exits), whichever role met it."""

from __future__ import annotations

import contextlib
from typing import Iterator

from trainer.tasks import DataError, Run, Task


@contextlib.contextmanager
def data_errors(task: Task, run: Run) -> Iterator[None]:
    """An error the task's `describe_error` says is its data's becomes a DataError (one line,
    exit 2); any other error passes on unchanged."""
    try:
        yield
    except DataError:
        raise
    except Exception as error:
        line = task.describe_error(error, run)
        if line is None:
            raise
        raise DataError(line) from None
