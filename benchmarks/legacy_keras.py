"""The baselines' Keras: the lab's recipe and tf-keras `fit` run on tf-keras, the Keras the codelab
was written for. TensorFlow 2.22 has no tf-keras release yet (docs/images.md#support-policy), so a
benchmark that needs it says so in one line before it measures anything."""

from __future__ import annotations

import argparse
import importlib.util


def require(parser: argparse.ArgumentParser) -> None:
    """Exits 2 with one line (the parser's error) when tf-keras cannot be imported."""
    if importlib.util.find_spec("tf_keras") is None:
        parser.error("the baseline runs on tf-keras, which this environment does not have (TensorFlow 2.22 has "
                     "no tf-keras release yet); run it where `pip install tf-keras` matches TensorFlow")
