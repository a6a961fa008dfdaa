"""gs:// end to end: real TensorFlow processes read and write a local Cloud Storage server
(scripts/local_gcs.py) at Google's hostnames, through TensorFlow's own GCS client."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, clean_env, run_module

SMALL_RUN = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4"]


def write_image_folder(root: Path, per_class: int = 8) -> Path:
    import trainer  # noqa: F401
    import tensorflow as tf
    from trainer import synthetic

    rng = np.random.default_rng(0)
    for label, name in enumerate(synthetic.CLASS_NAMES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = synthetic.make_image(rng, label, size=(60, 80))
            (root / name / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
    return root


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
    """A bucket holding what trainer.prepare wrote from an image folder (4 shards)."""
    gcs_server.create_bucket("cassava-data")
    folder = write_image_folder(tmp_path_factory.mktemp("images"))
    result = run_module("trainer.prepare", "--source", f"folder:{folder}", "--output", "gs://cassava-data/prepared",
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
    in_bucket = run_module(*launch, "--work-dir", str(tmp / "work-gcs"), "--", *args,
                           env=clean_env(**gcs_server.environ(), AIP_MODEL_DIR=f"{base}/model/",
                                         AIP_CHECKPOINT_DIR=f"{base}/checkpoints/", AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/"))
    local = tmp / "local"
    on_disk = run_module(*launch, "--work-dir", str(tmp / "work-local"), "--", *args,
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
    assert {"model/saved_model.pb", "checkpoints/epoch-0002.index"} <= in_gcs
    assert any(fnmatch.fnmatch(name, "logs/train/events.out.tfevents.*") for name in in_gcs)
