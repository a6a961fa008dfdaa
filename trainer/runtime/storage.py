"""Cloud Storage as a job meets it: a missing bucket, a refusal, an outage.

TensorFlow's GCS client gets two of these wrong for a job:
- `tf.io.gfile.makedirs` under a bucket that does not exist loops forever (tensorflow/hub#261,
  AI-Hypercomputer/maxtext#3317): `check_buckets` asks for each bucket first.
- It retries a 5xx or a dropped connection with backoff (ten attempts, about three minutes),
  then raises an error whose text is several lines of HTTP. `failure` turns it, and a 403 or
  404, into one line and the exit code the platforms act on (trainer.exits): a refusal or a
  missing bucket is a configuration error (2, a restart cannot fix it), an outage that outlasts
  the retries is retryable (143).
"""

from __future__ import annotations

import re
from typing import Iterable

from trainer import exits

# Settings TensorFlow's GCS client reads once, when it first starts; every process of a task sets
# them before importing TensorFlow unless the environment already has them
# (trainer.runtime.entry.prepare_environment).
CLIENT_ENVIRONMENT = {
    # Every file opened for reading gets a zero-filled buffer of this size, and each refill of it
    # is one request that must finish before any of its bytes are read. Too large wastes CPU:
    # TensorFlow 2.21's default, 128 MB, costs the client 0.5 s of kernel time per 72 MB epoch,
    # faulting in fresh pages. Too small pays Cloud Storage's first-byte wait more often: epoch 1
    # from a bucket against local disk, benchmarks/input_pipeline.py's files (16 shards of
    # 4.5-7.4 MB, every request delayed 30 ms), lowest at N=4 to highest at N=1, alternating
    # rounds in one process on the 2-core AMD EPYC family 25 (Zen 3): 2 MB 0.73-0.82x, 4 MB
    # 0.77-0.85x, 8 MB 0.75-0.92x. 8 MB, what Google's TF Model Garden images set, reads such
    # shards in one request and zero-fills half of what 16 MB does for every small file. A
    # 100 MB shard is 13 requests, read as the file is.
    "GCS_READ_CACHE_BLOCK_SIZE_MB": "8",
}

_GCS_PATH = re.compile(r"gs://[^\s'\"]+")


class StorageError(ValueError):
    """A gs:// path the job cannot use. str() is one line."""


def bucket_of(path: str | None) -> str | None:
    """`gs://bucket/a/b` -> `bucket`; None for anything else."""
    if not path or not path.startswith("gs://"):
        return None
    return path[len("gs://"):].split("/", 1)[0] or None


def check_buckets(paths: Iterable[str | None]) -> None:
    """Raises StorageError naming the first gs:// path whose bucket does not exist or cannot be
    read. One metadata request per bucket."""
    import tensorflow as tf

    seen = set()
    for path in paths:
        bucket = bucket_of(path)
        if bucket is None or bucket in seen:
            continue
        seen.add(bucket)
        try:
            exists = tf.io.gfile.exists(f"gs://{bucket}/")
        except tf.errors.OpError as error:
            raise StorageError(_describe(error, path)) from None
        if not exists:
            raise StorageError(f"{path}: bucket gs://{bucket} does not exist (or the job's service account "
                               f"cannot see it)")


def failure(error: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a Cloud Storage error, or None when `error` is not one."""
    import tensorflow as tf

    if not isinstance(error, tf.errors.OpError):
        return None
    message = error.message or ""
    if "gs://" not in message and "HTTP response code" not in message:
        return None
    line = _describe(error)
    if isinstance(error, (tf.errors.PermissionDeniedError, tf.errors.UnauthenticatedError)):
        return exits.CONFIG, line
    if isinstance(error, tf.errors.NotFoundError) and "bucket does not exist" in message:
        return exits.CONFIG, line
    if isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError)) \
            or re.search(r"HTTP response code 5\d\d|retry attempts failed", message):
        return exits.RETRYABLE, f"{line} (Cloud Storage did not answer through the client's retries; exit {exits.RETRYABLE}, retryable)"
    return None


def _describe(error, path: str | None = None) -> str:
    """`gs://b/x: permission denied (HTTP 403: <server's message>)`, from TensorFlow's text."""
    message = getattr(error, "message", None) or str(error)
    where = path or next(iter(_GCS_PATH.findall(message)), "Cloud Storage")
    status = re.search(r"HTTP response code (\d+)", message)
    server = re.search(r'"message":\s*"([^"]+)"', message)
    kind = re.sub(r"Error$", "", type(error).__name__)
    kind = re.sub(r"(?<!^)(?=[A-Z])", " ", kind).lower()
    detail = ", ".join(filter(None, [f"HTTP {status.group(1)}" if status else None,
                                     server.group(1) if server else None]))
    if not detail:
        detail = message.strip().splitlines()[0][:160] if message.strip() else type(error).__name__
    return f"{where}: {kind} ({detail})"
