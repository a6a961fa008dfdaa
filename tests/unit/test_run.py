"""trainer.run's pure parts: the environment a user's command gets on each platform, the severity
of each stderr line, how it is written, and the exit code."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from trainer import cluster
from trainer.process import command, relay, severity

REDUCER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"


def tf_config_of(environ: dict) -> dict | None:
    value = command.child_environment(environ).get("TF_CONFIG")
    return None if value is None else json.loads(value)


# --- TF_CONFIG per platform shape -----------------------------------------------------------------

def test_no_cluster_gives_no_tf_config():
    assert tf_config_of({"HOSTNAME": "laptop"}) is None
    assert tf_config_of({"TF_CONFIG": "{}"}) is None  # `{}` is said to TensorFlow as nothing at all


def test_vertex_cluster_spec_alone_becomes_a_tf_config():
    spec = {"cluster": {"workerpool0": ["cmle-training-workerpool0-1-0:2222"],
                        "workerpool1": ["cmle-training-workerpool1-1-0:2222"]},
            "environment": "cloud", "task": {"type": "workerpool1", "index": 0}}
    assert tf_config_of({"CLUSTER_SPEC": json.dumps(spec)}) == {
        "cluster": {"chief": ["cmle-training-workerpool0-1-0:2222"], "worker": ["cmle-training-workerpool1-1-0:2222"]},
        "task": {"type": "worker", "index": 0}}


def test_vertex_reducers_are_left_out_of_the_cluster():
    job = {"workerPoolSpecs": [{}, {}, {"containerSpec": {"imageUri": REDUCER_IMAGE}}]}
    config = {"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], "ps": ["r0:2222", "r1:2222"]},
              "task": {"type": "worker", "index": 0}, "job": job}
    assert tf_config_of({"TF_CONFIG": json.dumps(config)}) == {
        "cluster": {"chief": ["c:2222"], "worker": ["w:2222"]}, "task": {"type": "worker", "index": 0}}


def test_ai_platform_master_becomes_chief():
    config = {"cluster": {"master": ["m:2222"], "worker": ["w:2222"]}, "task": {"type": "master", "index": 0}}
    assert tf_config_of({"TF_CONFIG": json.dumps(config)})["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize("chief_name", ["Chief", "Master"])
def test_tfjob_replica_names_become_tensorflows(chief_name):
    config = {"cluster": {chief_name: ["job-chief-0:2222"], "Worker": ["job-worker-0:2222"]},
              "task": {"type": "Worker", "index": 0}}
    assert tf_config_of({"TF_CONFIG": json.dumps(config)}) == {
        "cluster": {"chief": ["job-chief-0:2222"], "worker": ["job-worker-0:2222"]}, "task": {"type": "worker", "index": 0}}


def test_a_jobset_pod_gets_the_tf_config_its_variables_describe():
    environ = {"JOBSET_NAME": "mine", "JOBSET_REPLICATED_JOB": "worker", "JOBSET_JOB_INDEX": "0",
               "JOBSET_PODS": "chief=1,worker=2", "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "mine-worker-0-1"}
    assert tf_config_of(environ) == {
        "cluster": {"chief": ["mine-chief-0-0.mine:2222"], "worker": ["mine-worker-0-0.mine:2222", "mine-worker-0-1.mine:2222"]},
        "task": {"type": "worker", "index": 1}}


def test_the_evaluator_keeps_a_tf_config_naming_itself_beside_the_training_cluster():
    spec = {"cluster": {"workerpool0": ["c:2222"], "workerpool1": ["w:2222"], "workerpool3": ["e:2222"]},
            "task": {"type": "workerpool3", "index": 0}}
    assert tf_config_of({"CLUSTER_SPEC": json.dumps(spec)}) == {
        "cluster": {"chief": ["c:2222"], "worker": ["w:2222"]}, "task": {"type": "evaluator", "index": 0}}


def test_an_unusable_cluster_raises_one_line():
    with pytest.raises(cluster.ClusterConfigError) as error:
        command.child_environment({"TF_CONFIG": '{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 3}}'})
    assert "\n" not in str(error.value) and "out of range" in str(error.value)


def test_the_rest_of_the_environment_is_passed_on():
    env = command.child_environment({"PATH": "/bin", "MY_FLAG": "1"})
    assert env["PATH"] == "/bin" and env["MY_FLAG"] == "1"


@pytest.mark.parametrize("command, expected", [
    (["python", "task.py"], [sys.executable, "task.py"]),
    (["python3", "-m", "pkg.train"], [sys.executable, "-m", "pkg.train"]),
    (["/usr/bin/python3", "task.py"], ["/usr/bin/python3", "task.py"]),  # a path is the user's choice
    (["bash", "-c", "python task.py"], ["bash", "-c", "python task.py"]),
    (["python3.11", "task.py"], ["python3.11", "task.py"]),
])
def test_python_in_a_command_is_the_runtimes_own_interpreter(command, expected):
    assert relay.with_this_python(command) == expected


# --- the model directory left empty ------------------------------------------------------------

def test_an_exit_0_of_the_saving_task_that_left_the_model_directory_empty_is_one_warning(tmp_path):
    empty, missing, saved = tmp_path / "empty", tmp_path / "missing", tmp_path / "saved"
    empty.mkdir()
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"x")
    warning = command.empty_model_warning(0, str(empty))
    assert warning == (f"trainer.run: warning: the command exited 0 and left the model directory empty "
                       f"(AIP_MODEL_DIR={empty}); save the trained model there: Vertex AI makes a Model from that "
                       "directory only")
    assert command.empty_model_warning(0, str(missing)) is not None
    assert command.empty_model_warning(0, str(saved)) is None
    assert command.empty_model_warning(1, str(empty)) is None  # a failure says so itself
    assert command.empty_model_warning(0, None) is None  # a worker, or no model directory in the environment


def test_a_gs_model_directory_is_looked_at_through_cloud_storage_fuse_where_it_is_mounted(tmp_path):
    fuse = tmp_path / "gcs"
    (fuse / "bucket" / "job" / "model").mkdir(parents=True)
    assert command.left_empty("gs://bucket/job/model", str(fuse)) is True
    (fuse / "bucket" / "job" / "model" / "saved_model.pb").write_bytes(b"x")
    assert command.left_empty("gs://bucket/job/model/", str(fuse)) is False
    assert command.left_empty("gs://bucket/job/other", str(fuse)) is True
    assert command.left_empty("gs://unmounted/job/model", str(fuse)) is None  # cannot look: no word
    assert command.empty_model_warning(0, "gs://unmounted/job/model", str(fuse)) is None
    assert command.left_empty("s3://bucket/model", str(fuse)) is None


def test_a_warning_of_the_runner_is_written_at_its_severity():
    read_out, write_out = os.pipe()
    read_err, write_err = os.pipe()
    for log_format, expected in ((severity.PLAIN, b"trainer.run: warning: x\n"),
                                 (severity.JSON, b'{"severity": "WARNING", "message": "trainer.run: warning: x"}\n')):
        writer = severity.Writer(write_out, write_err, log_format)
        writer.entry(severity.WARNING, "trainer.run: warning: x")
        writer.close()
        assert os.read(read_err, 1000) == expected
    for fd in (read_out, write_out, read_err, write_err):
        os.close(fd)


# --- output directories -------------------------------------------------------------------------

def test_vertex_output_directories_are_kept():
    environ = {"AIP_MODEL_DIR": "gs://b/job/model/", "AIP_CHECKPOINT_DIR": "gs://b/job/checkpoints/",
               "AIP_TENSORBOARD_LOG_DIR": "gs://b/job/logs/"}
    env = command.child_environment(environ)
    assert {k: env[k] for k in environ} == environ


def test_output_directories_default_beside_output_model_when_no_platform_sets_them():
    env = command.child_environment({})
    assert (env["AIP_MODEL_DIR"], env["AIP_CHECKPOINT_DIR"], env["AIP_TENSORBOARD_LOG_DIR"]) == (
        "output/model", "output/checkpoints", "output/logs")


def test_a_tuning_trial_writes_in_its_own_subdirectories():
    env = command.child_environment({"AIP_MODEL_DIR": "gs://b/job/model", "CLOUD_ML_TRIAL_ID": "7"})
    assert env["AIP_MODEL_DIR"] == "gs://b/job/model/trial-7"
    assert env["AIP_CHECKPOINT_DIR"] == "gs://b/job/checkpoints/trial-7"
    # Vertex AI's tuning already puts the trial in the path: nothing is added.
    vertex = command.child_environment({"AIP_MODEL_DIR": "gs://b/job/7/model", "CLOUD_ML_TRIAL_ID": "7"})
    assert vertex["AIP_MODEL_DIR"] == "gs://b/job/7/model"


# --- severity -----------------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("I1125 12:00:00.123456   4242 cpu_feature_guard.cc:210] This TensorFlow binary is optimized", "INFO"),
    ("W0000 00:00:1732530000.123456    42 gpu_device.cc:2344] Cannot dlopen some GPU libraries.", "WARNING"),
    ("E1125 12:00:00.123456 140 cuda_dnn.cc:8310] Unable to register cuDNN factory", "ERROR"),
    ("F1125 12:00:00.123456 140 check.cc:1] Check failed: x", "CRITICAL"),
    ("2024-11-25 12:00:00.123456: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.", "INFO"),
    ("2024-11-25 12:00:00.123456: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed", "WARNING"),
    ("WARNING:tensorflow:Using MirroredStrategy eagerly has significant overhead.", "WARNING"),
    ("INFO:tensorflow:Enabled multi-worker collective ops", "INFO"),
    ("WARNING:root:no name", "WARNING"),
    ("DEBUG:my.module:details", "DEBUG"),
    ("ERROR:absl:something failed", "ERROR"),
    ("/usr/lib/python3/x.py:12: UserWarning: this is deprecated", "WARNING"),
    ("Traceback (most recent call last):", "ERROR"),
    ("ValueError: boom", "ERROR"),
    ("Epoch 1/3", "ERROR"),  # unknown: as the platforms record stderr
    ("", "ERROR"),
])
def test_each_line_gets_its_severity(line, expected):
    assert severity.classify(line) == expected


def test_an_indented_line_continues_the_line_before():
    assert severity.classify("  warnings.warn('x')", previous="WARNING") == "WARNING"
    assert severity.classify('  File "task.py", line 3, in <module>', previous="ERROR") == "ERROR"
    assert severity.classify("  indented but first", previous=None) == "ERROR"


def written(log_format: str, lines: list[str], close: bool = True) -> tuple[str, str]:
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    writer = severity.Writer(out_write, err_write, log_format)
    for line in lines:
        writer.line(line)
    if close:
        writer.close()
    os.close(out_write)
    os.close(err_write)
    with os.fdopen(out_read) as out, os.fdopen(err_read) as err:
        return out.read(), err.read()


TRACEBACK = ["I1125 12:00:00.123456 1 a.cc:1] starting", "Traceback (most recent call last):",
             '  File "task.py", line 9, in <module>', "    main()", "ValueError: no data",
             "WARNING:tensorflow:after"]


def test_plain_sends_info_to_stdout_and_keeps_the_rest_on_stderr_unchanged():
    out, err = written(severity.PLAIN, TRACEBACK)
    assert out == "I1125 12:00:00.123456 1 a.cc:1] starting\n"
    assert err == "\n".join(TRACEBACK[1:]) + "\n"


def test_json_writes_one_entry_per_line_and_a_traceback_as_one_entry():
    out, err = written(severity.JSON, TRACEBACK)
    assert [json.loads(line) for line in out.splitlines()] == [
        {"severity": "INFO", "message": "I1125 12:00:00.123456 1 a.cc:1] starting"}]
    assert [json.loads(line) for line in err.splitlines()] == [
        {"severity": "ERROR", "message": "\n".join(TRACEBACK[1:5])},
        {"severity": "WARNING", "message": "WARNING:tensorflow:after"}]


def test_json_writes_a_traceback_cut_short_when_closed():
    out, err = written(severity.JSON, TRACEBACK[:4], close=False)
    assert err == ""  # held until it ends ...
    out, err = written(severity.JSON, TRACEBACK[:4])
    assert json.loads(err) == {"severity": "ERROR", "message": "\n".join(TRACEBACK[1:4])}  # ... or input does


def test_log_format_auto_is_json_in_a_kubernetes_pod_only():
    assert command.log_format("auto", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "json"
    assert command.log_format("auto", {"CLOUD_ML_JOB_ID": "1"}) == "plain"
    assert command.log_format("plain", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "plain"


# --- exit codes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("returncode, terminated, expected", [
    (0, False, 0),
    (3, False, 3),
    (2, False, 2),
    (-signal.SIGTERM, False, 143),
    (-signal.SIGKILL, False, 137),
    (-signal.SIGSEGV, False, 139),
    (1, True, 143),  # a script that caught SIGTERM and exited 1 was still stopped
    (-signal.SIGKILL, True, 143),
    (0, True, 0),  # one that finished in its grace period finished
])
def test_exit_status_follows_the_contract(returncode, terminated, expected):
    assert command.exit_status(returncode, terminated) == expected


def test_no_command_is_one_line_and_exit_2(capsys):
    assert command.main(["--log-format", "plain"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        command.main(["--log-format", "xml", "--", "python", "task.py"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m trainer.run: error: argument --log-format: invalid choice: 'xml' (choose from 'auto', 'plain', 'json') "
        "(--help lists the flags)"]


KERAS_FIT_DUMP = """Traceback (most recent call last):
  File "/app/clicks.py", line 58, in <module>
    model.fit(train, epochs=3, steps_per_epoch=20, verbose=2)
  File "/opt/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
    raise e.with_traceback(filtered_tb) from None
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: Attempt to convert a value ({'numeric': PerReplica:{
  0: <tf.Tensor: shape=(32, 3), dtype=float32, numpy=
array([[ 0.12573022, -0.13210486,  0.64042264],
       [ 0.10490011, -0.5356694 ,  0.36159506]], dtype=float32)>
}}) with an unsupported type (<class 'dict'>) to a Tensor.
""".splitlines(keepends=True)


def feed_all(tracebacks, lines):
    written = []
    for line in lines:
        written += tracebacks.feed(line)
    return written + tracebacks.flush()


def test_keras_fit_across_workers_is_one_line_without_its_traceback_or_batch():
    from trainer.process import relay

    tracebacks = relay.Tracebacks()
    before = ["I0000 port.cc:153] oneDNN custom operations are on.\n", "Epoch 1/3\n"]
    written = feed_all(tracebacks, before + KERAS_FIT_DUMP)
    assert written == before  # what came before the traceback, as it came; nothing of the dump
    assert tracebacks.found == relay.KERAS_FIT_ACROSS_WORKERS and "keras-team/keras#20585" in tracebacks.found
    assert "trainer.loop.fit_model" in tracebacks.found and "\n" not in tracebacks.found


def test_any_other_traceback_is_written_whole_and_in_order():
    from trainer.process import relay

    other = ["Traceback (most recent call last):\n", '  File "task.py", line 3, in <module>\n', "    open('x')\n",
             "FileNotFoundError: [Errno 2] No such file or directory: 'x'\n", "after\n"]
    tracebacks = relay.Tracebacks()
    assert feed_all(tracebacks, other) == other and tracebacks.found is None
    # A traceback the stream ends inside (the process was killed) is written out at the end.
    cut = relay.Tracebacks()
    assert feed_all(cut, other[:2]) == other[:2]


def test_a_commands_python_gets_the_runtime_then_the_exit_hook_after_its_own_paths():
    env = command.child_environment({"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/mine", command.RUNTIME_ROOT, command.EXIT_HOOK]
    assert os.path.isfile(os.path.join(command.EXIT_HOOK, "sitecustomize.py"))
    assert sorted(os.listdir(command.EXIT_HOOK)) in (["sitecustomize.py"], ["__pycache__", "sitecustomize.py"])
