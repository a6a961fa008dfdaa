"""The known-harmless lines, and only those, are recognised and dropped."""

import logging
import os
import re
import shlex
import threading

import pytest

from helpers import REPO
from trainer import logs, relay

REAL_LINES = [
    "W0000 00:00:1795377681.420217   13677 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized "
    "because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.\n",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1795603049.981445       6 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n",
]


def test_the_runtimes_harmless_lines_are_recognised():
    assert all(relay.is_harmless(line) for line in REAL_LINES)


def test_other_warnings_and_errors_are_kept():
    for line in ("W0000 00:00:1.0 1 op_kernel.cc:1780] OP_REQUIRES failed at xla_ops.cc:296 : UNIMPLEMENTED",
                 "cassava.task: error: lost worker-0 of this multi_worker_mirrored job",
                 "F0000 00:00:1.0 1 dataset.cc:12] Check failed: GeneratorDataset"):
        assert not relay.is_harmless(line)


def test_the_keras_false_alarm_is_dropped_and_other_tensorflow_warnings_kept(caplog):
    logs.configure()
    keras_log = logging.getLogger("tensorflow")
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        keras_log.warning("Callback method `on_train_batch_end` is slow compared to the batch time (batch time: "
                          "0.0404s vs `on_train_batch_end` time: 0.0549s). Check your callbacks.")
        keras_log.warning("Callback method `on_train_batch_begin` is slow compared to the batch time")
        keras_log.warning("Your input ran out of data")
    assert [r.getMessage() for r in caplog.records] == [
        "Callback method `on_train_batch_begin` is slow compared to the batch time", "Your input ran out of data"]



def copied(chunks: list[bytes]) -> bytes:
    """What copy_without_harmless passes on when `chunks` are written to its pipe one by one."""
    source_read, source_write = os.pipe()
    sink_read, sink_write = os.pipe()
    copier = threading.Thread(target=relay.copy_without_harmless, args=(source_read, sink_write))
    copier.start()
    for chunk in chunks:
        os.write(source_write, chunk)
    os.close(source_write)
    copier.join()
    os.close(sink_write)
    with os.fdopen(sink_read, "rb") as sink:
        return sink.read()


def test_the_relay_copies_whole_lines_and_leaves_out_the_harmless_ones():
    real = b"W0000 00:00:1.0 1 op_kernel.cc:1780] OP_REQUIRES failed at xla_ops.cc:296 : UNIMPLEMENTED\n"
    harmless = [line.encode() for line in REAL_LINES]
    # A line split across writes is matched whole; a last line without a newline is kept.
    assert copied([harmless[0][:20], harmless[0][20:] + real[:10], real[10:], *harmless[1:], b"Fatal: no newline"]
                  ) == real + b"Fatal: no newline"


def test_the_relay_keeps_bytes_that_are_not_utf8_as_they_are():
    assert copied([b"\xff\xfe raw bytes\n"]) == b"\xff\xfe raw bytes\n"


def test_the_relay_keeps_draining_when_its_destination_is_gone(monkeypatch):
    source_read, source_write = os.pipe()
    sink_read, sink_write = os.pipe()
    os.close(sink_read)  # writes to sink_write now fail (EPIPE)
    attempts, outcome = [], []
    real_write = os.write

    def counting_write(fd, data):
        if fd == sink_write:
            attempts.append(len(data))
        return real_write(fd, data)

    def copy():
        try:
            relay.copy_without_harmless(source_read, sink_write)
            outcome.append("returned")
        except BaseException as error:  # a thread's exception is otherwise only printed
            outcome.append(repr(error))

    monkeypatch.setattr(os, "write", counting_write)
    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    # Far more than a pipe holds: a copier that stopped reading would block this loop (the pytest
    # timeout then fails the test instead of hanging it).
    for _ in range(200):
        real_write(source_write, b"x" * 1000 + b"\n")
    os.close(source_write)
    copier.join()
    os.close(sink_write)
    # It read to the end of the source (only then does it return), raised nothing, and tried the
    # gone destination once, not once per line.
    assert outcome == ["returned"]
    assert len(attempts) == 1


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_images_hide_tensorflows_info_lines_and_relay_the_trainers_stderr(dockerfile):
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")
    environment = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            environment.update(item.split("=", 1) for item in shlex.split(re.sub(r"\$\w+", "", line[4:])))
    assert environment.get("TF_CPP_MIN_LOG_LEVEL") == "1"  # INFO hidden, warnings kept
    assert environment.get(relay.RELAY_VARIABLE) == "1"


def test_only_a_set_variable_asks_for_the_relay(monkeypatch):
    calls = []
    monkeypatch.setattr(relay, "relay_stderr", lambda: calls.append(True))
    for value, relays in (("1", True), ("0", False), ("", False), (None, False)):
        calls.clear()
        relay.relay_stderr_if_asked({} if value is None else {relay.RELAY_VARIABLE: value})
        assert bool(calls) == relays, value
