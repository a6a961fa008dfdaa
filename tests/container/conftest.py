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
    return sh("scripts/supply_chain/standin_base.sh").stdout.strip().splitlines()[-1]


def built(image: str, base_image: str, timeout: int = 1800) -> str:
    started = time.monotonic()
    sh("scripts/supply_chain/images.sh", "build", image, env=build_env(base_image), timeout=timeout)
    BUDGETS.append(f"{image} build: {time.monotonic() - started:.0f}s")
    return f"localhost/{image}:test"


@pytest.fixture(scope="session")
def runtime_cpu_image(base_image):
    """tf-runtime-cpu: the runtime alone, entry point trainer.run."""
    return built("tf-runtime-cpu", base_image)


@pytest.fixture(scope="session")
def runtime_gpu_image(base_image):
    return built("tf-runtime-gpu", base_image, timeout=3000)


@pytest.fixture(scope="session")
def cpu_image(runtime_cpu_image, base_image):
    """cassava-trainer-cpu: the cassava example on the CPU runtime (its layers come from cache)."""
    return built("cassava-trainer-cpu", base_image)


@pytest.fixture(scope="session")
def gpu_image(runtime_gpu_image, base_image):
    """cassava-trainer-gpu: the cassava example on the GPU runtime."""
    return built("cassava-trainer-gpu", base_image, timeout=3000)


@pytest.fixture(scope="session")
def serving_image(base_image):
    """tf-predictor-cpu: the prediction server alone."""
    return built("tf-predictor-cpu", base_image)
