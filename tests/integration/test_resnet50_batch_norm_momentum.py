"""ResNet50's batch-norm momentum reaches every batch-normalization layer of the model
cassava.model.build makes: from scratch, from a weights file, and from --batch-norm-momentum.

Moved here from tests/unit/test_learning_defaults.py (issue 53): each test builds a full ResNet50
in this process (seconds each, with a 94 MB weights file written and read), which is not what the
unit tier's milliseconds are for; they assert what they asserted there. (cassava.model says why
0.9.)"""

import pytest

from cassava import model as model_lib


def batch_norm_momenta(weights: str) -> set[float]:
    import tensorflow as tf

    built = model_lib.build(5, 32, weights, "resnet50")
    base = next(layer for layer in built.layers if isinstance(layer, tf.keras.Model))
    return {layer.momentum for layer in base.layers if isinstance(layer, tf.keras.layers.BatchNormalization)}


def test_resnet50_from_scratch_tracks_its_batch_statistics_faster():
    assert batch_norm_momenta("none") == {model_lib.BATCH_NORM_MOMENTUM} == {0.9}


def test_the_batch_norm_momentum_flag_defaults_to_the_models_and_reaches_resnet50():
    import argparse

    import tensorflow as tf

    from cassava import task as task_lib

    parser = argparse.ArgumentParser()
    task_lib.CassavaTask().add_arguments(parser)
    assert parser.parse_args([]).batch_norm_momentum == model_lib.BATCH_NORM_MOMENTUM
    assert parser.parse_args(["--batch-norm-momentum", "0.99"]).batch_norm_momentum == 0.99
    for bad in ("1", "-0.1", "nan", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--batch-norm-momentum", bad])
    built = model_lib.build(5, 32, "none", "resnet50", batch_norm_momentum=0.99)
    base = next(layer for layer in built.layers if isinstance(layer, tf.keras.Model))
    assert {layer.momentum for layer in base.layers if isinstance(layer, tf.keras.layers.BatchNormalization)} == {0.99}


def test_resnet50_fine_tuning_a_weights_file_tracks_its_batch_statistics_as_fast(tmp_path):
    import tensorflow as tf

    import trainer  # noqa: F401

    path = str(tmp_path / "resnet50_notop.weights.h5")  # Keras 3 saves weights under that suffix only
    tf.keras.applications.ResNet50(include_top=False, weights=None, input_shape=(32, 32, 3), pooling="avg").save_weights(path)
    assert batch_norm_momenta(path) == {0.9}
