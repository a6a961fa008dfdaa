"""Which steps may start: Cloud Build's `waitFor` ("Configure build step order": a step with
`waitFor: ["-"]` starts when the build starts, one with a list waits for those steps, one with no
`waitFor` waits for every step before it; cloud-build-local's build.go waitChansForStep reads it so).
Steps run concurrently as soon as what they wait for has succeeded. Pure functions."""

from __future__ import annotations

from typing import Iterable, Sequence

from scripts.rehearsal.cloudbuild.config import START, Step


def prerequisites(steps: Sequence[Step]) -> dict[int, frozenset[int]]:
    """Each step's direct prerequisites, by index."""
    by_id = {step.id: step.index for step in steps if step.id}
    needed = {}
    for step in steps:
        if step.wait_for is None:
            needed[step.index] = frozenset(range(step.index))
        else:
            needed[step.index] = frozenset(by_id[name] for name in step.wait_for if name != START)
    return needed


def ready(needed: dict[int, frozenset[int]], succeeded: Iterable[int], started: Iterable[int]) -> list[int]:
    """The steps not yet started whose prerequisites have all succeeded, in order."""
    succeeded, started = set(succeeded), set(started)
    return [index for index in sorted(needed) if index not in started and needed[index] <= succeeded]


def after(needed: dict[int, frozenset[int]]) -> dict[int, frozenset[int]]:
    """Each step's transitive prerequisites."""
    closed: dict[int, frozenset[int]] = {}

    def close(index: int) -> frozenset[int]:
        if index not in closed:
            found = set()
            for before in needed[index]:
                found |= {before} | close(before)
            closed[index] = frozenset(found)
        return closed[index]

    return {index: close(index) for index in needed}
