"""The exported model behind the prediction server: loaded once, fed in batches, answering with
JSON values (serving.answers).

Requests that arrive together are answered by one call of the signature, up to `max_batch`
instances (serving.predict's batch), as serving.predict answers a list of files: where a larger
batch uses the machine better (many cores, a small model, an accelerator), a server under load
then runs at serving.predict's batch rate (benchmarks/serving_load.py measures both). A lone
request is answered at once; nothing waits for a batch to fill. One thread calls the model, so at
most one batch is computed (an image model: decoded) at a time, whatever the number of clients.
Instances go to the model together only when their arrays agree in shape (an input that takes any
length may get different lengths from different requests); the others wait for a call of their own.

Only a handful of batch shapes ever reach the model, powers of two up to max_batch (and max_batch):
TensorFlow and oneDNN set up and keep buffers for each new shape. Fed every size from 1 to 32, a
ResNet50 server at concurrency 32 grew by 255 MB in three minutes and was still growing; with
those shapes alone it grew for 80 s and then not at all for the next 100 s (2-core AMD EPYC
family 25 model 17). Each call takes the largest such size the waiting instances fill, and leaves
the rest for the next call, rather than padding them up with copies: a copy costs as much compute
as an instance. Padded, 8 clients made batches of 1 and 7-run-as-8 in turn and paid 203 CPU ms per
request against the model's 175 per image (benchmarks/serving_load.py, same machine). A call is
padded, with copies of its last instance, only when its requests' instances cannot make the size
exactly (a request's instances stay in one call).

An instance the model refuses (serving.model.Refused: an image its decoder cannot read, a category
its lookup does not know) spoils the call it is in: the batch is answered again one request, then
one instance, at a time, so that only the request that sent it fails, naming it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from typing import Sequence

import numpy as np

from serving import answers, model as model_lib
from serving.instances import Instance


class RefusedInstance(Exception):
    """The model refused the instance at `index` of a submitted list; `reason` is its one line."""

    def __init__(self, index: int, reason: str):
        super().__init__(index, reason)
        self.index = index
        self.reason = reason


@dataclasses.dataclass
class _Work:
    instances: list[Instance]
    future: concurrent.futures.Future

    @property
    def shapes(self) -> tuple:
        """What must agree for instances to go to the model together: every input's shape."""
        return tuple((name, array.shape) for name, array in self.instances[0].items())


class Predictor:
    """Answers lists of instances (one array per input each, serving.instances) with one JSON
    value each (serving.answers), through `model` (a serving.model.Model, or anything called alike
    that raises serving.model.Refused); call `close` to stop its thread."""

    def __init__(self, model, max_batch: int):
        self.model = model
        self.max_batch = max_batch
        self.batches = 0  # model calls made, for the log
        self._pending: collections.deque[_Work] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="predictor", daemon=True)
        self._thread.start()

    def submit(self, instances: Sequence[Instance]) -> concurrent.futures.Future:
        """A future of the answers for `instances` (at most max_batch of them, of one shape), or of
        RefusedInstance naming the first the model refused."""
        if not 0 < len(instances) <= self.max_batch:
            raise ValueError(f"submit takes 1 to {self.max_batch} instances, got {len(instances)}")
        work = _Work(list(instances), concurrent.futures.Future())
        with self._ready:
            if self._closed:
                raise RuntimeError("the predictor is closed")
            self._pending.append(work)
            self._ready.notify()
        return work.future

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Answers what was submitted, then stops the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                shapes = self._pending[0].shapes
                alike = [work for work in self._pending if work.shapes == shapes]
                target = call_size(sum(len(work.instances) for work in alike), self.max_batch)
                batch, size = [], 0
                for work in alike:
                    if batch and size + len(work.instances) > target:
                        break
                    self._pending.remove(work)
                    if work.future.set_running_or_notify_cancel():  # else its client went away
                        batch.append(work)
                        size += len(work.instances)
            if batch:
                self._answer(batch)

    def _answer(self, batch: list[_Work]) -> None:
        try:
            predictions = self._call([instance for work in batch for instance in work.instances])
        except model_lib.Refused as refused:
            if len(batch) > 1:
                for work in batch:
                    self._answer([work])
                return
            try:
                culprit = self._culprit(batch[0].instances, str(refused))
            except Exception as error:  # noqa: BLE001  (as below: the request must hear of it)
                culprit = error
            batch[0].future.set_exception(culprit)
            return
        except Exception as error:  # noqa: BLE001  (the waiting requests must hear of it, whatever it is)
            for work in batch:
                work.future.set_exception(error)
            return
        start = 0
        for work in batch:
            work.future.set_result(predictions[start:start + len(work.instances)])
            start += len(work.instances)

    def _culprit(self, instances: list[Instance], together: str) -> Exception:
        if len(instances) == 1:
            return RefusedInstance(0, together)
        for index, instance in enumerate(instances):
            try:
                self._call([instance])
            except model_lib.Refused as refused:
                return RefusedInstance(index, str(refused))
        return RuntimeError("the model refused these instances together and accepted each alone")

    def _call(self, instances: list[Instance]) -> list:
        padded = instances + instances[-1:] * (padded_size(len(instances), self.max_batch) - len(instances))
        outputs = self.model({name: np.stack([instance[name] for instance in padded]) for name in padded[0]})
        self.batches += 1
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != len(padded):
                raise RuntimeError(f"the model's output {name!r} has shape {list(array.shape)} for {len(padded)} "
                                   "instances: it must have one row per instance")
        return [answers.prediction({name: array[i] for name, array in outputs.items()}) for i in range(len(instances))]


def call_size(waiting: int, max_batch: int) -> int:
    """How many of `waiting` instances the next call takes: max_batch when they fill it, else the
    largest power of two they fill."""
    return max_batch if waiting >= max_batch else 1 << (waiting.bit_length() - 1)


def padded_size(size: int, max_batch: int) -> int:
    """The batch shape `size` instances are sent in: the next power of two, at most max_batch."""
    return min(1 << (size - 1).bit_length(), max_batch) if size <= max_batch else size


def load(model_dir: str, signature: str, max_batch: int) -> tuple[Predictor, bool]:
    """The signature `signature` of the SavedModel at `model_dir` (serving.model.load: local or
    gs://), behind a Predictor, and whether a warm-up call was made and answered: once here, with
    a made-up instance (serving.model.warm_up_instance), so that the first client does not pay for
    the first call. Raises serving.model.ModelError (one line) for a model it cannot serve."""
    predictor = Predictor(model_lib.load(model_dir, signature), max_batch)
    instance = model_lib.warm_up_instance(predictor.model.inputs)
    if instance is None:
        return predictor, False
    try:
        predictor.submit([instance]).result()
    except RefusedInstance:
        return predictor, False
    return predictor, True
