#!/usr/bin/env bash
# Runs the gpu test tier on a machine with an NVIDIA GPU and driver (a GPU VM, a workstation):
# a venv from the GPU image's own lock (TensorFlow with the pinned NVIDIA CUDA wheels), plus the
# pinned test runner, then `pytest -m gpu`. Without a GPU every test is skipped, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
venv=.venv-gpu
stamp=$venv/.lock-sha256
want=$(cat images/gpu/requirements.lock requirements/dev.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps --require-hashes -r images/gpu/requirements.lock
  # The test runner at the versions (and hashes) the dev lock pins.
  awk '/^(pytest|pytest-timeout|pluggy|iniconfig)==/{keep=1} /^[a-z]/ && !/^(pytest|pytest-timeout|pluggy|iniconfig)==/{keep=0} keep' \
    requirements/dev.lock > "$venv/test-runner.lock"
  "$venv/bin/pip" install --quiet --no-deps --require-hashes -r "$venv/test-runner.lock"
  echo "$want" > "$stamp"
fi
exec "$venv/bin/python" -m pytest tests/gpu "$@"
