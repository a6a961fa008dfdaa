"""Stopping processes as the platforms stop a task: a signal (SIGTERM), a grace period for the
process to save and exit on its own, then SIGKILL for whatever is still running.

The one place this is written: trainer.launch stops its tasks with it, trainer.run its command's
leftovers, the rehearsal's storage its FUSE mount, the benchmarks their servers and jobs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Sequence


def stop(processes: Sequence[subprocess.Popen], grace: float, *, signum: int = signal.SIGTERM,
         group: bool = False) -> None:
    """`signum` to each process still running (to its process group with `group`), then
    `wait_or_kill`. A grace of 0 sends SIGKILL at once."""
    for process in processes:
        if process.poll() is None:
            send(process, signal.SIGKILL if grace <= 0 else signum, group)
    wait_or_kill(processes, grace, group=group)


def wait_or_kill(processes: Sequence[subprocess.Popen], grace: float, *, group: bool = False) -> None:
    """Waits up to `grace` seconds in all for the processes to exit (something already asked them
    to), SIGKILLs those still running, and reaps every one."""
    deadline = time.monotonic() + max(0.0, grace)
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            send(process, signal.SIGKILL, group)
            process.wait()


def send(process: subprocess.Popen, signum: int, group: bool = False) -> None:
    """`signum` to the process, or to its process group (a process started with
    start_new_session or process_group=0 leads its own); nothing when it is already gone."""
    try:
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
    except ProcessLookupError:
        pass
