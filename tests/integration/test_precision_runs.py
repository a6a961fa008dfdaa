"""--mixed-precision and --jit-compile change what trains, and never what is exported: read from
the train step's graph in the TensorBoard logs, XLA's own dump and the exported graph, in real
single-process cassava.task runs (multi-worker and parameter-server jobs are checked in
test_mwms.py and test_parameter_server.py)."""

from __future__ import annotations

import os

from helpers import clean_env, run_module, saved_model_op_dtypes, train_graph_op_dtypes

SMALL_RUN = ["--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2", "--image-size", "32",
             "--architecture", "small", "--weights", "none", "--per-replica-batch-size", "4"]


def train(tmp_path, data_root, *args, env=None):
    result = run_module("cassava.task", *SMALL_RUN, "--data-dir", str(data_root), "--model-dir", str(tmp_path / "model"),
                        *args, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    # Every export computes in float32, whatever the policy trained in.
    assert saved_model_op_dtypes(tmp_path / "model") == FLOAT32_EXPORT
    return result.stdout, train_graph_op_dtypes(tmp_path / "logs" / "train")


FLOAT32_EXPORT = {"Conv2D": ["float32"], "MatMul": ["float32"], "Softmax": ["float32"]}


def test_off_trains_in_float32_without_xla(tmp_path, data_root):
    dump = tmp_path / "xla"
    log, dtypes = train(tmp_path, data_root, "--mixed-precision", "off",
                        env=clean_env(XLA_FLAGS=f"--xla_dump_to={dump}"))
    assert "trainer: precision: float32 (--mixed-precision off)" in log
    assert dtypes["Conv2D"] == dtypes["Conv2DBackpropFilter"] == dtypes["Softmax"] == ["float32"]
    assert not dump.exists() or os.listdir(dump) == []  # nothing was compiled by XLA


def test_bfloat16_with_jit_compile_computes_convolutions_in_bfloat16_under_xla(tmp_path, data_root):
    dump = tmp_path / "xla"
    log, dtypes = train(tmp_path, data_root, "--mixed-precision", "bfloat16", "--jit-compile",
                        env=clean_env(XLA_FLAGS=f"--xla_dump_to={dump}"))
    assert "trainer: precision: mixed_bfloat16 (--mixed-precision bfloat16)" in log
    assert dtypes["Conv2D"] == dtypes["Conv2DBackpropFilter"] == ["bfloat16"]
    assert dtypes["Softmax"] == ["float32"]  # the head's softmax stays float32 for a stable loss
    # XLA dumped the modules it compiled; the forward and backward pass (trainer.loop) is one of them.
    assert any("forward_backward" in name for name in os.listdir(dump)), sorted(os.listdir(dump))[:10]


def test_float16_without_a_fast_path_warns_once_then_trains(tmp_path, data_root):
    log, dtypes = train(tmp_path, data_root, "--mixed-precision", "float16")
    if "no fast path" not in log:  # this machine has a GPU with tensor cores: nothing to warn about
        assert "precision: mixed_float16" in log
    else:
        assert log.count("no fast path") == 1
        assert "Mixed precision compatibility check" not in log  # Keras' own three-line version
    assert dtypes["Conv2D"] == dtypes["Conv2DBackpropFilter"] == ["float16"] and dtypes["Softmax"] == ["float32"]


def test_auto_gives_every_task_of_a_job_the_same_policy_from_one_agreed_measurement(tmp_path, data_root):
    """Each task measures its own CPU; the all-reduced mean decides, so both tasks print the
    same figures and the same policy (on a CPU without bfloat16 instructions neither measures)."""
    import re

    from trainer import precision

    result = run_module("trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--", "python", "-m", "cassava.task", *SMALL_RUN,
                        "--data-dir", str(data_root), "--model-dir", str(tmp_path / "model"))
    assert result.returncode == 0, result.stdout[-4000:]
    lines = dict(re.findall(r"^\[(chief-0|worker-0)\] \S+ trainer: precision: (.*)$", result.stdout, re.M))
    assert set(lines) == {"chief-0", "worker-0"}, result.stdout[-3000:]
    assert lines["chief-0"] == lines["worker-0"]
    with open("/proc/cpuinfo") as cpuinfo:
        native = precision.local_devices([]).bfloat16_native and cpuinfo.read()
    assert ("timed this task's model" in lines["chief-0"]) == bool(native), lines
