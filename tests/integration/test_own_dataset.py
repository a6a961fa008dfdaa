"""A user's own photos: seven classes in folders, prepared, trained on two workers through the
launcher, and predicted with their own names. Nothing here knows about cassava."""

from __future__ import annotations

import json
import re

import numpy as np

import tensorflow as tf

from helpers import FLOAT32, run_module

CLASSES = ["alder", "beech", "birch", "cedar", "elm", "maple", "oak"]
COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40], [200, 40, 200], [40, 200, 200],
                    [120, 120, 120]])


def write_photos(root, per_class: int, seed: int) -> dict[str, str]:
    """PATH -> class for JPEG photos of each class (its own colour, noise, random size)."""
    rng = np.random.default_rng(seed)
    written = {}
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            height, width = (int(v) for v in rng.integers(60, 140, size=2))
            image = np.clip(COLOURS[label] + rng.normal(0, 25, size=(height, width, 3)), 0, 255).astype(np.uint8)
            path = root / name / f"{index}.jpg"
            path.write_bytes(tf.io.encode_jpeg(image).numpy())
            written[str(path)] = name
    return written


def test_seven_class_folders_train_on_two_workers_and_predict_with_their_names(tmp_path):
    write_photos(tmp_path / "photos" / "train", per_class=8, seed=0)
    held_out = write_photos(tmp_path / "photos" / "validation", per_class=2, seed=1)
    prepared = tmp_path / "prepared"
    for split in ("train", "validation"):
        result = run_module("cassava.prepare", "--source", f"folder:{tmp_path / 'photos' / split}", "--output",
                            str(prepared), "--shards", "4", "--split", split)
        assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((prepared / "dataset.json").read_text())["class_names"] == CLASSES

    model_dir = tmp_path / "model"
    result = run_module(
        "trainer.launch", "--workers", "2", "--work-dir", str(tmp_path / "work"), "--timeout", "500", "--", "python", "-m", "cassava.task",
        "--dataset", f"tfrecord:{prepared}/train-*.tfrecord", "--eval-dataset", f"tfrecord:{prepared}/validation-*.tfrecord",
        "--epochs", "4", "--architecture", "small", "--weights", "none", "--image-size", "32",
        "--per-replica-batch-size", "4", "--learning-rate", "0.003", *FLOAT32, "--model-dir", str(model_dir), timeout=560)
    assert result.returncode == 0, result.stdout[-4000:]
    assert re.search(rf"^\[chief-0\] .* trainer: classes: 7 \({', '.join(CLASSES)}\)$", result.stdout, re.M)

    predicted = run_module("serving.predict", str(model_dir), *held_out)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = [(path, json.loads(prediction)) for path, prediction in (line.split("\t") for line in predicted.stdout.splitlines())]
    assert [path for path, _ in rows] == list(held_out)
    assert {p["class_name"] for _, p in rows} <= set(CLASSES)
    # Seven plain colours are easy: the model has learnt them, with their names attached.
    correct = sum(p["class_name"] == held_out[path] for path, p in rows)
    assert correct >= len(rows) // 2, rows
    assert all(len(p["probabilities"]) == len(CLASSES) for _, p in rows)
