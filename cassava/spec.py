"""--dataset and --eval-dataset: where examples come from, as a plain value. Imports no TensorFlow:
the flags are parsed before TensorFlow loads (trainer.fit)."""

from __future__ import annotations

import argparse
import dataclasses

from trainer import cli

DATASET_SCHEMES = ("tfds", "tfrecord", "synthetic")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where examples come from: `tfds:cassava`, `tfrecord:GLOB` or `synthetic:N`."""

    scheme: str
    value: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.value}"

    @property
    def synthetic_size(self) -> int:
        return int(self.value)


def dataset_spec(text: str) -> DatasetSpec:
    """The flag type of --dataset and --eval-dataset."""
    scheme, sep, value = text.partition(":")
    if not sep or scheme not in DATASET_SCHEMES or not value:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of tfds:NAME, tfrecord:GLOB, synthetic:N")
    if scheme == "synthetic":
        cli.positive_int(value)
    return DatasetSpec(scheme, value)
