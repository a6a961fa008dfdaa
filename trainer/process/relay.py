"""What the runtime's supervisors share: the known-harmless lines TensorFlow's C++ runtime prints,
the signals a platform sends, and how a child dies with its parent.

trainer.run is the one stderr relay: it runs a job's command as a child process, reads its stderr,
leaves out these lines and writes the rest at their Cloud Logging severity, forwards the platform's
signals, and exits as the exit-code contract says (trainer/exits.py). trainer.launch, which reads
every task's output itself, leaves out the same lines. Nothing forks inside the training process.

The lines are written straight to file descriptor 2 while TensorFlow's libraries load, before
TF_CPP_MIN_LOG_LEVEL applies (and absl, which writes some, reads no environment variable at all),
so no filter inside the process can hide them. A filter inside would also have to hold stderr
back, and a fatal error's last line (a C++ CHECK, an abort) could then be lost with the process.
A parent that reads the pipe loses nothing: the kernel keeps what the child wrote until it is read.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Sequence

from trainer.process import severity

# C++ runtime lines, matched anywhere in a line, and why each is harmless.
HARMLESS_LINES = {
    "Input of GeneratorDatasetOp::Dataset will not be optimized":
        "tf.distribute's own per-device prefetch (a MultiDeviceIterator, under every strategy's "
        "distribute_datasets_from_function) is a generator dataset that tf.data cannot rewrite; "
        "our pipeline before it is optimized as usual, and iterated alone it prints nothing",
    "All log messages before absl::InitializeLog() is called are written to STDERR":
        "absl saying it logs to stderr, where everything goes anyway",
    "Local rendezvous is aborting with status: ABORTED: Cleanup ":
        "a step's rendezvous removed as its step ends (BaseRendezvousMgr::Cleanup, which aborts what "
        "is still pending with 'Cleanup STEP_ID'), logged at WARNING; a ParameterServerStrategy job's "
        "ps prints it when the coordinator's last steps end, in a job that succeeded; the error that "
        "stops a failing step is a status of its own, logged on its own line",
    "oneDNN custom operations are on.":
        "an INFO line, logged once by each of two libraries as it loads, on CPUs with AVX-512 VNNI, "
        "AVX512-BF16, AVX-VNNI or AMX (TensorFlow's port.cc), before TF_CPP_MIN_LOG_LEVEL, which "
        "hides every later INFO line, applies; trainer.precision's log says how the job computes",
}
_HARMLESS = re.compile("|".join(re.escape(text) for text in HARMLESS_LINES))


def is_harmless(line: str) -> bool:
    """Whether `line` is one of HARMLESS_LINES."""
    return _HARMLESS.search(line) is not None


# Messages of several lines, left out whole: text of the line that opens one, and why it is
# harmless. Only that first line carries a severity, so each line after it would read as an error.
HARMLESS_BLOCKS = {
    "] SessionOptions: goo.gle/debugproto":
        "TensorFlow's eager service logs at INFO the session options (a ConfigProto, about 20 lines) of "
        "the remote context a coordinator creates on each worker and parameter server as a "
        "ParameterServerStrategy job starts (eager_service_impl.cc); the job's own log says its cluster",
}
_BLOCK = re.compile("|".join(re.escape(text) for text in HARMLESS_BLOCKS))
# A block ends at an empty line (TensorFlow ends the dump with one), at a line that opens a
# message of its own, or after this many lines: whichever comes first.
MAX_BLOCK_LINES = 40


class Filter:
    """Which lines of one stream to keep, in order: all but HARMLESS_LINES and HARMLESS_BLOCKS."""

    def __init__(self):
        self._block_lines = 0  # lines of the block being left out; 0 outside one

    def keep(self, line: str) -> bool:
        if self._block_lines:
            if not line.strip():
                self._block_lines = 0
                return False  # the empty line that ends the dump
            if not severity.opens_message(line) and self._block_lines < MAX_BLOCK_LINES:
                self._block_lines += 1
                return False
            self._block_lines = 0
        if _BLOCK.search(line):
            self._block_lines = 1
            return False
        return not is_harmless(line)


# TensorFlow errors a level-1 script meets for want of one setting, and the line a supervisor adds
# after the command failed with one: TensorFlow's own message is long, and read as the job's
# output it reads as a bug. Text matched anywhere in a line -> the runtime's line.
KNOWN_FAILURES = {
    # tf.distribute's auto-sharding (tensorflow/core/grappler/optimizers/data/auto_shard.cc):
    # strategy.experimental_distribute_dataset, which Keras' fit calls, shards a dataset read from
    # files by file under the default policy, AUTO, as under FILE, and fails at the first batch
    # when there are fewer files than workers; the other workers then die of the lost peer.
    "Could not apply FILE based sharding":
        "the dataset has fewer files than the job has workers, so TensorFlow could not give each worker files of "
        "its own: shard by record (options.experimental_distribute.auto_shard_policy = "
        "tf.data.experimental.AutoShardPolicy.DATA, then dataset.with_options(options)), or write at least as "
        "many files as workers",
}
_KNOWN_FAILURE = re.compile("|".join(re.escape(text) for text in KNOWN_FAILURES))


def known_failure(line: str) -> str | None:
    """The runtime's line for a KNOWN_FAILURES error `line` shows, else None."""
    match = _KNOWN_FAILURE.search(line)
    return KNOWN_FAILURES[match.group(0)] if match else None


# Python exceptions whose traceback and message say nothing a reader can act on, and what the
# runtime says in their place: the exception line (the first unindented line after a traceback's
# frames) matched -> the runtime's line. The traceback and everything the command writes after it
# (the rest of the message) are left out.
KERAS_FIT_ACROSS_WORKERS = (
    "Keras 3's model.fit cannot train across workers on TensorFlow (keras-team/keras#20585): call "
    "trainer.loop.fit_model(model, dataset, epochs=..., steps_per_epoch=...) in its place, or write a "
    "trainer.tasks.Task (docs/keras.md)")
KNOWN_EXCEPTIONS = {
    # Keras 3.15's TensorFlow trainer, under MultiWorkerMirroredStrategy with two workers or more:
    # `_maybe_symbolic_build` hands a nest of PerReplica batches to strategy.reduce, whose message
    # then prints the whole batch (hundreds of lines) ...
    re.compile(r"^ValueError: Attempt to convert a value \(.*PerReplica"): KERAS_FIT_ACROSS_WORKERS,
    # ... and `reduce_per_replica` reduces a scalar loss along axis 0 (tensorflow/tensorflow#72388).
    re.compile(r"^\S*Error: .*Invalid reduction dimension \(?0 for input with 0 dimension"): KERAS_FIT_ACROSS_WORKERS,
}
_TRACEBACK = "Traceback (most recent call last):"


class Tracebacks:
    """Holds a Python traceback back until its exception line: a known exception (KNOWN_EXCEPTIONS)
    is then left out with the rest of the stream, and `found` says the runtime's line; any other is
    let through whole. Only the traceback's own frames wait, never a line of anything else."""

    def __init__(self):
        self.held: list[str] = []
        self.found: str | None = None

    def feed(self, line: str) -> list[str]:
        """The lines to write now, for one more line of the stream."""
        if self.found:
            return []
        if self.held:
            self.held.append(line)
            if line[:1] in (" ", "\t") or not line.strip():
                return []  # a frame, its source line or its ^^^ marker
            for pattern, said in KNOWN_EXCEPTIONS.items():
                if pattern.search(line):
                    self.found, self.held = said, []
                    return []
            return self.flush()
        if line.startswith(_TRACEBACK):
            self.held = [line]
            return []
        return [line]

    def flush(self) -> list[str]:
        held, self.held = self.held, []
        return held


# Keras' progress lines (tf-keras and Keras 3, verbose 1 or 2): "Epoch 3/10", then "12/50 [===>...]
# - ETA: ...", "12/50 ━━━━ ..." or "50/50 - 1s - ...", drawn with carriage returns and colours.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROGRESS = re.compile(r"(Epoch \d+/\d+\s*$|\d+/\d+ (\[|\u2501|- ))")


def is_progress(line: str) -> bool:
    """Whether `line` is one of Keras' progress lines."""
    return _PROGRESS.match(_ANSI.sub("", line).lstrip("\r\b ")) is not None


# What a platform sends a job's main process: Vertex AI and Kubernetes SIGTERM before a stop,
# an engine's `kill -s`, a terminal's Ctrl-C. SIGKILL cannot be forwarded: the child dies with
# its parent instead (PR_SET_PDEATHSIG).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

# How long the parent keeps reading after its child has exited: what the child wrote before it
# exited is read at once; only a grandchild that kept the pipe open could write later.
DRAIN_SECONDS = 10.0


# The words that name an interpreter by PATH. In a command given to the runtime they mean the
# interpreter the runtime itself runs on: a virtualenv's python called by its path, with the
# virtualenv not activated, would otherwise run the job on whatever `python` PATH finds first.
PYTHON_WORDS = ("python", "python3")


def with_this_python(command: Sequence[str]) -> list[str]:
    """`command` with a leading `python` or `python3` replaced by this interpreter (sys.executable)."""
    words = list(command)
    if words and words[0] in PYTHON_WORDS and sys.executable:
        words[0] = sys.executable
    return words


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
