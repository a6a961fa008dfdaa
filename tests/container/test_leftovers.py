"""The rehearsal tests' leftover check (tests/containers.py) counts what this run left, not what
an earlier run on the same machine did: CI's machines are shared with other checkouts, and a killed
run of one of them once failed forty of this tier's tests with its containers."""

from __future__ import annotations

import os

import containers
from containers import leftovers, note_earlier_leftovers, sh
from scripts.rehearsal.session import PREFIX


def test_a_network_left_before_the_run_is_left_out_and_one_left_by_the_run_is_named_on_its_side(engine):
    """Also: a Cloud Build rehearsal's network is counted by the Cloud Build tests' check alone."""
    tool, env = engine
    earlier, ours = f"{PREFIX}earlier-{os.getpid()}", f"{PREFIX}this-run-{os.getpid()}"
    cloud_build = f"{PREFIX}cloudbuild-{os.getpid()}"
    noted = set(containers.EARLIER)
    sh(tool, "network", "create", earlier, env=env)
    try:
        assert earlier in leftovers(engine)  # nothing noted yet: it counts
        assert earlier in note_earlier_leftovers(engine)
        sh(tool, "network", "create", ours, env=env)
        left = leftovers(engine)
        assert earlier not in left and ours in left
        # A Cloud Build rehearsal's (its tests run beside the others): counted on its own side only.
        sh(tool, "network", "create", cloud_build, env=env)
        assert cloud_build not in leftovers(engine) and ours not in leftovers(engine, cloud_build=True)
        assert cloud_build in leftovers(engine, cloud_build=True)
    finally:
        sh(tool, "network", "rm", "-f", earlier, ours, cloud_build, env=env, check=False)
        containers.EARLIER.clear()
        containers.EARLIER.update(noted)
    assert ours not in leftovers(engine) and cloud_build not in leftovers(engine, cloud_build=True)
