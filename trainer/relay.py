"""The images' stderr relay: a parent process that copies a job's stderr without the known-harmless
lines TensorFlow's C++ runtime prints, forwards the platform's signals, and exits as the job did.

Those lines are written straight to file descriptor 2 while TensorFlow's libraries load, before
TF_CPP_MIN_LOG_LEVEL applies (and absl, which writes some, reads no environment variable at all),
so no filter inside the process can hide them. A filter inside would also have to hold stderr
back, and a fatal error's last line (a C++ CHECK, an abort) could then be lost with the process.
A parent that reads the pipe loses nothing: the kernel keeps what the child wrote until it is read.

Every command of the images ends with `relay.run(main)`: in the images (TRAINER_RELAY_STDERR=1,
set by the Dockerfiles) it forks first, before TensorFlow is imported; anywhere else it runs
`main` as it is. trainer.launch, which reads every task's output itself, leaves the same lines out
with `is_harmless`; trainer.run, which runs a user's own command, does too and dies with its
parent in the same way (`die_with_parent`).
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import threading
from typing import Callable, Mapping, NoReturn

# C++ runtime lines, matched anywhere in a line, and why each is harmless.
HARMLESS_LINES = {
    "Input of GeneratorDatasetOp::Dataset will not be optimized":
        "tf.distribute's own per-device prefetch (a MultiDeviceIterator, under every strategy's "
        "distribute_datasets_from_function) is a generator dataset that tf.data cannot rewrite; "
        "our pipeline before it is optimized as usual, and iterated alone it prints nothing",
    "All log messages before absl::InitializeLog() is called are written to STDERR":
        "absl saying it logs to stderr, where everything goes anyway",
    "oneDNN custom operations are on.":
        "an INFO line, logged once by each of two libraries as it loads, on CPUs with AVX-512 VNNI, "
        "AVX512-BF16, AVX-VNNI or AMX (TensorFlow's port.cc), before TF_CPP_MIN_LOG_LEVEL, which "
        "hides every later INFO line, applies; trainer.precision's log says how the job computes",
}
_HARMLESS = re.compile("|".join(re.escape(text) for text in HARMLESS_LINES))


def is_harmless(line: str) -> bool:
    return _HARMLESS.search(line) is not None


# The images set it (Dockerfile.cpu, Dockerfile.gpu): `python -m cassava.task` then runs under
# relay_stderr. Anywhere else the process is left as it is started (trainer.launch filters what
# it relays itself and clears the variable for its tasks).
RELAY_VARIABLE = "TRAINER_RELAY_STDERR"

# What a platform sends a job's main process: Vertex AI and Kubernetes SIGTERM before a stop,
# an engine's `kill -s`, a terminal's Ctrl-C. SIGKILL cannot be forwarded: the child dies with
# its parent instead (PR_SET_PDEATHSIG).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

# How long the parent keeps reading after its child has exited: what the child wrote before it
# exited is read at once; only a grandchild that kept the pipe open could write later.
DRAIN_SECONDS = 10.0


def relay_stderr_if_asked(environ: Mapping[str, str]) -> None:
    if environ.get(RELAY_VARIABLE, "") not in ("", "0"):
        relay_stderr()


def relay_stderr() -> None:
    """Forks. The child returns from here and runs the job with its stderr on a pipe. This process
    copies that pipe to the real stderr without the known-harmless lines, forwards the signals a
    platform sends to the child, and exits as the child did (the same code, or 128 + the signal
    that killed it, as a container engine reports it). In the parent, never returns.

    Call it first, before TensorFlow is imported and before any thread starts."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or both processes would write what was buffered before the fork
    read_end, write_end = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)  # a signal now waits for its handler
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        # Its own process group: a terminal's Ctrl-C reaches the child once, forwarded.
        os.setpgid(0, 0)
        die_with_parent(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        return
    os.close(write_end)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    copier = threading.Thread(target=copy_without_harmless, args=(read_end, 2), daemon=True)
    copier.start()
    _, status = os.waitpid(child, 0)
    copier.join(timeout=DRAIN_SECONDS)
    _exit_as(os.waitstatus_to_exitcode(status))


def copy_without_harmless(read_fd: int, write_fd: int) -> None:
    """Copies lines from `read_fd` to `write_fd` until end of file, leaving out the harmless ones.
    A line is written whole as soon as it is complete; a last line without a newline at the end.
    Keeps reading when the destination is gone, so the writer never blocks on a full pipe."""
    writable = True
    with io.open(read_fd, "rb") as source:
        for line in source:
            if not writable or is_harmless(line.decode("utf-8", errors="replace")):
                continue
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(write_fd, view):]
            except OSError:
                writable = False


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies: a parent killed with SIGKILL cannot forward it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the child then outlives a parent killed with SIGKILL
    if os.getppid() != parent:  # the parent died before the request was in place
        os._exit(128 + signal.SIGKILL)


def _exit_as(code: int) -> None:
    if code < 0:
        signum = -code
        # The same signal again, so that whatever waits for this process sees it die of it. As
        # PID 1 of a container the kernel ignores it: the exit code says the same thing.
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        code = 128 + signum
    os._exit(code)


def run(main: Callable[[], int]) -> NoReturn:
    """A command's `__main__`: the relay first where the image asks for it, then `main`'s exit code."""
    relay_stderr_if_asked(os.environ)
    sys.exit(main())
