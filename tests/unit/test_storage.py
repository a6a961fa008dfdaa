"""trainer.runtime.storage: Cloud Storage errors as TensorFlow's client raises them, to one line and an
exit code (the messages are the client's own, as seen against the local server)."""

import pytest

import trainer  # noqa: F401
import tensorflow as tf

from trainer import exits
from trainer.runtime import storage

BODY = "HTTP response code {code} with body '{{\"error\": {{\"code\": {code}, \"message\": \"{text}\"}}}}'"


def error(kind, text):
    return kind(None, None, text)


def test_bucket_of_takes_gs_paths_only():
    assert storage.bucket_of("gs://b/x/y") == "b"
    assert storage.bucket_of("gs://b") == "b"
    assert storage.bucket_of("/tmp/gs://b") is None and storage.bucket_of(None) is None


def test_a_403_is_a_configuration_error_naming_the_path():
    raised = error(tf.errors.PermissionDeniedError, "Error executing an HTTP request: " +
                   BODY.format(code=403, text="caller does not have storage.objects.create access") +
                   "\n\t when initiating an upload to gs://b/model/variables/variables.index")
    code, line = storage.failure(raised)
    assert code == exits.CONFIG
    assert line == ("gs://b/model/variables/variables.index: permission denied "
                    "(HTTP 403, caller does not have storage.objects.create access)")


def test_retries_running_out_is_retryable():
    raised = error(tf.errors.AbortedError, "All 10 retry attempts failed. The last failure: Error executing an HTTP "
                   "request: " + BODY.format(code=503, text="Service Unavailable") + "\n\t when reading gs://b/x")
    code, line = storage.failure(raised)
    assert code == exits.RETRYABLE and line.startswith("gs://b/x: aborted (HTTP 503, Service Unavailable)")


@pytest.mark.parametrize("raised", [
    ValueError("gs://b/x"),
    tf.errors.UnavailableError(None, None, "Socket closed: connection to /job:worker/replica:0/task:1 lost"),
])
def test_other_errors_are_not_storage_errors(raised):
    assert storage.failure(raised) is None


def test_the_task_sets_the_gcs_client_settings_unless_the_user_did():
    from trainer import cluster as cluster_lib
    from trainer.runtime import entry

    cluster = cluster_lib.resolve({})
    environ = {}
    entry.prepare_environment(cluster, "mirrored", environ)
    assert environ["GCS_READ_CACHE_BLOCK_SIZE_MB"] == storage.CLIENT_ENVIRONMENT["GCS_READ_CACHE_BLOCK_SIZE_MB"]
    environ = {"GCS_READ_CACHE_BLOCK_SIZE_MB": "64"}
    entry.prepare_environment(cluster, "mirrored", environ)
    assert environ["GCS_READ_CACHE_BLOCK_SIZE_MB"] == "64"
