"""Runs a `trainer.tasks.Task` in every process of a job, whatever its role: the Task runtime's
public names, and its command

    python -m trainer.fit --task PACKAGE.MODULE[:CLASS] [runtime flags] [the task's flags]

The code is trainer/runtime/entry.py."""

from trainer.runtime.entry import build_parser, command_line, load_task, main, run

__all__ = ["build_parser", "load_task", "main", "run"]

if __name__ == "__main__":
    from trainer.library import ending

    ending.leave(ending.end(command_line()))
