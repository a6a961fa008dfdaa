"""TensorFlow, imported without the lines its libraries print while they load.

TensorFlow's C++ libraries write a few INFO lines straight to file descriptor 2 as they load, before
TF_CPP_MIN_LOG_LEVEL applies: absl's notice that it logs to stderr before it is initialised, and
oneDNN's "custom operations are on" on CPUs with AVX-512 VNNI, AVX512-BF16, AVX-VNNI or AMX, each
once per library that loads (four lines with tensorflow-cpu 2.21.0 on an AMD EPYC with AVX512-BF16).
Cloud Logging reads every stderr line of a container as ERROR, so a healthy server would start with
four errors. The training images leave them out with trainer.run, a parent process that reads the
job's stderr; the prediction image carries serving/ alone, and on this machine those lines came
only while TensorFlow was imported, none when a SavedModel was loaded or called. So only that
import runs with file descriptor 2 on a pipe: a thread copies every line to the real stderr as it
comes, except the two kinds above (the same text trainer/process/relay.py matches), and stderr is given
back when the import returns or raises.

What it cannot do: a fatal C++ error during the import (a CHECK, an abort) ends the process with
the copying thread, and a line the thread had not yet copied is lost. An import that fails in
Python raises after stderr is given back, so its traceback is printed whole.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading

HARMLESS_LINES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on.",
)
_HARMLESS = re.compile("|".join(re.escape(text) for text in HARMLESS_LINES))
# How long to wait for the copier once stderr is given back: it reads what is left in the pipe at
# once; only a process that inherited the pipe during the import could keep it open longer.
DRAIN_SECONDS = 10.0
_lock = threading.Lock()


def import_tensorflow():
    """The tensorflow module, imported (once) with its load-time lines left out of stderr."""
    with _lock:
        if "tensorflow" in sys.modules:
            return sys.modules["tensorflow"]
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # no INFO lines once it is in force
        sys.stderr.flush()
        real_stderr = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        copier = threading.Thread(target=copy_without_harmless, args=(read_end, real_stderr), daemon=True)
        copier.start()
        try:
            import tensorflow
        finally:
            sys.stderr.flush()
            os.dup2(real_stderr, 2)  # the pipe's last write end closes: the copier reads to its end
            copier.join(timeout=DRAIN_SECONDS)
            os.close(real_stderr)
        return tensorflow


def copy_without_harmless(read_fd: int, write_fd: int) -> None:
    """Copies lines from `read_fd` to `write_fd` until end of file, leaving out the harmless ones;
    a last line without a newline too. Keeps reading when the destination is gone, so that the
    writer never blocks on a full pipe."""
    writable = True
    with io.open(read_fd, "rb") as source:
        for line in source:
            if not writable or _HARMLESS.search(line.decode("utf-8", errors="replace")):
                continue
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(write_fd, view):]
            except OSError:
                writable = False
