#!/usr/bin/env bash
# Regenerates the lock files from pyproject.toml: for the TensorFlow it pins, in place, or for
# another TensorFlow, as a throwaway set in a folder of its own.
#
#   bash scripts/supply_chain/lock.sh                                        every committed lock, in place
#   bash scripts/supply_chain/lock.sh --tensorflow 2.22.0rc0 --out DIR       the same locks for that TensorFlow, under DIR
#
# The locks are installed with `pip install --no-deps --require-hashes`, so they must be complete.
# With --tensorflow, pyproject.toml is copied and its TensorFlow pins (tensorflow-cpu, tensorflow)
# moved to that version; the packages released in step with TensorFlow follow it: tensorboard and
# keras take whatever that TensorFlow accepts, and tf-keras takes the release of the same minor, or
# is left out, with one line saying so, when the registry has none (tf-keras has lagged TensorFlow
# by weeks: tf-keras#857). A throwaway set never replaces the committed locks: --out is required.
# Then `scripts/setup_venv.sh DIR/.venv DIR/requirements/dev.lock` makes an environment from it.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
tensorflow="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tensorflow) tensorflow=${2:-}; [ -n "$tensorflow" ] || usage; shift 2 ;;
    --out) out=${2:-}; [ -n "$out" ] || usage; shift 2 ;;
    -h|--help) usage ;;
    *) echo "lock.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
pinned=$(sed -n 's/^cpu = \["tensorflow-cpu==\(.*\)"\]$/\1/p' pyproject.toml)
[ -n "$pinned" ] || { echo "lock.sh: pyproject.toml pins no tensorflow-cpu in its cpu extra" >&2; exit 2; }
if [ -n "$tensorflow" ] && [ "$tensorflow" != "$pinned" ] && [ -z "$out" ]; then
  echo "lock.sh: --tensorflow $tensorflow differs from pyproject.toml's $pinned: give --out DIR (a throwaway set never replaces the committed locks)" >&2
  exit 2
fi
# The images' Python minor, from the one place that names it (ARG PYTHON_MINOR in Dockerfile.cpu).
PYTHON_MINOR=$(sed -n 's/^ARG PYTHON_MINOR=//p' Dockerfile.cpu)
[ -n "$PYTHON_MINOR" ] || { echo "lock.sh: Dockerfile.cpu names no ARG PYTHON_MINOR" >&2; exit 2; }
# uv at requirements/uv.lock's pin, installed by its hashes when PATH has another (pinned_uv.sh).
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
uv=$(bash scripts/supply_chain/pinned_uv.sh "$tools/uv")
PATH="$(dirname "$uv"):$PATH"

# Where the locks go: the repo itself, or OUT with the same layout.
repo=$PWD root=$PWD
project=pyproject.toml
if [ -n "$out" ]; then
  mkdir -p "$out"
  root=$(cd "$out" && pwd)
  project="$root/pyproject.toml"
  cp pyproject.toml "$project"
fi
if [ -n "$tensorflow" ] && [ "$tensorflow" != "$pinned" ]; then
  minor=$(echo "$tensorflow" | sed -E 's/^([0-9]+\.[0-9]+).*/\1/')
  # Does the registry have a tf-keras for this TensorFlow's minor (a release candidate counts)?
  if echo "tf-keras==${minor}.*" | uv pip compile - --python-version "$PYTHON_MINOR" \
       --python-platform x86_64-manylinux_2_28 --prerelease allow --no-deps --no-header --quiet >/dev/null 2>&1; then
    tf_keras="tf-keras==${minor}.*"
  else
    tf_keras=""
    echo "lock.sh: the registry has no tf-keras for TensorFlow ${minor}: these locks leave tf-keras out" >&2
  fi
  # A release candidate may depend on keras-nightly instead of keras (2.22.0rc0 does). Both wheels
  # install the same `keras` package folder, so the runtime's own keras requirement goes, and
  # keras-nightly, TensorFlow's, is the one Keras in the lock.
  keras=keras
  if echo "tensorflow-cpu==${tensorflow}" | uv pip compile - --python-version "$PYTHON_MINOR" \
       --python-platform x86_64-manylinux_2_28 --prerelease allow --no-header --quiet 2>/dev/null \
       | grep -q '^keras-nightly=='; then
    keras=""
    echo "lock.sh: tensorflow-cpu ${tensorflow} depends on keras-nightly: these locks take it in place of keras" >&2
  fi
  python3 - "$project" "$tensorflow" "$tf_keras" "$keras" <<'PY'
import re, sys
path, version, tf_keras, keras = sys.argv[1:]
text = open(path).read()
text = re.sub(r'"(tensorflow(?:-cpu)?)==[^"]+"', rf'"\1=={version}"', text)
text = re.sub(r'"(keras|tensorboard)==[^"]+"', r'"\1"', text)  # whatever that TensorFlow accepts
if not keras:
    text = re.sub(r'\n *"keras",', "", text)
text = re.sub(r'\n *"tf-keras==[^"]+",', f'\n    "{tf_keras}",' if tf_keras else "", text)
open(path, "w").write(text)
PY
  echo "lock.sh: locking for tensorflow $tensorflow in $root (pyproject.toml's pins moved there)" >&2
fi

relative() { echo "${1#"$repo"/}"; }

compile() {  # compile OUTPUT EXTRA... (the overrides and constraints in ${options[@]})
  local output=$root/$1; shift
  local extras=()
  for extra in "$@"; do extras+=(--extra "$extra"); done
  mkdir -p "$(dirname "$output")"
  uv pip compile "$project" "${extras[@]}" \
    --python-version "$PYTHON_MINOR" --python-platform x86_64-manylinux_2_28 \
    --prerelease if-necessary-or-explicit --generate-hashes --no-header --quiet \
    "${options[@]}" -o "$output"
  echo "wrote $(relative "$output")"
}

standalone() {  # standalone INPUT OUTPUT: a list of its own, not from pyproject.toml
  mkdir -p "$(dirname "$root/$2")"
  uv pip compile "$1" --python-version "$PYTHON_MINOR" --python-platform x86_64-manylinux_2_28 \
    --generate-hashes --no-header --quiet -o "$root/$2"
  echo "wrote $(relative "$root/$2")"
}

# trim BASE_LOCK LOCK HEADER: keeps in LOCK only the packages BASE_LOCK lacks (an image installs
# LOCK on top of BASE_LOCK), and fails if a package both hold differs in version.
trim() {
  python3 - "$root/$1" "$root/$2" "$3" <<'PY'
import re, sys
def blocks(text):
    return {m.group(1).lower(): m.group(0) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+) .*?(?=^\S|\Z)", text, re.M | re.S)}
base_path, path, header = sys.argv[1:]
base, full = blocks(open(base_path).read()), blocks(open(path).read())
for name, block in full.items():
    if name in base and base[name].split()[0] != block.split()[0]:
        sys.exit(f"lock.sh: {block.split()[0]} differs from {base[name].split()[0]} in {base_path}")
open(path, "w").write(f"# {header}\n" + "".join(block for name, block in full.items() if name not in base))
PY
}

# The runtime images, CPU: tensorflow-cpu, without the `tensorflow` that tf-keras asks for.
options=(--override requirements/overrides.txt --override requirements/overrides-cpu.txt)
compile images/cpu/requirements.lock cpu
compile requirements/dev.lock cpu cassava test submit serving profile
# The prediction image: TensorFlow and the HTTP server alone (pyproject.toml's cpu and serving
# extras, not the runtime's Keras packages), at the CPU runtime's versions where both have a package.
mkdir -p "$root/images/serving"
python3 - "$project" > "$root/images/serving/requirements.in" <<'PY'
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
print("# Generated by scripts/supply_chain/lock.sh from pyproject.toml's cpu and serving extras.", *extras["cpu"], *extras["serving"], sep="\n")
PY
options+=(--constraint "$root/images/cpu/requirements.lock")
uv pip compile "$root/images/serving/requirements.in" --python-version "$PYTHON_MINOR" \
  --python-platform x86_64-manylinux_2_28 --prerelease if-necessary-or-explicit --generate-hashes --no-header \
  --quiet "${options[@]}" -o "$root/images/serving/requirements.lock"
rm "$root/images/serving/requirements.in"
echo "wrote $(relative "$root/images/serving/requirements.lock")"
# The cassava example's image, on the runtime image: compiled with the runtime's lock as
# constraints (a package both need is at its version), then trimmed to what that lock lacks.
compile images/cassava/requirements.lock cpu cassava
trim images/cpu/requirements.lock images/cassava/requirements.lock \
  "Installed on the runtime image, CPU or GPU (scripts/supply_chain/lock.sh checks both): what the cassava example adds to it."
# GPU runtime: the full `tensorflow` wheel and the pinned NVIDIA CUDA wheels it loads (pyproject.toml).
options=(--override requirements/overrides.txt)
compile images/gpu/requirements.lock gpu
# One cassava lock serves both devices: what cassava adds to the GPU lock must be the same packages
# at the same versions.
options+=(--constraint "$root/images/gpu/requirements.lock")
compile images/cassava/gpu-check.lock gpu cassava
trim images/gpu/requirements.lock images/cassava/gpu-check.lock "check"
python3 - "$root/images/cassava/requirements.lock" "$root/images/cassava/gpu-check.lock" <<'PY'
import re, sys
cpu, gpu = (set(re.findall(r"^([A-Za-z0-9._-]+==\S+)", open(path).read(), re.M)) for path in sys.argv[1:])
if cpu != gpu:
    sys.exit(f"lock.sh: cassava adds different packages to the CPU and GPU runtimes: CPU {sorted(cpu - gpu)}, GPU {sorted(gpu - cpu)}")
PY
rm "$root/images/cassava/gpu-check.lock"

# The images install wheels only (--only-binary=:all:): a package PyPI publishes only as a source
# distribution is pinned, in the images' locks, by the hash of the wheel built once from it
# (images/wheels/, scripts/supply_chain/build_wheel.sh), which the images install from there.
python3 - "$root" images/cpu/requirements.lock images/gpu/requirements.lock images/cassava/requirements.lock \
    images/serving/requirements.lock <<'PY'
import glob, hashlib, os, re, sys
root, locks = sys.argv[1], sys.argv[2:]
wheels = {}
for path in glob.glob("images/wheels/*.whl"):
    name, version = os.path.basename(path).split("-")[:2]
    wheels[(re.sub(r"[-_.]+", "-", name).lower(), version)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
for lock in locks:
    path = os.path.join(root, lock)
    text = open(path).read()
    def pin(match):
        key = (re.sub(r"[-_.]+", "-", match.group(1)).lower(), match.group(2))
        if key not in wheels:
            return match.group(0)
        return (f"{match.group(1)}=={match.group(2)} \\\n    --hash=sha256:{wheels[key]}\n"
                "    # the wheel built once from its sdist: images/wheels/ (scripts/supply_chain/build_wheel.sh)\n")
    text = re.sub(r"^([A-Za-z0-9._-]+)==(\S+) \\\n(?:    --hash=sha256:\w+(?: \\)?\n)+", pin, text, flags=re.M)
    open(path, "w").write(text)
PY

# Lists of their own: uv (setup_venv.sh's installer), the venvs' pip, Cloud Build's tools, the SBOM generators every image runs during its build (and
# then deletes), and Vertex AI's prebuilt prediction runtime's TensorFlow for the serving tests.
standalone requirements/uv.in requirements/uv.lock
standalone images/pip.in images/pip.lock
standalone images/cloudbuild-tools.in images/cloudbuild-tools.lock
standalone images/sbom/requirements.in images/sbom/requirements.lock
standalone requirements/serving-runtime.in requirements/serving-runtime.lock
