"""The input-bound signal (trainer.library.input_wait): after each epoch the chief says what share of the
training time the steps waited for their batches, and whether that makes the job input-bound.

Real jobs through trainer.launch, MultiWorkerMirrored and ParameterServer:
- a deliberately slow pipeline: the small model (milliseconds a step at 32 px) reading its
  examples from a bucket of the local Cloud Storage server that answers every request after
  SLOW_REQUEST_SECONDS, one example per file, never cached: each batch takes about a second to
  arrive, so the steps wait for nearly all of it;
- a healthy one: ResNet50 (a fraction of a second a step) on local generated JPEGs that decode at
  a reduced scale in about a millisecond, cached after the first pass.
Each side is an order of magnitude from the line (INPUT_BOUND_SHARE, 0.2), so neither depends on
how fast this machine is.
"""

from __future__ import annotations

import re

import pytest

from helpers import FLOAT32, REPO, RESNET50_TWO_WORKERS, clean_env, launch_cassava

SLOW_REQUEST_SECONDS = 1.0
SLOW_FILES = 32
LINE = re.compile(r"^\[chief-0\] \S+ trainer: epoch (\d+)/(\d+) input: the steps waited (\d+\.\d) s of (\d+\.\d) s "
                  r"for their batches \((\d+)%\): (input-bound|not input-bound)", re.M)


def input_lines(output: str) -> list[tuple[int, float, float, int, str]]:
    """(epoch, seconds waited, seconds trained, percent, verdict) from the chief's input lines."""
    return [(int(e), float(w), float(t), int(p), v) for e, _, w, t, p, v in LINE.findall(output)]


_WRITE_FILES = """
import sys
import numpy as np
import trainer, tensorflow as tf
from cassava import records, synthetic
directory, count = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
examples = ((tf.io.encode_jpeg(synthetic.make_image(rng, i % 5, (48, 48))).numpy(), i % 5, f"far-{i:03d}")
            for i in range(count))
paths, written = records.write_shards(examples, directory, "train", count)
print("wrote", written)
"""


@pytest.fixture(scope="module")
def far_bucket(gcs_server, tmp_path_factory):
    """gs://far-data/train-*.tfrecord: SLOW_FILES files of one small JPEG each (5 classes)."""
    import subprocess
    import sys

    directory = tmp_path_factory.mktemp("far")
    result = subprocess.run([sys.executable, "-c", _WRITE_FILES, str(directory), str(SLOW_FILES)], cwd=REPO,
                            env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and f"wrote {SLOW_FILES}" in result.stdout, result.stderr[-3000:]
    gcs_server.create_bucket("far-data")
    for path in sorted(directory.glob("train-*.tfrecord")):
        gcs_server.upload("far-data", path.name, path.read_bytes())
    return "gs://far-data/train-*.tfrecord"


@pytest.fixture
def slow_bucket(gcs, far_bucket):
    """The bucket, every request answered after SLOW_REQUEST_SECONDS while the test runs."""
    gcs.front.latency_seconds = SLOW_REQUEST_SECONDS
    yield far_bucket
    gcs.front.latency_seconds = 0.0


SLOW = ["--architecture", "small", "--weights", "none", "--image-size", "32", "--per-replica-batch-size", "4",
        "--cache-images", "never", "--epochs", "2", "--steps-per-epoch", "16", *FLOAT32]
HEALTHY = RESNET50_TWO_WORKERS


def launch(tmp_path, *args, ps: int = 0, env: dict | None = None) -> str:
    result = launch_cassava(tmp_path, *args, ps=ps, env=env)
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


def assert_verdicts(output: str, epochs: int, input_bound: bool) -> None:
    lines = input_lines(output)
    assert [epoch for epoch, *_ in lines] == list(range(1, epochs + 1)), output[-3000:]
    for epoch, waited, trained, percent, verdict in lines:
        # A wait is part of the step it delays (trainer.library.input_wait), whatever the load: never more.
        assert 0 <= waited <= trained and 0 <= percent <= 100
        assert verdict == ("input-bound" if input_bound else "not input-bound"), lines
    # Only the chief says it, once per epoch, after the epoch's metrics.
    assert not re.search(r"^\[(worker|ps)-\d\] .* input: ", output, re.M)


def test_a_job_fed_by_a_slow_pipeline_says_it_is_input_bound(tmp_path, slow_bucket, gcs):
    output = launch(tmp_path, "--dataset", f"tfrecord:{slow_bucket}", *SLOW, env=clean_env(**gcs.environ()))
    assert_verdicts(output, 2, input_bound=True)
    assert re.search(r"input-bound, the input pipeline sets the pace \(a faster one could make this epoch's steps "
                     r"up to x\d+\.\d faster\)$", output, re.M)


def test_a_healthy_job_says_it_is_not_input_bound(resnet50_two_worker_job):
    """The healthy MultiWorkerMirrored job is the run's shared ResNet50 job (HEALTHY's settings,
    tests/integration/conftest.py), which test_mwms also reads."""
    job = resnet50_two_worker_job
    assert job["returncode"] == 0, job["stdout"][-4000:]
    assert_verdicts(job["stdout"], 2, input_bound=False)


def test_a_parameter_server_job_fed_by_a_slow_pipeline_says_it_is_input_bound(tmp_path, slow_bucket, gcs):
    # Every ParameterServer worker reads the whole dataset, and its pipeline reads ahead while the
    # coordinator ends an epoch: with 48 steps each worker reads three passes an epoch, so every
    # epoch waits on the bucket for at least two of them.
    output = launch(tmp_path, "--dataset", f"tfrecord:{slow_bucket}", *SLOW, "--steps-per-epoch", "48", ps=1,
                    env=clean_env(**gcs.environ()))
    assert "strategy=parameter_server workers=2 ps=1" in output
    assert_verdicts(output, 2, input_bound=True)


def test_a_healthy_parameter_server_job_says_it_is_not_input_bound(tmp_path, data_root):
    output = launch(tmp_path, "--data-dir", str(data_root), *HEALTHY, ps=1)
    assert "strategy=parameter_server workers=2 ps=1" in output
    assert_verdicts(output, 2, input_bound=False)
