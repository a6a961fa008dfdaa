"""serving.predictor with a stand-in for the model (a plain callable, as serving.model.Model is
called): how requests that arrive together share a call, which batch shapes reach the model, and
how one refused instance fails only its own request. No TensorFlow: the predictor knows the model
only through that call (tests/integration/test_prediction_server.py runs real exports)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from serving import model as model_lib, predictor as predictor_lib
from serving.model import Tensor


def image(data: bytes) -> dict[str, np.ndarray]:
    return {"image_bytes": np.array(data, dtype=object)}


class FakeModel:
    """Records each call's batch, can hold the first call until released, and refuses any batch
    holding b"bad" as an image model's decoder would. Answers as an image classifier."""

    inputs = {"image_bytes": Tensor("string", ())}
    outputs = {"class_name": Tensor("string", ()), "class_index": Tensor("int64", ()), "probabilities": Tensor("float32", (5,))}

    def __init__(self, hold_first: bool):
        self.batches: list[list[bytes]] = []
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, columns):
        images = [bytes(item) for item in columns["image_bytes"]]
        self.batches.append(images)
        if len(self.batches) == 1:
            self.release.wait(60)
        if b"bad" in images:
            raise model_lib.Refused("Invalid JPEG data or crop window")
        index = np.array([len(item) % 5 for item in images], np.int64)
        return {"class_name": np.array([f"class-{i}".encode() for i in index], dtype=object), "class_index": index,
                "probabilities": np.eye(5, dtype=np.float32)[index]}


def wait_for_first_call(model: FakeModel) -> None:
    while not model.batches:  # the model is busy with the first request
        time.sleep(0.01)


def test_requests_that_arrive_together_share_one_call_of_the_model_and_a_bad_image_fails_only_its_request():
    model = FakeModel(hold_first=True)
    predictor = predictor_lib.Predictor(model, max_batch=4)
    try:
        first = predictor.submit([image(b"a")])
        wait_for_first_call(model)
        waiting = [predictor.submit([image(b"bb")]), predictor.submit([image(b"ccc"), image(b"bad")]),
                   predictor.submit([image(b"dddd")]), predictor.submit([image(b"eeeee"), image(b"ffffff")])]
        model.release.set()
        assert [p["class_name"] for p in first.result(60)] == ["class-1"]
        assert [p["class_name"] for p in waiting[0].result(60)] == ["class-2"]
        with pytest.raises(predictor_lib.RefusedInstance) as raised:
            waiting[1].result(60)
        assert raised.value.index == 1 and raised.value.reason == "Invalid JPEG data or crop window"
        assert [p["class_name"] for p in waiting[2].result(60)] == ["class-4"]
        assert [p["class_index"] for p in waiting[3].result(60)] == [0, 1]
    finally:
        predictor.close()
    # The three requests that waited (four images) went in one call, which the bad image spoiled;
    # it was answered again request by request, then image by image; the last request, which would
    # not fit in that call, had a call of its own.
    assert model.batches[1] == [b"bb", b"ccc", b"bad", b"dddd"]
    assert [b"eeeee", b"ffffff"] in model.batches and [b"ccc"] in model.batches and [b"bad"] in model.batches
    assert not predictor.alive()


def test_a_batch_reaches_the_model_padded_to_one_of_a_few_shapes_and_answers_only_its_instances():
    model = FakeModel(hold_first=False)
    predictor = predictor_lib.Predictor(model, max_batch=6)
    try:
        answers = [predictor.submit([image(item) for item in items]).result(60)
                   for items in ([b"a", b"bb", b"ccc"], [b"a"] * 5, [b"a"] * 6)]
    finally:
        predictor.close()
    assert [len(batch) for batch in model.batches] == [4, 6, 6]  # powers of two, at most max_batch
    assert model.batches[0] == [b"a", b"bb", b"ccc", b"ccc"]
    assert [len(answer) for answer in answers] == [3, 5, 6]
    assert answers[0][2] == {"class_name": "class-3", "class_index": 3, "probabilities": [0.0, 0.0, 0.0, 1.0, 0.0]}


def test_waiting_instances_go_to_the_model_in_the_largest_power_of_two_they_fill_with_no_copies():
    # Seven single-image requests wait while the model is busy: padded to 8 they would cost an
    # eighth more compute; they go as 4, then 2, then 1, each image once.
    model = FakeModel(hold_first=True)
    predictor = predictor_lib.Predictor(model, max_batch=32)
    try:
        first = predictor.submit([image(b"a")])
        wait_for_first_call(model)
        waiting = [predictor.submit([image(b"x" * n)]) for n in range(2, 9)]
        model.release.set()
        answers = [future.result(60) for future in [first, *waiting]]
    finally:
        predictor.close()
    assert [len(batch) for batch in model.batches] == [1, 4, 2, 1]
    assert sorted(item for batch in model.batches for item in batch) == sorted([b"a"] + [b"x" * n for n in range(2, 9)])
    assert [p["class_name"] for answer in answers for p in answer] == [f"class-{n % 5}" for n in range(1, 9)]


class Sequences:
    """A model of one input that takes any length: answers each sequence's sum."""

    inputs = {"tokens": Tensor("int64", (None,))}
    outputs = {"total": Tensor("int64", ())}

    def __init__(self):
        self.shapes: list[tuple] = []
        self.release = threading.Event()

    def __call__(self, columns):
        self.shapes.append(columns["tokens"].shape)
        if len(self.shapes) == 1:
            self.release.wait(60)
        return {"total": columns["tokens"].sum(axis=1)}


def test_instances_of_different_shapes_wait_for_calls_of_their_own():
    model = Sequences()
    predictor = predictor_lib.Predictor(model, max_batch=8)
    try:
        first = predictor.submit([{"tokens": np.array([1], np.int64)}])
        while not model.shapes:
            time.sleep(0.01)
        pairs = [predictor.submit([{"tokens": np.array([n, n], np.int64)}]) for n in (1, 2)]
        triple = predictor.submit([{"tokens": np.array([1, 1, 1], np.int64)}])
        model.release.set()
        assert first.result(60) == [1] and [p.result(60) for p in pairs] == [[2], [4]] and triple.result(60) == [3]
    finally:
        predictor.close()
    assert model.shapes == [(1, 1), (2, 2), (1, 3)]  # the two pairs together, the triple alone


def test_a_model_whose_output_is_not_one_row_per_instance_fails_the_request_and_the_predictor_goes_on():
    class Summary(FakeModel):
        def __call__(self, columns):
            answer = super().__call__(columns)
            return {**answer, "class_index": answer["class_index"][:1]}

    predictor = predictor_lib.Predictor(Summary(hold_first=False), max_batch=4)
    try:
        with pytest.raises(RuntimeError, match=r"^the model's output 'class_index' has shape \[1\] for 2 instances"):
            predictor.submit([image(b"a"), image(b"bb")]).result(60)
        assert predictor.alive()
    finally:
        predictor.close()


@pytest.mark.parametrize("waiting, max_batch, expected", [(1, 32, 1), (7, 32, 4), (8, 32, 8), (31, 32, 16), (40, 32, 32),
                                                          (5, 6, 4), (6, 6, 6), (9, 6, 6)])
def test_a_call_takes_max_batch_or_the_largest_power_of_two_the_waiting_instances_fill(waiting, max_batch, expected):
    assert predictor_lib.call_size(waiting, max_batch) == expected


@pytest.mark.parametrize("message, reason", [
    ("Graph execution error:\n\nDetected at node fares/lookup/Assert defined at (most recent call last):\n<stack traces "
     "unavailable>\nassertion failed: [found OOV values [\"bitcoin\"]]\n\t [[{{node fares/lookup/Assert}}]] "
     "[Op:__inference_signature_wrapper_serve_227]", 'assertion failed: [found OOV values ["bitcoin"]]'),
    ("Unknown image file format. One of JPEG, PNG, GIF, BMP required. [Op:DecodeImage]",
     "Unknown image file format. One of JPEG, PNG, GIF, BMP required."),
    ("", "no reason given"),
])
def test_the_reason_a_model_refused_is_tensorflows_line_that_says_what_is_wrong(message, reason):
    assert model_lib.first_line(message) == reason
