"""ParameterServerStrategy jobs with real processes, and the failures users meet."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from helpers import FLOAT32, REPO, clean_env, launch_until, run_module, saved_model_op_dtypes, served_predictions, trained_model_policies
from quiet_end import errors_after_training

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "8", *FLOAT32]


def launcher_args(tmp_path, data_root, *task_args, workers=2, ps=1, evaluator=False):
    return ["--workers", str(workers), "--ps", str(ps), *(["--evaluator"] if evaluator else []),
            "--work-dir", str(tmp_path / "work"), "--timeout", "540", "--", "python", "-m", "cassava.task",
            "--data-dir", str(data_root), "--dataset", "synthetic:64", *SMALL_RUN,
            "--model-dir", str(tmp_path / "out" / "model"), *task_args]


def chief_epochs_begun(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^\[chief-0\] .*trainer: epoch (\d+)/\d+ begins$", output, re.M)]


def task_pids(output: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in re.findall(r"^\[launch\] started (\S+) \(pid (\d+)\)$", output, re.M)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes; only a running process counts.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def ps_job(tmp_path_factory, data_root):
    tmp_path = tmp_path_factory.mktemp("ps")
    result = run_module("trainer.launch", *launcher_args(tmp_path, data_root, "--epochs", "2", "--mixed-precision", "bfloat16",
                                                         evaluator=True), timeout=600)
    return result, tmp_path


def test_chief_two_workers_ps_and_evaluator_complete(ps_job):
    result, _ = ps_job
    assert result.returncode == 0, result.stdout[-4000:]
    assert "strategy=parameter_server workers=2 ps=1" in result.stdout
    assert re.search(r"^\[worker-1\] .*serving as worker-1", result.stdout, re.M)


def test_a_healthy_job_ends_without_an_error_line_in_any_task(ps_job):
    result, _ = ps_job
    assert errors_after_training(result.stdout) == [], result.stdout[-4000:]


def test_model_is_saved_and_loads(ps_job):
    _, tmp_path = ps_job
    script = f"""
import tensorflow as tf
model = tf.saved_model.load({str(tmp_path / 'out' / 'model')!r})
print("shape", model.signatures["serving_pixels"](image=tf.zeros((2, 32, 32, 3), tf.uint8))["probabilities"].shape)
"""
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert "shape (2, 5)" in loaded.stdout, loaded.stderr[-2000:]


def test_the_unsharded_export_serves_jpeg_bytes_with_class_names(ps_job):
    _, tmp_path = ps_job
    served = served_predictions(tmp_path / "out" / "model", count=3)
    cassava = ["cbb", "cbsd", "cgm", "cmd", "healthy"]
    assert len(served["class_name"]) == 3 and served["class_name"] == [cassava[i] for i in served["class_index"]]


def test_coordinator_uses_the_policy_asked_for_and_the_export_is_float32(ps_job):
    """The coordinator builds the model whose step every worker runs; the evaluator and the export
    rebuild the model from a checkpoint in float32."""
    result, tmp_path = ps_job
    assert re.search(r"^\[chief-0\] .*trainer: precision: mixed_bfloat16 ", result.stdout, re.M)
    assert not re.search(r"^\[evaluator-0\] .*trainer: precision: ", result.stdout, re.M)
    trained = trained_model_policies(tmp_path / "out" / "logs" / "train")
    assert trained["Conv2D"] == ["mixed_bfloat16"]
    assert trained["Dense"] == ["float32", "mixed_bfloat16"]  # the head; the softmax layer stays float32
    exported = saved_model_op_dtypes(tmp_path / "out" / "model")
    assert exported["Conv2D"] == exported["Softmax"] == ["float32"]


def test_checkpoints_exist_for_every_epoch(ps_job):
    _, tmp_path = ps_job
    files = set(os.listdir(tmp_path / "out" / "checkpoints"))
    assert {"checkpoint", "epoch-1.index", "epoch-2.index"} <= files


def test_evaluator_wrote_summaries_for_the_final_checkpoint(ps_job):
    result, tmp_path = ps_job
    assert re.search(r"^\[evaluator-0\] .*evaluator: evaluated the final checkpoint \(epoch 2\)", result.stdout, re.M)
    script = f"""
import glob, trainer, tensorflow as tf
steps = set()
for path in glob.glob({str(tmp_path / 'out' / 'logs' / 'eval')!r} + "/events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            if value.tag == "eval_accuracy":
                steps.add(event.step)
print("steps", sorted(steps))
"""
    read = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert "steps [" in read.stdout and "2]" in read.stdout, read.stdout + read.stderr[-2000:]


def test_all_processes_are_gone_afterwards(ps_job):
    result, _ = ps_job
    pids = task_pids(result.stdout)
    assert set(pids) == {"chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"}
    assert [name for name, pid in pids.items() if alive(pid)] == []


def test_job_survives_a_killed_worker(tmp_path, data_root):
    args = launcher_args(tmp_path, data_root, "--epochs", "3", "--steps-per-epoch", "60")
    code, output = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                             lambda so_far, _: os.kill(task_pids(so_far)["worker-0"], signal.SIGKILL))
    assert code == 0, output[-4000:]
    assert "[launch] worker-0 exited with code -9; restarting it (1/3)" in output
    assert chief_epochs_begun(output) == [1, 2, 3]
    assert (tmp_path / "out" / "model" / "saved_model.pb").exists()


def test_killed_coordinator_resumes_at_the_step_of_its_backup(tmp_path, data_root):
    """The coordinator backs up at step granularity too: killed without warning after a backup at
    epoch 2 step 20, the rerun starts there."""
    args = launcher_args(tmp_path, data_root, "--epochs", "3", "--steps-per-epoch", "60", "--backup-every-steps", "20")
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: backup saved in \d+\.\ds: a restart resumes at epoch 2 step 20$",
                               lambda so_far, _: os.kill(task_pids(so_far)["chief-0"], signal.SIGKILL))
    assert code == 137 and "chief-0 failed with exit code 137" in first  # 128 + SIGKILL, as a shell reports it
    assert not (tmp_path / "out" / "model" / "saved_model.pb").exists()

    second = run_module("trainer.launch", *args, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    resumed = re.search(r"^\[chief-0\] .*trainer: resumed from backup at epoch (\d+) step (\d+)$", second.stdout, re.M)
    assert resumed and (int(resumed.group(1)), int(resumed.group(2))) >= (2, 20), second.stdout[-3000:]
    assert chief_epochs_begun(second.stdout)[0] == 2
    assert (tmp_path / "out" / "model" / "saved_model.pb").exists()


def test_sigterm_to_the_coordinator_saves_where_it_is_and_exits_retryable(tmp_path, data_root):
    """A preempted coordinator waits for the steps it scheduled, backs up and exits 143; the rerun
    resumes at that step."""
    args = launcher_args(tmp_path, data_root, "--epochs", "3", "--steps-per-epoch", "60", "--backup-every-steps", "1000")
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                               lambda so_far, _: os.kill(task_pids(so_far)["chief-0"], signal.SIGTERM))
    stop = re.search(r"^\[chief-0\] cassava.task: preempted \(SIGTERM\): saved a backup; a restart resumes at "
                     r"epoch (\d+) step (\d+) \(exit 143\)$", first, re.M)
    assert code == 143 and stop, first[-3000:]
    second = run_module("trainer.launch", *args, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert re.search(rf"^\[chief-0\] .*trainer: resumed from backup at epoch {stop.group(1)} step {stop.group(2)}$",
                     second.stdout, re.M), second.stdout[-3000:]


def test_lost_ps_stops_the_coordinator_with_a_restart_message_and_rerun_resumes(tmp_path, data_root):
    args = launcher_args(tmp_path, data_root, "--epochs", "3", "--steps-per-epoch", "60", "--backup-every-steps", "0")
    code, first = launch_until(args, r"^\[chief-0\] .*trainer: epoch 2/3 begins$",
                            lambda so_far, _: os.kill(task_pids(so_far)["ps-0"], signal.SIGKILL))
    assert code == 143, first[-4000:]  # retryable: Kubeflow's ExitCode policy restarts it
    assert re.search(r"^\[chief-0\] cassava.task: error: lost a parameter server .* the coordinator must be "
                     r"restarted: a restart resumes at epoch 2 step 0 from .*/checkpoints/backup \(exit 143\)$", first, re.M)
    assert os.listdir(tmp_path / "out" / "checkpoints" / "backup")

    second = run_module("trainer.launch", *args, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert chief_epochs_begun(second.stdout)[0] == 2


def test_parameter_server_strategy_without_ps_is_a_one_line_error():
    tf_config = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}, "task": {"type": "chief", "index": 0}}
    result = run_module("cassava.task", "--strategy", "parameter_server", env=clean_env(TF_CONFIG=json.dumps(tf_config)), timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--strategy parameter_server needs ps tasks" in result.stderr


def test_evaluator_without_checkpoints_times_out_with_a_clear_message(tmp_path, data_root):
    tf_config = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}, "task": {"type": "evaluator", "index": 0}}
    result = run_module(
        "cassava.task", "--dataset", "synthetic:64", "--data-dir", str(data_root), *SMALL_RUN,
        "--checkpoint-dir", str(tmp_path / "never"), "--eval-timeout", "3", "--model-dir", str(tmp_path / "model"),
        env=clean_env(TF_CONFIG=json.dumps(tf_config)), timeout=300,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("cassava.task:")]
    assert errors == [f"cassava.task: error: evaluator: no new checkpoint in {tmp_path / 'never'} for 3s "
                      "(--eval-timeout); last evaluated epoch: none"]


IN_PROCESS_CLUSTER = textwrap.dedent("""
    import json, os, sys
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    import keras, tensorflow as tf
    from cassava import data, model as model_lib
    from trainer import loop
    from trainer.runtime import strategy as strategy_lib
    from trainer.cluster import resolve

    workers, ps = 2, 2
    # Servers and coordinator share one process: without enough inter-op threads on 2 cores,
    # the servers' ops starve each other and the first step never finishes.
    server_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
    from trainer.process.ports import free_ports
    ports = free_ports(workers + ps + 1)
    spec = {"chief": [f"localhost:{ports[0]}"],
            "worker": [f"localhost:{p}" for p in ports[1:1 + workers]],
            "ps": [f"localhost:{p}" for p in ports[1 + workers:]]}
    # Held in a list: a Server that is garbage-collected stops serving.
    servers = [tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index, protocol="grpc",
                                   config=server_config, start=True)
               for job in ("worker", "ps") for index in range(len(spec[job]))]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}})
    strategy = strategy_lib.create("parameter_server", resolve(os.environ))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    split = data.Split(name="train", num_examples=40, class_names=tuple("abcde"), files=tuple(sys.argv[1:]))
    options = data.PipelineOptions(image_size=32, per_replica_batch_size=4, training=True, cache=False)
    specs = []

    def dataset_fn(context):
        dataset = data.make_dataset(split, options, context)
        specs.append(dataset.element_spec)
        return dataset

    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))
    with strategy.scope():
        model = model_lib.build(5, 32, "none", "small")
        model.compile(optimizer=model_lib.optimizer(1e-3), loss=model_lib.LOSS, metrics=model_lib.metrics())
    steps = loop.Steps(strategy, model, steps_per_execution=2, coordinator=coordinator)
    steps.build(specs[0])
    print("devices:", json.dumps(sorted({v.value.device.split("/device")[0] for v in model.weights})))
    counted = []

    class Count(loop.Events):
        def epoch_end(self, epoch, logs):
            counted.append(int(model.optimizer.iterations.numpy()))

    original_results = steps.results

    def results():
        steps.wait()
        tracker = next(m for m in model.metrics if m.name == "loss")
        counted.append(float(tracker.count.numpy()))
        return original_results()

    steps.results = results
    history = loop.fit(steps, iter(per_worker), epochs=2, steps_per_epoch=10, callbacks=[Count()])
    print("losses:", json.dumps([round(logs["loss"], 4) for logs in history]))
    print("counted:", json.dumps(counted))
""")


def test_in_process_cluster_counts_every_step_and_example_of_two_workers_on_two_ps(tmp_path):
    """Two workers step at once against two parameter servers, each variable whole on one of them.
    Keras 3 reads and writes back its counters (Variable.assign_add); the loop adds metric
    increments and the optimizer's steps atomically, so nothing one worker counts is lost to the
    other's write: 10 steps of 4 examples are 40 examples an epoch, and the optimizer counts 10
    steps, then 20."""
    script_data = subprocess.run(
        [sys.executable, "-c", "import sys; from cassava import records, synthetic; "
         "print(' '.join(records.write_shards(synthetic.examples(40, 0, 'train'), sys.argv[1], 'train', 4)[0]))",
         str(tmp_path)], capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    files = script_data.stdout.split()
    assert len(files) == 4, script_data.stderr[-2000:]
    result = subprocess.run([sys.executable, "-c", IN_PROCESS_CLUSTER, *files], capture_output=True, text=True,
                            env=clean_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    devices = json.loads(re.search(r"^devices: (.*)$", result.stdout, re.M).group(1))
    assert devices == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    losses = json.loads(re.search(r"^losses: (.*)$", result.stdout, re.M).group(1))
    assert len(losses) == 2 and all(loss == loss and loss > 0 for loss in losses)
    # Per epoch: the loss tracker's example count when read, then the optimizer's steps at its end.
    assert json.loads(re.search(r"^counted: (.*)$", result.stdout, re.M).group(1)) == [40.0, 10, 40.0, 20]
