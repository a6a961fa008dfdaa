#!/usr/bin/env bash
# Regenerates every lock file from pyproject.toml. Run after changing a dependency; commit the result.
# The locks are installed with `pip install --no-deps --require-hashes`, so they must be complete.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
# The images' Python minor, from the one place that names it (ARG PYTHON_MINOR in Dockerfile.cpu).
PYTHON_MINOR=$(sed -n 's/^ARG PYTHON_MINOR=//p' Dockerfile.cpu)
[ -n "$PYTHON_MINOR" ] || { echo "lock.sh: Dockerfile.cpu names no ARG PYTHON_MINOR" >&2; exit 2; }
command -v uv >/dev/null || python3 -m pip install --quiet "uv==${UV_VERSION}"

compile() {  # compile OUTPUT EXTRA...
  local output=$1; shift
  local extras=()
  for extra in "$@"; do extras+=(--extra "$extra"); done
  uv pip compile pyproject.toml "${extras[@]}" \
    --python-version "$PYTHON_MINOR" --python-platform x86_64-manylinux_2_28 \
    --prerelease explicit --generate-hashes --no-header --quiet \
    "${overrides[@]}" -o "$output"
  echo "wrote $output"
}

# CPU environments: tensorflow-cpu, without the `tensorflow` that tf-keras asks for.
overrides=(--override requirements/overrides.txt --override requirements/overrides-cpu.txt)
compile images/cpu/requirements.lock cpu
compile requirements/dev.lock cpu test submit serving profile
# The prediction image: the CPU image's lock as it is, then only what the server adds. Compiled with
# the CPU lock as constraints (so a package both need is at the CPU lock's version), and trimmed to
# the packages the CPU lock lacks: images/serving/Dockerfile installs the two in that order.
overrides+=(--constraint images/cpu/requirements.lock)
compile images/serving/requirements.lock cpu serving
python3 - images/cpu/requirements.lock images/serving/requirements.lock <<'PY'
import re, sys
def blocks(text):
    return {m.group(1).lower(): m.group(0) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+) .*?(?=^\S|\Z)", text, re.M | re.S)}
cpu, full = (blocks(open(path).read()) for path in sys.argv[1:])
for name, block in full.items():
    if name in cpu and cpu[name].split()[0] != block.split()[0]:
        sys.exit(f"lock.sh: {block.split()[0]} differs from the CPU lock's {cpu[name].split()[0]}")
kept = [block for name, block in full.items() if name not in cpu]
open(sys.argv[2], "w").write("# Installed after images/cpu/requirements.lock (scripts/lock.sh): what the server adds to it.\n"
                             + "".join(kept))
PY
# GPU image: the full `tensorflow` wheel and the pinned NVIDIA CUDA wheels it loads (pyproject.toml).
overrides=(--override requirements/overrides.txt)
compile images/gpu/requirements.lock gpu
# The SBOM generators every image runs during its build and then deletes: a standalone list too.
uv pip compile images/sbom/requirements.in --python-version "$PYTHON_MINOR" --python-platform x86_64-manylinux_2_28 \
  --generate-hashes --no-header --quiet -o images/sbom/requirements.lock
echo "wrote images/sbom/requirements.lock"
# Vertex AI's prebuilt prediction runtime's TensorFlow, for the serving tests: a standalone list.
uv pip compile requirements/serving-runtime.in --python-version "$PYTHON_MINOR" --python-platform x86_64-manylinux_2_28 \
  --generate-hashes --no-header --quiet -o requirements/serving-runtime.lock
echo "wrote requirements/serving-runtime.lock"
