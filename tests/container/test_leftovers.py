"""The rehearsal tests' leftover check (tests/containers.py) counts what this run left, not what
an earlier run on the same machine did: CI's machines are shared with other checkouts, and a killed
run of one of them once failed forty of this tier's tests with its containers.

The check has two sides, the Cloud Build tests' and the other rehearsals', which run at the same
time on different workers (tests/parallel.py). Each side's test here runs in its own side's work
unit: a Cloud Build network made by a test of the other unit was once seen, mid-build, by the
Cloud Build test's own check, and failed it."""

from __future__ import annotations

import os

import pytest

import containers
from containers import leftovers, note_earlier_leftovers, sh
from scripts.rehearsal.session import PREFIX


def test_a_network_left_before_the_run_is_left_out_and_one_left_by_the_run_is_named_on_its_side(engine):
    """Also: a Cloud Build rehearsal's check does not count it (the Cloud Build side is the next test's)."""
    tool, env = engine
    earlier, ours = f"{PREFIX}earlier-{os.getpid()}", f"{PREFIX}this-run-{os.getpid()}"
    noted = set(containers.EARLIER)
    sh(tool, "network", "create", earlier, env=env)
    try:
        assert earlier in leftovers(engine)  # nothing noted yet: it counts
        assert earlier in note_earlier_leftovers(engine)
        sh(tool, "network", "create", ours, env=env)
        left = leftovers(engine)
        assert earlier not in left and ours in left
        assert ours not in leftovers(engine, cloud_build=True)
    finally:
        sh(tool, "network", "rm", "-f", earlier, ours, env=env, check=False)
        containers.EARLIER.clear()
        containers.EARLIER.update(noted)
    assert ours not in leftovers(engine)


# In the Cloud Build tests' unit (test_cloudbuild_rehearsal.py's mark), so that no build of theirs
# is running while this network exists.
@pytest.mark.xdist_group("cloud-build")
def test_a_cloud_build_network_left_by_the_run_is_counted_on_the_cloud_build_side_alone(engine):
    tool, env = engine
    cloud_build = f"{PREFIX}cloudbuild-{os.getpid()}"
    sh(tool, "network", "create", cloud_build, env=env)
    try:
        assert cloud_build not in leftovers(engine)
        assert cloud_build in leftovers(engine, cloud_build=True)
    finally:
        sh(tool, "network", "rm", "-f", cloud_build, env=env, check=False)
    assert cloud_build not in leftovers(engine, cloud_build=True)
