#!/usr/bin/env bash
# Regenerates every lock file from pyproject.toml. Run after changing a dependency; commit the result.
# The locks are installed with `pip install --no-deps --require-hashes`, so they must be complete.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
command -v uv >/dev/null || python3 -m pip install --quiet "uv==${UV_VERSION}"

compile() {  # compile OUTPUT EXTRA...
  local output=$1; shift
  local extras=()
  for extra in "$@"; do extras+=(--extra "$extra"); done
  uv pip compile pyproject.toml "${extras[@]}" \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --prerelease explicit --generate-hashes --no-header --quiet \
    "${overrides[@]}" -o "$output"
  echo "wrote $output"
}

# CPU environments: tensorflow-cpu, without the `tensorflow` that tf-keras asks for.
overrides=(--override requirements/overrides.txt --override requirements/overrides-cpu.txt)
compile images/cpu/requirements.lock cpu
compile requirements/dev.lock cpu test submit profile
# GPU image: the full `tensorflow` wheel and the pinned NVIDIA CUDA wheels it loads (pyproject.toml).
overrides=(--override requirements/overrides.txt)
compile images/gpu/requirements.lock gpu
# Vertex AI's prebuilt prediction runtime's TensorFlow, for the serving tests: a standalone list.
uv pip compile requirements/serving-runtime.in --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --generate-hashes --no-header --quiet -o requirements/serving-runtime.lock
echo "wrote requirements/serving-runtime.lock"
