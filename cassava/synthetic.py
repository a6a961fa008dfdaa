"""Generated cassava-like data for local runs, tests and benchmarks, with honest decode cost.

Images are 500-800 px on a side like the real photos, JPEG quality 90, and have natural-image
statistics: smooth large-scale structure (leaf and shadow) plus mid- and fine-scale texture.
Each class adds its own pattern (spots, streaks, mottling, mosaic), so a model can learn
something and accuracy above chance means the pipeline kept images and labels together.

Generation is deterministic in (N, seed): every worker of a job that generates the same data
gets identical files, and the directory appears atomically, so workers sharing a disk may race
to create it safely.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import zlib

import numpy as np
import tensorflow as tf

from cassava import records

CLASS_NAMES = records.CASSAVA_CLASS_NAMES
# Part of the cache directory's name: bump it when what `ensure` writes changes (2: dataset.json;
# 3: float32 generation and uniform sensor noise, other pixels from the same seeds).
FORMAT_VERSION = 3
TRAIN_SHARDS = 8
VALIDATION_SHARDS = 2


def validation_size(num_train: int) -> int:
    return max(8, num_train // 4)


def _smooth_field(rng: np.random.Generator, height: int, width: int, cells: int, channels: int) -> np.ndarray:
    """Random values on a coarse grid, interpolated smoothly to the full size (float32)."""
    grid = rng.standard_normal(size=(1, cells, max(2, cells * width // height), channels), dtype=np.float32)
    return tf.image.resize(grid, (height, width), method="bicubic")[0].numpy()


def _paint(image: np.ndarray, where: np.ndarray, color: tuple[float, float, float]) -> None:
    image[where[..., 0]] = color


# Sensor noise: uniform on [-a, a] has the standard deviation a / sqrt(3); 4 grey levels, as a
# Gaussian of that spread would give, at a fifth of a Gaussian draw's cost per value.
NOISE_STD = 4.0
_NOISE_HALF_WIDTH = NOISE_STD * 3 ** 0.5


def make_image(rng: np.random.Generator, label: int, size: tuple[int, int] | None = None) -> np.ndarray:
    """An RGB uint8 image; `size` (height, width) fixes its size, else 500-800 px a side. In float32
    and in place throughout: the tests and benchmarks generate thousands of these, and float64
    copies and Gaussian noise made each one cost twice as much (45 ms against 21-25 ms for 500-800
    px on a 2-core AMD EPYC of family 25, loaded)."""
    height, width = size or tuple(int(v) for v in rng.integers(500, 801, size=2))
    leaf = np.array([70.0, 125.0, 45.0], np.float32) + 10.0 * rng.standard_normal(3, dtype=np.float32)
    light = _smooth_field(rng, height, width, 4, 1)  # broad shading
    veins = _smooth_field(rng, height, width, 24, 3)  # mid-scale texture
    image = leaf * (1.0 + 0.25 * light)
    image += 12.0 * veins
    pattern = _smooth_field(rng, height, width, 12, 1)
    if CLASS_NAMES[label] == "cbb":  # brown angular spots
        _paint(image, pattern > 1.0, (110.0, 80.0, 40.0))
    elif CLASS_NAMES[label] == "cbsd":  # yellow streaks along one axis
        streaks = _smooth_field(rng, height, 8, 6, 1)
        _paint(image, np.repeat(streaks, width // 8 + 1, axis=1)[:, :width] > 0.9, (190.0, 180.0, 60.0))
    elif CLASS_NAMES[label] == "cgm":  # pale mottling
        image += 45.0 * np.clip(pattern, 0, None)
    elif CLASS_NAMES[label] == "cmd":  # strong yellow-green mosaic
        mosaic = _smooth_field(rng, height, width, 30, 1)
        _paint(image, mosaic > 0.3, (170.0, 175.0, 50.0))
    noise = rng.random(size=image.shape, dtype=np.float32)
    noise -= 0.5
    noise *= 2 * _NOISE_HALF_WIDTH
    image += noise
    np.clip(image, 0, 255, out=image)
    return image.astype(np.uint8)


def examples(count: int, seed: int, id_prefix: str, size: tuple[int, int] | None = None):
    """Yields (jpeg, label, id); example i depends only on (seed, id_prefix, i)."""
    for index in range(count):
        rng = np.random.default_rng([seed, zlib.crc32(id_prefix.encode()), index])
        label = index % len(CLASS_NAMES)
        jpeg = tf.io.encode_jpeg(make_image(rng, label, size), quality=90).numpy()
        yield jpeg, label, f"{id_prefix}-{index:06d}"


def ensure(root: str, num_train: int, seed: int = 0) -> str:
    """Generates the dataset under `root` unless it is already there; returns its directory."""
    directory = os.path.join(root, f"synthetic-v{FORMAT_VERSION}-n{num_train}-seed{seed}")
    if os.path.isdir(directory):
        return directory
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".staging-{uuid.uuid4().hex[:8]}-", dir=root)
    try:
        for split, count, shards in (("train", num_train, TRAIN_SHARDS),
                                     ("validation", validation_size(num_train), VALIDATION_SHARDS)):
            paths, written = records.write_shards(examples(count, seed, split), staging, split, min(shards, count))
            records.write_metadata(staging, CLASS_NAMES, split, written, len(paths), paths)
        try:
            os.rename(staging, directory)  # atomic: readers see all files or none
        except OSError:
            if not os.path.isdir(directory):  # not lost to a concurrent writer: a real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
