"""The Cloud Logging severity of each line a program writes to stderr, and how to write the line so
that the platform records that severity.

What the platforms do with a container's output:
- Vertex AI records every stderr line as ERROR and every stdout line as INFO
  (GoogleCloudPlatform/vertex-ai-samples#242: a training job's progress bars and INFO lines read
  as a stream of errors). A line holding a JSON object is not parsed there: its text lands as a
  string inside jsonPayload.message (googleapis/python-aiplatform#629).
- GKE's logging agent sends what a container writes to stdout and stderr to Cloud Logging, and
  makes a line holding one JSON object a structured entry whose `severity` field sets the
  entry's severity (cloud.google.com/logging/docs/structured-logging, "Use an agent to write
  logs" and its special JSON fields). Without one, stdout is INFO and stderr ERROR.

TensorFlow and Python write everything to stderr: INFO and WARNING lines of TensorFlow's C++
runtime and absl (`I1125 12:00:00.123456 ...`, W, E, F), Python's logging in its default format
(`WARNING:tensorflow:...`), warnings, tracebacks. So `Writer` sends each line where it keeps its
severity:
- PLAIN (Vertex AI, a terminal, anything else): DEBUG and INFO lines go to stdout, everything
  else stays on stderr, unchanged. The stream carries the severity Vertex can record: INFO or
  ERROR. A WARNING reads as ERROR there, as it would anyway.
- JSON (a Kubernetes pod): one JSON object per entry, `{"severity": ..., "message": ...}`, INFO
  and DEBUG on stdout and the rest on stderr, so that a collector that does not parse JSON still
  gets the stream's severity. A Python traceback is one entry, its lines joined, as Error
  Reporting reads a stack trace.
A line is never held longer than it takes to read the next one, except the lines of a traceback
in JSON, which are written the moment the traceback ends, or at end of input (`close`).
"""

from __future__ import annotations

import json
import os
import re
import threading

DEBUG, INFO, WARNING, ERROR, CRITICAL = "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"
PLAIN, JSON = "plain", "json"

# glog's prefix, which absl (C++ and Python) and TensorFlow's C++ runtime write:
# "I1125 12:00:00.123456  4242 file.cc:12] ...", severity letter then MMDD and the time. Lines
# absl writes before its log is initialised carry "W0000 00:00:1732530000.123456": seconds since 1970.
_GLOG = re.compile(r"([IWEF])\d{4} \d{2}:\d{2}:\d+\.\d+ ")
# TensorFlow's C++ logging before it moved to absl: "2024-11-25 12:00:00.123456: W tensorflow/...".
_TF_DATED = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+: ([IWEF]) ")
_GLOG_LETTERS = {"I": INFO, "W": WARNING, "E": ERROR, "F": CRITICAL}
# Python's logging.basicConfig() default, BASIC_FORMAT "%(levelname)s:%(name)s:%(message)s".
_PYTHON_LOGGING = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):[^:\s]*:")
# warnings.showwarning's "FILE:LINE: CATEGORY: message" (its next line, indented, is the source).
_PYTHON_WARNING = re.compile(r"\S.*:\d+: \w*Warning: ")
TRACEBACK = "Traceback (most recent call last):"


def classify(line: str, previous: str | None = None) -> str:
    """The severity of one line of stderr. `previous` is the severity of the line before it: an
    indented line continues it (a warning's source line, a traceback's frames). A line nothing
    recognises is ERROR, as the platforms record stderr."""
    for pattern in (_GLOG, _TF_DATED):
        match = pattern.match(line)
        if match:
            return _GLOG_LETTERS[match.group(1)]
    match = _PYTHON_LOGGING.match(line)
    if match:
        return match.group(1)
    if _PYTHON_WARNING.match(line):
        return WARNING
    if previous is not None and line[:1] in (" ", "\t") and line.strip():
        return previous
    return ERROR


def opens_message(line: str) -> bool:
    """Whether `line` begins a message of its own: a glog, TensorFlow or Python logging prefix, a
    warning, or a traceback."""
    return bool(_GLOG.match(line) or _TF_DATED.match(line) or _PYTHON_LOGGING.match(line) or _PYTHON_WARNING.match(line)
                or line.startswith(TRACEBACK))


def is_stdout_severity(severity: str) -> bool:
    return severity in (DEBUG, INFO)


def entry(severity: str, message: str) -> str:
    """One structured log line, as GKE's agent reads it."""
    return json.dumps({"severity": severity, "message": message})


class Writer:
    """Writes the lines of a stream at their severity to two file descriptors (stdout, stderr).
    Thread-safe: `close` may come from another thread than `line`. Keeps going when a destination
    is gone, so the program writing is never blocked on a full pipe."""

    def __init__(self, out_fd: int, err_fd: int, log_format: str = PLAIN):
        if log_format not in (PLAIN, JSON):
            raise ValueError(f"log format {log_format!r}: plain or json")
        self.out_fd, self.err_fd, self.log_format = out_fd, err_fd, log_format
        self.previous: str | None = None
        self.held: list[str] = []  # a traceback being read, JSON only
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        """One line, without its line ending."""
        with self.lock:
            severity = classify(text, self.previous)
            self.previous = severity
            if self.log_format == PLAIN:
                self._write(severity, text + "\n")
                return
            if self.held:
                self.held.append(text)
                if text[:1] not in (" ", "\t") and text.strip():  # the exception's own line ends it
                    self._flush_held()
                return
            if text.startswith(TRACEBACK):
                self.held.append(text)
                return
            self._write(severity, entry(severity, text) + "\n")

    def entry(self, severity: str, message: str) -> None:
        """One line of the runner's own, at `severity`, in this writer's format."""
        with self.lock:
            self._write(severity, (entry(severity, message) if self.log_format == JSON else message) + "\n")

    def close(self) -> None:
        """Writes what is held (a traceback cut short: the program died while printing it)."""
        with self.lock:
            self._flush_held()

    def _flush_held(self) -> None:
        if self.held:
            self._write(ERROR, entry(ERROR, "\n".join(self.held)) + "\n")
            self.held = []

    def _write(self, severity: str, text: str) -> None:
        fd = self.out_fd if is_stdout_severity(severity) else self.err_fd
        data = memoryview(text.encode("utf-8", errors="surrogateescape" if self.log_format == PLAIN else "replace"))
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            pass


def decode(raw: bytes) -> str:
    """A line as read from a pipe, without its line ending; bytes that are not UTF-8 survive a
    plain write unchanged."""
    return raw.rstrip(b"\r\n").decode("utf-8", errors="surrogateescape")
