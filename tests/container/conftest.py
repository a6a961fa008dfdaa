"""The container tier's shared fixtures: the engine, and the images, built once per run.

An image fixture builds its image with scripts/supply_chain/images.sh, once for the whole run
whatever the number of workers (the `once` fixture, tests/parallel.py), holding the image's build
lock (build_lock). scripts/test.sh starts the same builds in the background as soon as the
container tools are installed, one after another, each under its image's lock, so most of the
building overlaps the setup and the other tiers; a fixture that comes after finds every layer
cached and its build takes seconds, and one that comes during waits for that image alone. The
fixture's own build is the one the tests rely on, whatever the background did.

The tier runs on one worker (tests/parallel.py, ENGINE). In it, the tests that need a GPU image
(the largest build, gigabytes of NVIDIA wheels) run after the others, so those run while it builds.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from containers import build_env, engine_settings, image_env, note_earlier_leftovers, sh
from helpers import BUDGETS
from parallel import locked

# The image fixtures of the GPU images, by image.
GPU_IMAGES = {"tf-runtime-gpu": "runtime_gpu_image", "cassava-trainer-gpu": "gpu_image"}


def build_lock(image: str) -> Path:
    """The lock a build of `image` holds, the tests' and scripts/test.sh's background builds alike:
    the same image is never built twice at once. (The stand-in base's script takes its own.)"""
    return Path(engine_settings()["IMAGES_WORK"]) / f"test-build-{image}.lock"


def needs_a_gpu_image(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return bool(set(item.fixturenames) & set(GPU_IMAGES.values())) or any(
        isinstance(value, str) and value in GPU_IMAGES for value in params.values())


def pytest_collection_modifyitems(items):
    """The container tests that need a GPU image move behind the tier's other tests, in the places
    the tier's tests hold (the tier stays one run of items, as tests/parallel.py ordered it)."""
    places = [index for index, item in enumerate(items) if Path(item.fspath).parent.name == "container"]
    tier = [items[index] for index in places]
    for index, item in zip(places, sorted(tier, key=needs_a_gpu_image)):
        items[index] = item


@pytest.fixture(scope="session")
def engine():
    settings = engine_settings()
    chosen = settings["ENGINE"], image_env(**{k: v for k, v in settings.items() if k != "ENGINE"})
    earlier = note_earlier_leftovers(chosen)
    if earlier:
        warnings.warn(f"{len(earlier)} things earlier rehearsals left on this machine are not this run's, "
                      f"and its leftover checks leave them out: {', '.join(sorted(earlier)[:5])}")
    return chosen


@pytest.fixture(scope="session")
def base_image(engine, once):
    if os.environ.get("BASE_IMAGE"):
        return os.environ["BASE_IMAGE"]

    def make():  # the script builds under a lock of its own, which a Cloud Build rehearsal's stand-ins take too
        return sh("scripts/supply_chain/standin_base.sh").stdout.strip().splitlines()[-1]

    return once("stand-in base image", make)


def built(image: str, base_image: str, timeout: int = 1800) -> str:
    asked = time.monotonic()
    with locked(build_lock(image)):
        started = time.monotonic()
        sh("scripts/supply_chain/images.sh", "build", image, env=build_env(base_image), timeout=timeout)
    waited = f" (after {started - asked:.0f}s waiting for the build in the background)" if started - asked >= 1 else ""
    BUDGETS.append(f"{image} build: {time.monotonic() - started:.0f}s{waited}")
    return f"localhost/{image}:test"


@pytest.fixture(scope="session")
def runtime_cpu_image(base_image, once):
    """tf-runtime-cpu: the runtime alone, entry point trainer.run."""
    return once("image tf-runtime-cpu", lambda: built("tf-runtime-cpu", base_image))


@pytest.fixture(scope="session")
def runtime_gpu_image(base_image, once):
    return once("image tf-runtime-gpu", lambda: built("tf-runtime-gpu", base_image, timeout=3000))


@pytest.fixture(scope="session")
def cpu_image(runtime_cpu_image, base_image, once):
    """cassava-trainer-cpu: the cassava example on the CPU runtime (its layers come from cache)."""
    return once("image cassava-trainer-cpu", lambda: built("cassava-trainer-cpu", base_image))


@pytest.fixture(scope="session")
def gpu_image(runtime_gpu_image, base_image, once):
    """cassava-trainer-gpu: the cassava example on the GPU runtime."""
    return once("image cassava-trainer-gpu", lambda: built("cassava-trainer-gpu", base_image, timeout=3000))


@pytest.fixture(scope="session")
def serving_image(base_image, once):
    """tf-predictor-cpu: the prediction server alone."""
    return once("image tf-predictor-cpu", lambda: built("tf-predictor-cpu", base_image))
