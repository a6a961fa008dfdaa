"""The rehearsal tests' leftover check (tests/containers.py) counts what this run left, not what
an earlier run on the same machine did: CI's machines are shared with other checkouts, and a killed
run of one of them once failed forty of this tier's tests with its containers."""

from __future__ import annotations

import os

import containers
from containers import leftovers, note_earlier_leftovers, sh
from scripts.rehearsal.session import PREFIX


def test_a_network_left_before_the_run_is_left_out_and_one_left_by_the_run_is_named(engine):
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
    finally:
        sh(tool, "network", "rm", "-f", earlier, ours, env=env, check=False)
        containers.EARLIER.clear()
        containers.EARLIER.update(noted)
    assert ours not in leftovers(engine)
