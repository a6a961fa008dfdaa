"""What makes a short run from scratch learn, without touching fine-tuning from ImageNet weights:
the learning rate auto, the warm-up, ResNet50's batch-norm momentum, and the line that says
what the final accuracy means.

The checks that ResNet50's batch-norm momentum reaches the model build full ResNet50 models
(seconds each, not the milliseconds of this tier): they moved to
tests/integration/test_resnet50_batch_norm_momentum.py (issue 53)."""

import pytest

from cassava import model as model_lib
from cassava import task as cassava_task
from cassava.task import CassavaTask
from trainer.runtime import config as config_lib
from trainer.cluster import resolve

SINGLE = resolve({})


@pytest.mark.parametrize("weights, rate", [("imagenet", 1e-4), ("none", 1e-3)])
def test_learning_rate_auto_fine_tunes_pretrained_weights_slowly_and_trains_from_scratch_faster(weights, rate):
    assert config_lib.parse(["--weights", weights], {}, SINGLE, CassavaTask()).learning_rate == rate
    assert config_lib.parse(["--weights", weights, "--learning-rate", "auto"], {}, SINGLE, CassavaTask()).learning_rate == rate


def test_a_learning_rate_given_wins_over_auto_whatever_the_weights():
    assert config_lib.parse(["--weights", "none", "--learning-rate", "0.03"], {}, SINGLE, CassavaTask()).learning_rate == 0.03
    assert config_lib.parse(["--learning-rate", "2e-5"], {}, SINGLE, CassavaTask()).learning_rate == 2e-5


@pytest.mark.parametrize("text", ["0", "-1e-3", "fast"])
def test_a_learning_rate_that_is_not_positive_is_a_one_line_error(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        config_lib.parse(["--learning-rate", text], {}, SINGLE, CassavaTask())
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_warm_up_is_one_epoch_from_scratch_and_none_for_pretrained_weights():
    assert model_lib.warmup_steps("none", 12) == 12
    assert model_lib.warmup_steps("imagenet", 12) == 0
    assert model_lib.warmup_steps("/weights/resnet50_notop.h5", 12) == 0


def test_warm_up_ramps_linearly_to_the_rate_and_stays_there():
    schedule = model_lib.LinearWarmup(1e-3, 4)
    rates = [float(schedule(step)) for step in range(6)]
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    again = model_lib.LinearWarmup.from_config(schedule.get_config())
    assert float(again(1)) == pytest.approx(5e-4)


@pytest.mark.parametrize("logs, says", [
    ({"val_accuracy": 0.9167, "accuracy": 0.8}, "final val_accuracy=0.9167: the share of validation images whose class "
                                                 "the model ranks first; guessing among 5 classes scores 0.20, so this "
                                                 "is 4.6x chance: the model learned"),
    ({"val_accuracy": 0.2031}, "no better than guessing"),
    ({"val_accuracy": 0.3}, "above chance but not far"),
    ({"accuracy": 0.5}, "final accuracy=0.5000: the share of training images (no validation data)"),
])
def test_the_last_line_says_what_the_accuracy_means(logs, says):
    assert says in cassava_task.accuracy_meaning(logs, 5)


def test_no_accuracy_no_line():
    assert cassava_task.accuracy_meaning({"loss": 0.1}, 5) is None
