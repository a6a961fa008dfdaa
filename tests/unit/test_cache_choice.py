"""--cache-images auto: a cache the job would never fill is not made (tf.data discards it and
warns on stderr, which Cloud Logging shows as an error)."""

from __future__ import annotations

from cassava import data


def test_auto_caches_a_share_the_job_reads_whole():
    assert data.should_cache("auto", 1000, 32, 2, examples_read=500)
    assert data.should_cache("auto", 1000, 32, 2, examples_read=6000)
    assert data.should_cache("auto", 1000, 32, 2)  # unknown: as much as fits


def test_auto_does_not_cache_a_share_the_job_reads_only_part_of():
    assert not data.should_cache("auto", 1000, 32, 2, examples_read=499)
    assert not data.should_cache("auto", 1000, 32, 1, examples_read=16)


def test_always_and_never_are_what_they_say():
    assert data.should_cache("always", 1000, 32, 2, examples_read=1)
    assert not data.should_cache("never", 1000, 32, 2, examples_read=10_000)
