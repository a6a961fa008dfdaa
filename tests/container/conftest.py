"""The container tier's shared fixtures: the engine, and the images built once per session."""

from __future__ import annotations

import os
import time

import pytest

from containers import build_env, engine_settings, image_env, sh
from helpers import BUDGETS


@pytest.fixture(scope="session")
def engine():
    settings = engine_settings()
    return settings["ENGINE"], image_env(**{k: v for k, v in settings.items() if k != "ENGINE"})


@pytest.fixture(scope="session")
def base_image(engine):
    if os.environ.get("BASE_IMAGE"):
        return os.environ["BASE_IMAGE"]
    return sh("scripts/standin_base.sh").stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def cpu_image(base_image):
    started = time.monotonic()
    sh("scripts/images.sh", "build", "cpu", env=build_env(base_image))
    BUDGETS.append(f"CPU image build: {time.monotonic() - started:.0f}s")
    return "localhost/cassava-trainer-cpu:test"


@pytest.fixture(scope="session")
def gpu_image(base_image):
    started = time.monotonic()
    sh("scripts/images.sh", "build", "gpu", env=build_env(base_image), timeout=3000)
    BUDGETS.append(f"GPU image build: {time.monotonic() - started:.0f}s")
    return "localhost/cassava-trainer-gpu:test"


@pytest.fixture(scope="session")
def serving_image(cpu_image, base_image):
    """The prediction image, built after the CPU image so that it reuses its base and TensorFlow layers."""
    started = time.monotonic()
    sh("scripts/images.sh", "build", "serving", env=build_env(base_image))
    BUDGETS.append(f"prediction image build (after the CPU image): {time.monotonic() - started:.0f}s")
    return "localhost/cassava-trainer-serving:test"
