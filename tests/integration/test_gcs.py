"""gs:// end to end: real TensorFlow processes read and write a local Cloud Storage server
(scripts/rehearsal/local_gcs/) at Google's hostnames, through TensorFlow's own GCS client."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import FLOAT32, REPO, clean_env, run_module, write_image_folder

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4", *FLOAT32]


def relative_files(names, prefix: str) -> set[str]:
    """Object names under `prefix`, relative to it, with what differs between runs (host names,
    timestamps and pids in TensorBoard event files) replaced by *. A name ending in / is the
    zero-byte marker TensorFlow's makedirs writes for a directory."""
    out = set()
    for name in names:
        if not name.startswith(prefix) or name == prefix:
            continue
        rest = name[len(prefix):]
        out.add(re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", rest))
    return out


def local_files(root: Path) -> set[str]:
    """Files and directories (with a trailing /) under root, as relative_files names them."""
    return relative_files((str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*")), "")


@pytest.fixture(scope="module")
def prepared_bucket(gcs_server, tmp_path_factory):
    """A bucket holding what cassava.prepare wrote from an image folder (4 shards)."""
    gcs_server.create_bucket("cassava-data")
    folder = write_image_folder(tmp_path_factory.mktemp("images"))
    result = run_module("cassava.prepare", "--source", f"folder:{folder}", "--output", "gs://cassava-data/prepared",
                        "--shards", "4", env=clean_env(**gcs_server.environ()))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_prepare_writes_shards_and_dataset_json_into_the_bucket(prepared_bucket, gcs_server):
    names = gcs_server.list("cassava-data", "prepared/")
    assert [n for n in names if n.endswith(".tfrecord")] == [f"prepared/train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert "prepared/dataset.json" in names
    assert "40 examples in 4 files under gs://cassava-data/prepared" in prepared_bucket.stdout


@pytest.fixture(scope="module")
def vertex_style_runs(gcs_server, prepared_bucket, tmp_path_factory):
    """The same 2-worker job twice: outputs in a bucket through the AIP_* variables alone, as
    Vertex AI sets them, and outputs on local disk."""
    gcs_server.create_bucket("cassava-jobs")
    base = "gs://cassava-jobs/job-1"
    args = ["--dataset", "tfrecord:gs://cassava-data/prepared/train-*.tfrecord", "--epochs", "2", *SMALL_RUN]
    tmp = tmp_path_factory.mktemp("vertex-style")
    launch = ["trainer.launch", "--workers", "2", "--timeout", "500"]
    in_bucket = run_module(*launch, "--work-dir", str(tmp / "work-gcs"), "--", "python", "-m", "cassava.task", *args,
                           env=clean_env(**gcs_server.environ(), AIP_MODEL_DIR=f"{base}/model/",
                                         AIP_CHECKPOINT_DIR=f"{base}/checkpoints/", AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/"))
    local = tmp / "local"
    on_disk = run_module(*launch, "--work-dir", str(tmp / "work-local"), "--", "python", "-m", "cassava.task", *args,
                         env=clean_env(**gcs_server.environ(), AIP_MODEL_DIR=f"{local}/model/",
                                       AIP_CHECKPOINT_DIR=f"{local}/checkpoints/", AIP_TENSORBOARD_LOG_DIR=f"{local}/logs/"))
    return in_bucket, on_disk, local


def test_two_workers_train_from_the_bucket_with_file_sharding(vertex_style_runs):
    in_bucket, *_ = vertex_style_runs
    assert in_bucket.returncode == 0, in_bucket.stdout[-5000:]
    assert "replicas=2 global_batch=8" in in_bucket.stdout and "sharding=FILE" in in_bucket.stdout


def test_outputs_land_in_the_bucket_and_nothing_else(vertex_style_runs, gcs_server):
    in_bucket, on_disk, local = vertex_style_runs
    assert in_bucket.returncode == 0 and on_disk.returncode == 0, on_disk.stdout[-3000:]
    in_gcs = relative_files(gcs_server.list("cassava-jobs", "job-1/"), "job-1/")
    assert in_gcs == local_files(local)
    assert {"model/saved_model.pb", "checkpoints/epoch-2.index"} <= in_gcs
    assert any(fnmatch.fnmatch(name, "logs/train/events.out.tfevents.*") for name in in_gcs)


def test_the_export_holds_no_optimizer_state_and_the_log_gives_its_size_and_time(vertex_style_runs):
    import trainer  # noqa: F401
    import tensorflow as tf

    in_bucket, _, local = vertex_style_runs
    assert re.search(r"^\[chief-0\] .*trainer: exported gs://cassava-jobs/job-1/model/: \d+\.\d MB in \d+\.\ds$",
                     in_bucket.stdout, re.M), in_bucket.stdout[-3000:]
    from cassava import model as model_lib

    # The export stores the variables its signatures use, by position: exactly the model's weights,
    # each once (trainer.export), no optimizer slot or step counter beside them.
    names = [name for name, _ in tf.train.list_variables(str(local / "model" / "variables" / "variables"))]
    weights = model_lib.build(5, 32, "none", "small").weights
    assert len([name for name in names if name != "_CHECKPOINTABLE_OBJECT_GRAPH"]) == len(weights), names
    assert not [name for name in names if re.search("optimizer|iteration|adam|momentum", name, re.I)], names


def test_predict_reads_the_model_and_images_from_the_bucket(vertex_style_runs, gcs_server, tmp_path):
    import trainer  # noqa: F401
    import tensorflow as tf
    from cassava import synthetic

    rng = np.random.default_rng(3)
    env = clean_env(**gcs_server.environ())
    local_image = tmp_path / "leaf.jpg"
    local_image.write_bytes(tf.io.encode_jpeg(synthetic.make_image(rng, 3, size=(90, 120))).numpy())
    copy = subprocess_copy(local_image, "gs://cassava-jobs/images/leaf.jpg", env)
    assert copy.returncode == 0, copy.stderr[-2000:]
    result = run_module("serving.predict", "gs://cassava-jobs/job-1/model", str(local_image),
                        "gs://cassava-jobs/images/leaf.jpg", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [row[0] for row in rows] == [str(local_image), "gs://cassava-jobs/images/leaf.jpg"]
    # The same bytes, read from disk and from the bucket, get the same answer: the same class, and
    # probabilities equal up to float32 rounding (oneDNN's threads may sum in another order from
    # one call to the next: a busy machine's run differed by 6e-8).
    from_disk, from_bucket = json.loads(rows[0][1]), json.loads(rows[1][1])
    assert {k: v for k, v in from_disk.items() if k != "probabilities"} == \
        {k: v for k, v in from_bucket.items() if k != "probabilities"}
    assert from_disk["probabilities"] == pytest.approx(from_bucket["probabilities"], abs=1e-6)
    assert from_disk["class_name"] in synthetic.CLASS_NAMES


def subprocess_copy(source, destination: str, env):
    return subprocess.run([sys.executable, "-c", "import sys, tensorflow as tf; tf.io.gfile.copy(sys.argv[1], sys.argv[2], "
                           "overwrite=True)", str(source), destination], env=env, capture_output=True, text=True, timeout=120)


TFDS_TASK = """
import sys
import tensorflow_datasets as tfds
from cassava import prepare, task
main = prepare.main if sys.argv[1] == "prepare" else task.main
with tfds.testing.mock_data(num_examples=24):
    sys.exit(main(sys.argv[2:]))
"""


def test_tfds_cassava_with_a_bucket_data_dir_prepares_and_trains_without_tfds_public_bucket(gcs, tmp_path):
    gcs.create_bucket("tfds-job")
    buckets = set()
    gcs.on_request(lambda method, path: buckets.add(re.sub(r"^(/upload)?(/storage/v1/b)?/([^/?]+).*", r"\3", path)),
                   times=10**6)
    env = clean_env(**gcs.environ())
    prepared = subprocess.run([sys.executable, "-c", TFDS_TASK, "prepare", "--source", "tfds:cassava", "--data-dir",
                               "gs://tfds-job/tfds", "--output", "gs://tfds-job/prepared", "--shards", "2"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert {"prepared/dataset.json", "prepared/train-00000-of-00002.tfrecord"} <= set(gcs.list("tfds-job", "prepared/"))
    trained = subprocess.run([sys.executable, "-c", TFDS_TASK, "task", "--dataset", "tfds:cassava", "--data-dir",
                              "gs://tfds-job/tfds", "--epochs", "1", "--steps-per-epoch", "2", *SMALL_RUN,
                              "--model-dir", "gs://tfds-job/model"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "model/saved_model.pb" in gcs.list("tfds-job", "model/")
    # TFDS 4.9 keeps its public bucket (gs://tfds-data) switched off: no request for it, or any other.
    assert buckets == {"tfds-job"}, buckets


def test_a_tuning_trial_writes_under_its_trial_directory(gcs, data_root):
    gcs.create_bucket("hp-job")
    base = "gs://hp-job/study/7"  # Vertex AI sets AIP_* under BASE/<trial id>/ for a trial
    result = run_module("cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64", "--epochs", "1",
                        "--steps-per-epoch", "2", *SMALL_RUN,
                        env=clean_env(**gcs.environ(), CLOUD_ML_TRIAL_ID="7", AIP_MODEL_DIR=f"{base}/model/",
                                      AIP_CHECKPOINT_DIR=f"{base}/checkpoints/", AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/"))
    assert result.returncode == 0, result.stderr[-3000:]
    names = gcs.list("hp-job")
    assert names and all(name.startswith("study/7/") or name == "study/" for name in names), names
    assert {"study/7/model/saved_model.pb", "study/7/checkpoints/epoch-1.index"} <= set(names)


def test_parameter_server_job_with_evaluator_keeps_its_checkpoints_in_the_bucket(gcs, data_root, tmp_path):
    gcs.create_bucket("ps-job")
    result = run_module("trainer.launch", "--workers", "2", "--ps", "1", "--evaluator", "--work-dir", str(tmp_path / "work"),
                        "--timeout", "500", "--", "python", "-m", "cassava.task", "--data-dir", str(data_root), "--dataset", "synthetic:64",
                        "--epochs", "2", "--steps-per-epoch", "4", *SMALL_RUN, "--model-dir", "gs://ps-job/model",
                        env=clean_env(**gcs.environ()))
    assert result.returncode == 0, result.stdout[-5000:]
    assert "evaluator: evaluated the final checkpoint (epoch 2)" in result.stdout
    names = set(gcs.list("ps-job"))
    assert {"model/saved_model.pb", "checkpoints/epoch-2.index"} <= names
    assert any(name.startswith("logs/eval/events.out.tfevents.") for name in names), sorted(names)


def test_the_local_server_script_prints_exports_that_work_and_stops_cleanly(tmp_path):
    server = subprocess.Popen([sys.executable, "-m", "scripts.rehearsal.local_gcs", "--bucket", "script-bucket"], cwd=REPO,
                              env=clean_env(), stdout=subprocess.PIPE, text=True)
    try:
        exports = {}
        for line in server.stdout:
            if line.startswith("export "):
                key, _, value = line[len("export "):].strip().partition("=")
                exports[key] = value
            if "Ctrl-C" in line:
                break
        assert {"https_proxy", "no_proxy", "CURL_CA_BUNDLE"} <= set(exports)
        write = subprocess.run([sys.executable, "-c", "import tensorflow as tf; tf.io.gfile.makedirs('gs://script-bucket/a');"
                                "open('/dev/stdout', 'w').write(str(tf.io.gfile.isdir('gs://script-bucket/a')))"],
                               env=clean_env(**exports), capture_output=True, text=True, timeout=120)
        assert write.returncode == 0 and write.stdout.endswith("True"), write.stderr[-2000:]
        children = [int(pid) for task in os.listdir(f"/proc/{server.pid}/task")
                    for pid in open(f"/proc/{server.pid}/task/{task}/children").read().split()]
        assert children  # fake-gcs-server
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}"), f"fake-gcs-server {pid} outlived the script"
