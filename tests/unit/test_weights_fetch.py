"""--weights fetched before the cluster forms (cassava.model.fetch_weights, Task.fetch): a download
that cannot happen is one line naming --weights; one that may pass is tried again."""

import argparse

import pytest

from cassava import model as model_lib
from cassava.task import CassavaTask
from trainer.runtime import entry
from trainer.cluster import resolve
from trainer.tasks import DataError

pytestmark = pytest.mark.unit

REFUSED = f"URL fetch failure on {model_lib.IMAGENET_URL}: None -- [Errno 111] Connection refused"
FORBIDDEN = f"URL fetch failure on {model_lib.IMAGENET_URL}: 403 -- Forbidden"
UNAVAILABLE = f"URL fetch failure on {model_lib.IMAGENET_URL}: 503 -- Service Unavailable"


def test_the_weights_are_where_keras_applications_fetches_them():
    """The same file, address and hash as Keras' own ResNet50(weights="imagenet", include_top=False),
    so Keras' cache serves either."""
    from keras.src.applications import resnet

    assert model_lib.IMAGENET_URL == resnet.BASE_WEIGHTS_PATH + model_lib.IMAGENET_FILE
    assert model_lib.IMAGENET_FILE == "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
    assert model_lib.IMAGENET_MD5 == resnet.WEIGHTS_HASHES["resnet50"][1]


@pytest.mark.parametrize("message, transient", [
    (REFUSED, False), (FORBIDDEN, False), (f"URL fetch failure on {model_lib.IMAGENET_URL}: 404 -- Not Found", False),
    (UNAVAILABLE, True), (f"URL fetch failure on {model_lib.IMAGENET_URL}: 429 -- Too Many Requests", True),
    (f"URL fetch failure on {model_lib.IMAGENET_URL}: None -- timed out", True),
    (f"URL fetch failure on {model_lib.IMAGENET_URL}: None -- [Errno -2] Name or service not known", False),
])
def test_which_failures_are_tried_again(message, transient):
    assert model_lib.transient_fetch_failure(message) is transient


def failing_get_file(monkeypatch, *messages):
    calls = []

    def get_file(*args, **kwargs):
        calls.append(kwargs)
        message = messages[min(len(calls), len(messages)) - 1]
        if message is None:
            return "/cache/models/" + model_lib.IMAGENET_FILE
        raise Exception(message)

    monkeypatch.setattr(model_lib.keras.utils, "get_file", get_file)
    return calls


def test_an_unreachable_download_is_one_line_naming_the_flag_and_the_ways_out(monkeypatch):
    calls = failing_get_file(monkeypatch, REFUSED)
    with pytest.raises(model_lib.WeightsUnavailable) as raised:
        model_lib.fetch_weights("imagenet", "resnet50", sleep=lambda s: None)
    line = str(raised.value)
    assert "\n" not in line and line.startswith("--weights imagenet: cannot fetch")
    assert "Connection refused" in line and "--weights none" in line and "--weights FILE" in line
    assert len(calls) == 1  # refused: no second try
    assert calls[0]["file_hash"] == model_lib.IMAGENET_MD5


def test_a_download_that_may_pass_is_tried_again(monkeypatch):
    waits = []
    calls = failing_get_file(monkeypatch, UNAVAILABLE, None)
    assert model_lib.fetch_weights("imagenet", "resnet50", sleep=waits.append).endswith(model_lib.IMAGENET_FILE)
    assert len(calls) == 2 and len(waits) == 1


def test_a_download_that_keeps_failing_gives_up_after_its_attempts(monkeypatch):
    calls = failing_get_file(monkeypatch, UNAVAILABLE)
    with pytest.raises(model_lib.WeightsUnavailable, match="503"):
        model_lib.fetch_weights("imagenet", "resnet50", sleep=lambda s: None)
    assert len(calls) == model_lib.FETCH_ATTEMPTS


def test_nothing_is_fetched_for_no_weights_a_local_file_or_the_small_model(monkeypatch):
    calls = failing_get_file(monkeypatch, REFUSED)
    assert model_lib.fetch_weights("none", "resnet50") == "none"
    assert model_lib.fetch_weights("/w/resnet.h5", "resnet50") == "/w/resnet.h5"
    assert model_lib.fetch_weights("imagenet", "small") == "imagenet"
    assert calls == []


def test_a_remote_weights_file_that_cannot_be_read_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(model_lib.WeightsUnavailable) as raised:
        model_lib.fetch_weights(f"file://{tmp_path}/absent.h5", "resnet50")
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"--weights file://{tmp_path}/absent.h5: ")


def test_the_cassava_task_turns_a_failed_fetch_into_a_data_error(monkeypatch):
    failing_get_file(monkeypatch, FORBIDDEN)
    task = CassavaTask()
    with pytest.raises(DataError, match=r"^--weights imagenet: cannot fetch .*403"):
        task.fetch(argparse.Namespace(weights="imagenet", architecture="resnet50"))


@pytest.mark.parametrize("environ, strategy, trains", [
    ({}, "mirrored", True),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}'},
     "multi_worker_mirrored", True),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}}'},
     "parameter_server", True),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}'},
     "parameter_server", False),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}'},
     "parameter_server", False),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}}'},
     "multi_worker_mirrored", False),
])
def test_the_processes_that_train_the_model_fetch_its_weights(environ, strategy, trains):
    assert entry.trains_model(resolve(environ), strategy) is trains
