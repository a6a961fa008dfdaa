"""The exported model behind the prediction server: loaded once, fed in batches, answering with
plain values.

Requests that arrive together are answered by one call of the SavedModel's `serving_default`, up
to `max_batch` images (serving.predict's batch), as serving.predict answers a list of files: where
a larger batch uses the machine better (many cores, a small model, an accelerator), a server under
load then runs at serving.predict's batch rate (benchmarks/serving_load.py measures both). A lone
request is answered at once; nothing waits for a batch to fill. One thread calls the model, so at
most one batch of images is decoded at a time, whatever the number of clients.

Only a handful of batch shapes ever reach the model, powers of two up to max_batch (and max_batch):
TensorFlow and oneDNN set up and keep buffers for each new shape. Fed every size from 1 to 32, a
ResNet50 server at concurrency 32 grew by 255 MB in three minutes and was still growing; with
those shapes alone it grew for 80 s and then not at all for the next 100 s (2-core AMD EPYC
family 25 model 17). Each call takes the largest such size the waiting images fill, and leaves
the rest for the next call, rather than padding them up with copies: a copy costs as much compute
as an image. Padded, 8 clients made batches of 1 and 7-run-as-8 in turn and paid 203 CPU ms per
request against the model's 175 per image (benchmarks/serving_load.py, same machine). A call is
padded, with copies of its last image, only when its requests' images cannot make the size
exactly (a request's images stay in one call).

An image the model's decoder refuses spoils the call it is in: the batch is answered again one
request, then one image, at a time, so that only the request that sent it fails, naming it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from typing import Sequence

import trainer  # noqa: F401  (selects legacy Keras before TensorFlow loads)


class UndecodableImage(Exception):
    """The model's decoder refused the image at `index` of a submitted list."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


@dataclasses.dataclass
class _Work:
    images: list[bytes]
    future: concurrent.futures.Future


class Predictor:
    """Answers lists of encoded images with {class_name, class_index, probabilities} each, through
    `signature` (a loaded serving_default); call `close` to stop its thread."""

    def __init__(self, signature, max_batch: int):
        self.signature = signature
        self.max_batch = max_batch
        self.batches = 0  # model calls made, for the log
        self._pending: collections.deque[_Work] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="predictor", daemon=True)
        self._thread.start()

    def submit(self, images: Sequence[bytes]) -> concurrent.futures.Future:
        """A future of the predictions for `images` (at most max_batch of them), or of
        UndecodableImage naming the first the model could not decode."""
        if not 0 < len(images) <= self.max_batch:
            raise ValueError(f"submit takes 1 to {self.max_batch} images, got {len(images)}")
        work = _Work(list(images), concurrent.futures.Future())
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
                batch, size = [], 0
                target = call_size(sum(len(work.images) for work in self._pending), self.max_batch)
                while self._pending and (not batch or size + len(self._pending[0].images) <= target):
                    work = self._pending.popleft()
                    if work.future.set_running_or_notify_cancel():  # else its client went away
                        batch.append(work)
                        size += len(work.images)
            if batch:
                self._answer(batch)

    def _answer(self, batch: list[_Work]) -> None:
        import tensorflow as tf

        try:
            predictions = self._call([image for work in batch for image in work.images])
        except tf.errors.InvalidArgumentError:
            if len(batch) > 1:
                for work in batch:
                    self._answer([work])
                return
            batch[0].future.set_exception(self._culprit(batch[0].images))
            return
        except Exception as error:  # noqa: BLE001  (the waiting requests must hear of it, whatever it is)
            for work in batch:
                work.future.set_exception(error)
            return
        start = 0
        for work in batch:
            work.future.set_result(predictions[start:start + len(work.images)])
            start += len(work.images)

    def _culprit(self, images: list[bytes]) -> Exception:
        import tensorflow as tf

        for index, image in enumerate(images):
            try:
                self._call([image])
            except tf.errors.InvalidArgumentError:
                return UndecodableImage(index)
        return RuntimeError("the model refused these images together and accepted each alone")

    def _call(self, images: list[bytes]) -> list[dict]:
        import tensorflow as tf

        from cassava import signature as serving

        padded = images + images[-1:] * (padded_size(len(images), self.max_batch) - len(images))
        outputs = self.signature(**{serving.BYTES_INPUT: tf.constant(padded)})
        self.batches += 1
        names = outputs["class_name"].numpy()
        indices = outputs["class_index"].numpy()
        probabilities = outputs["probabilities"].numpy()
        return [{"class_name": names[i].decode(), "class_index": int(indices[i]),
                 "probabilities": probabilities[i].tolist()} for i in range(len(images))]


def call_size(waiting: int, max_batch: int) -> int:
    """How many of `waiting` images the next call takes: max_batch when they fill it, else the
    largest power of two they fill."""
    return max_batch if waiting >= max_batch else 1 << (waiting.bit_length() - 1)


def padded_size(size: int, max_batch: int) -> int:
    """The batch shape `size` images are sent in: the next power of two, at most max_batch."""
    return min(1 << (size - 1).bit_length(), max_batch) if size <= max_batch else size


def load(model_dir: str, max_batch: int) -> tuple[Predictor, int]:
    """The model at `model_dir` (a local path or gs://, read by TensorFlow's own file systems),
    warmed up with one generated image, so that the first client does not pay for the first call.
    Returns the predictor and its number of classes. Raises serving.predict.PredictError (one
    line) for a directory that holds no export, or an export without the bytes signature."""
    import numpy as np
    import tensorflow as tf

    from serving import predict

    predictor = Predictor(predict.load_signature(model_dir), max_batch)
    grey = tf.io.encode_jpeg(np.full((64, 64, 3), 128, np.uint8)).numpy()
    warm = predictor.submit([grey]).result()
    return predictor, len(warm[0]["probabilities"])
