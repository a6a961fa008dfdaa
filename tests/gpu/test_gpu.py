"""The GPU tier: runs wherever this Python's TensorFlow sees a GPU, and is skipped (with the
reason) everywhere else. On a GPU VM: `bash scripts/test_gpu.sh` (a venv from the GPU image's own
lock); on Vertex AI: `scripts/submit_job.py vertex --self-check ...` runs the same checks in the
image. What it proves: Conv2D + model.fit trains (cuDNN autotuning), a ResNet50 step runs in the
default mixed precision under XLA (ptxas, libdevice), and MultiWorkerMirrored trains in one
process over every local GPU (NCCL)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO, clean_env


@pytest.fixture(scope="module")
def gpus() -> int:
    probe = subprocess.run([sys.executable, "-c", "import trainer, tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"],
                           capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300)
    count = int(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 and probe.stdout.strip() else 0
    if count == 0:
        pytest.skip(f"no GPU visible to TensorFlow in {sys.executable} (a CPU-only TensorFlow, or no NVIDIA driver)")
    return count


@pytest.fixture(scope="module")
def selfcheck(gpus) -> str:
    result = subprocess.run([sys.executable, "-m", "trainer.selfcheck", "--steps", "5"], capture_output=True, text=True,
                            cwd=REPO, env=clean_env(), timeout=3600)  # an H100 may JIT-compile for a long time
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_the_cuda_stack_is_one_tensorflow_trains_on(selfcheck):
    assert re.search(r"^  cudnn +9\.(2[4-9]|[3-9]\d)\.\d+ ", selfcheck, re.M), selfcheck
    assert re.search(r"^driver: \d+\.\d+", selfcheck, re.M)


def test_conv2d_model_fit_trains_in_float32(selfcheck):
    assert re.search(r"^resnet50 train step, float32 +\d+\.\d images/s", selfcheck, re.M)


def test_resnet50_step_in_mixed_precision_under_xla(selfcheck):
    match = re.search(r"^resnet50 train step, (mixed_float16|float32) \+ XLA +(\d+\.\d) images/s", selfcheck, re.M)
    assert match, selfcheck
    if "compute capability 6." not in selfcheck:  # tensor cores: auto picks float16
        assert match.group(1) == "mixed_float16"


def test_multi_worker_mirrored_over_every_local_gpu(selfcheck, gpus):
    assert re.search(rf"^multi_worker_mirrored: 1 worker, {gpus} local replica\(s\) \(GPUs, NCCL\), 3 steps, loss \d",
                     selfcheck, re.M), selfcheck
