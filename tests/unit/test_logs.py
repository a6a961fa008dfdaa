"""The known-harmless lines, and only those, are recognised and dropped."""

import logging

from trainer import logs

REAL_LINES = [
    "W0000 00:00:1795377681.420217   13677 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized "
    "because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.\n",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
]


def test_the_runtimes_harmless_lines_are_recognised():
    assert all(logs.is_harmless(line) for line in REAL_LINES)


def test_other_warnings_and_errors_are_kept():
    for line in ("W0000 00:00:1.0 1 op_kernel.cc:1780] OP_REQUIRES failed at xla_ops.cc:296 : UNIMPLEMENTED",
                 "trainer.task: error: lost worker-0 of this multi_worker_mirrored job",
                 "F0000 00:00:1.0 1 dataset.cc:12] Check failed: GeneratorDataset"):
        assert not logs.is_harmless(line)


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

