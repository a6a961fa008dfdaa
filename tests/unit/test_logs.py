"""The known-harmless lines, and only those, are recognised and dropped: by the runtime's
supervisors (trainer.process.relay.Filter, which trainer.run and trainer.launch use) and, while TensorFlow
is imported, by the prediction server (serving.quiet_tensorflow); and Keras' progress lines are
told from the rest."""

import ast
import os
import re
import shlex
import threading

import pytest

from helpers import REPO
from serving import quiet_tensorflow
from trainer.process import relay

REAL_LINES = [
    "W0000 00:00:1795377681.420217   13677 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized "
    "because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.\n",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1795603049.981445       6 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n",
]
# A ParameterServerStrategy job's ps as the coordinator's last steps end, in a JobSet rehearsal
# that succeeded (CI, tensorflow-cpu 2.21.0): a line of the job's end, not of loading TensorFlow.
STEP_CLEANUP_LINE = ("W0000 00:00:1795957213.403846      91 local_rendezvous.cc:412] Local rendezvous is aborting with "
                     "status: ABORTED: Cleanup -2365506128431408434 [type.googleapis.com/tensorflow.DerivedStatus='']\n")


def test_the_runtimes_harmless_lines_are_recognised():
    assert all(relay.is_harmless(line) for line in [*REAL_LINES, STEP_CLEANUP_LINE])


def test_other_warnings_and_errors_are_kept():
    for line in ("W0000 00:00:1.0 1 op_kernel.cc:1780] OP_REQUIRES failed at xla_ops.cc:296 : UNIMPLEMENTED",
                 "cassava.task: error: lost worker-0 of this multi_worker_mirrored job",
                 "F0000 00:00:1.0 1 dataset.cc:12] Check failed: GeneratorDataset",
                 "W0000 00:00:1.0 1 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
                 "UNAVAILABLE: Connection reset by peer",
                 "W0000 00:00:1.0 1 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
                 "ABORTED: Stopping remaining executors"):
        assert not relay.is_harmless(line)


# What a ParameterServerStrategy job's worker and ps print as the coordinator connects, with
# TF_CPP_MIN_LOG_LEVEL=0 (tensorflow-cpu 2.21.0): one INFO line, then a ConfigProto without a prefix.
SESSION_OPTIONS = """I0000 00:00:1795706068.037402   26711 eager_service_impl.cc:355] SessionOptions: goo.gle/debugproto   
device_count {
  key: "CPU"
  value: 1
}
gpu_options {
  experimental {
  }
}
allow_soft_placement: true
experimental {
  collective_group_leader: "/job:ps/replica:0/task:0"
}

""".splitlines()


def kept(lines: list[str]) -> list[str]:
    lines_filter = relay.Filter()
    return [line for line in lines if lines_filter.keep(line)]


def test_the_session_options_dump_is_left_out_whole_and_what_follows_it_kept():
    after = ["I0000 00:00:1.0 1 grpc_server_lib.cc:467] Started server with target: grpc://localhost:1", "worker says hi"]
    assert kept(["before", *SESSION_OPTIONS, *after]) == ["before", *after]


def test_a_dump_cut_short_ends_at_the_next_message_and_a_block_never_swallows_the_rest():
    cut_short = SESSION_OPTIONS[:4] + ["Traceback (most recent call last):", '  File "x.py", line 1']
    assert kept(cut_short) == cut_short[4:]
    endless = SESSION_OPTIONS[:1] + [f"field_{n} {{" for n in range(relay.MAX_BLOCK_LINES + 5)]
    assert kept(endless) == endless[relay.MAX_BLOCK_LINES:]


@pytest.mark.parametrize("line, progress", [
    ("Epoch 3/10", True),
    ("\r1/4 [======>.......................] - ETA: 0s - loss: 1.3093\b\b\b", True),  # tf-keras, verbose 1
    ("4/4 - 0s - loss: 1.1501 - 6ms/epoch - 2ms/step", True),  # tf-keras, verbose 2
    ("\r\x1b[1m1/4\x1b[0m \x1b[32m\u2501\u2501\u2501\x1b[0m\x1b[37m\u2501\u2501\x1b[0m \x1b[1m0s\x1b[0m", True),  # Keras 3, verbose 1
    ("4/4 - 0s - 6ms/step - loss: 0.8049", True),  # Keras 3, verbose 2
    ("epoch 1/3: loss 0.2 (2 replicas)", False),
    ("12/50 files read", False),
    ("12:00:01 trainer: epoch 1/3 ends: loss=0.2", False),
])
def test_keras_progress_lines_are_told_from_the_rest(line, progress):
    assert relay.is_progress(line) == progress


def test_a_known_failure_is_recognised_in_tensorflows_line_and_others_are_not():
    line = ("tensorflow.python.framework.errors_impl.InvalidArgumentError: {{function_node __wrapped__IteratorGetNextAsOptional}} "
            "Could not apply FILE based sharding: the dataset only has 1 file(s), which is not enough for the required 2 "
            "shards/workers.")
    assert relay.known_failure(line).startswith("the dataset has fewer files than the job has workers")
    assert relay.known_failure("ValueError: Could not interpret optimizer identifier") is None


def test_the_servers_load_time_lines_are_the_runtimes_harmless_ones():
    """serving/ cannot import trainer/ (the prediction image carries serving/ alone): its list is
    its own, and must leave out nothing the runtime would keep."""
    assert all(relay.is_harmless(line) for line in quiet_tensorflow.HARMLESS_LINES)


def test_nothing_in_the_runtime_forks_the_training_process():
    """trainer.run is the one stderr relay, a parent of the training process: no module of the
    runtime forks inside it (which put a rule on every user: import TensorFlow late)."""
    forks = []
    for path in sorted((REPO / "trainer").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty"):
                forks.append(f"{path.name}:{node.lineno}")
    assert forks == []


def copied(chunks: list[bytes]) -> bytes:
    """What the server's copier (serving.quiet_tensorflow) passes on when `chunks` are written to
    its pipe one by one."""
    source_read, source_write = os.pipe()
    sink_read, sink_write = os.pipe()
    copier = threading.Thread(target=quiet_tensorflow.copy_without_harmless, args=(source_read, sink_write))
    copier.start()
    for chunk in chunks:
        os.write(source_write, chunk)
    os.close(source_write)
    copier.join()
    os.close(sink_write)
    with os.fdopen(sink_read, "rb") as sink:
        return sink.read()


def test_the_copier_copies_whole_lines_and_leaves_out_the_harmless_ones():
    real = b"W0000 00:00:1.0 1 op_kernel.cc:1780] OP_REQUIRES failed at xla_ops.cc:296 : UNIMPLEMENTED\n"
    harmless = [line.encode() for line in REAL_LINES[1:]]  # the load-time lines
    # A line split across writes is matched whole; a last line without a newline is kept.
    assert copied([harmless[0][:20], harmless[0][20:] + real[:10], real[10:], *harmless[1:], b"Fatal: no newline"]
                  ) == real + b"Fatal: no newline"


def test_the_copier_keeps_bytes_that_are_not_utf8_as_they_are():
    assert copied([b"\xff\xfe raw bytes\n"]) == b"\xff\xfe raw bytes\n"


def test_the_copier_keeps_draining_when_its_destination_is_gone(monkeypatch):
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
            quiet_tensorflow.copy_without_harmless(source_read, sink_write)
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
def test_the_images_hide_tensorflows_info_lines(dockerfile):
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")
    environment = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            environment.update(item.split("=", 1) for item in shlex.split(re.sub(r"\$\w+", "", line[4:])))
    assert environment.get("TF_CPP_MIN_LOG_LEVEL") == "1"  # INFO hidden, warnings kept
