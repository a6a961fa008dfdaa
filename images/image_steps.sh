#!/usr/bin/env bash
# The steps every image's Dockerfile runs the same way (Dockerfile.cpu, Dockerfile.gpu,
# images/serving/Dockerfile), as root, each from its own RUN so that the layers stay where they
# were: the dependencies before the code.
#
#   bash image_steps.sh venv LOCK [OWNER]   /opt/venv from images/pip.lock (beside this script) and LOCK
#   bash image_steps.sh strip               no packaging tool in /usr/local, no setuid or setgid file
#   bash image_steps.sh sbom                /opt/sbom/os.spdx.json and /opt/sbom/python.cdx.json
#
# Each step reads the files it needs from the folder this script was copied to (pip.lock, and for
# sbom the SBOM tools' requirements.lock and python_sbom.py) and deletes nothing of its own: the
# Dockerfile's RUN removes that folder at its end. PYTHON_MINOR (the Dockerfile's ARG) is checked.
#
# Every pip install takes wheels only (--only-binary=:all:): no package's setup.py runs in a build.
# The one locked package PyPI publishes only as a source distribution (promise, for TensorFlow
# Datasets) comes as the wheel built once from it (images/wheels/, scripts/supply_chain/build_wheel.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/local/bin/python3
pip_options=(--no-deps --require-hashes --only-binary=:all:)

check_minor() {
  "$1" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '${PYTHON_MINOR:?PYTHON_MINOR is the Dockerfile ARG}', sys.version"
}

# The venv, from hash-pinned locks. Its pip first, alone: the base's pip (24.0 in the official
# 3.11 images, with five advisories) installs nothing but its successor (images/pip.lock) into a
# venv made without ensurepip's bundled pip and setuptools, and that pip installs the rest.
# --no-deps: the locks are complete. The deletions drop what no job loads: TensorFlow's C++ headers
# (290 MB, for building custom ops), libclang (TensorFlow's build-time bindings generator), the
# packages' own test folders, pip's caches. OWNER (uid 1000 in the training images) gets the venv:
# a user image's `pip install` (gcloud's autopackaging of a requirements.txt) runs as the image's user.
venv() {
  local lock=${1:?venv needs a lock} owner=${2:-} site
  "$python" -m venv --without-pip /opt/venv
  "$python" -m pip --python /opt/venv/bin/python install --quiet "${pip_options[@]}" -r "$here/pip.lock"
  /opt/venv/bin/pip install "${pip_options[@]}" -r "$lock"
  site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$site/tensorflow/include" "$site/clang" "$site"/libclang-* /root/.cache
  find /opt/venv -depth -type d -name tests -path '*/site-packages/*/tests' -prune -exec rm -rf {} +
  [ -z "$owner" ] || chown -R "$owner:$owner" /opt/venv
  check_minor /opt/venv/bin/python
}

# No packaging tool the job does not need, and none in a version with a known advisory: the official
# python images install pip (and, below 3.12, setuptools, which vendors wheel and jaraco.context)
# into /usr/local and keep ensurepip's wheels; none of them runs in a job, each has had advisories
# (docs/images.md#no-tool-the-job-does-not-need). The venv keeps its own pip (images/pip.lock).
# Files dpkg owns are left alone, so the OS SBOM stays true. Then no file keeps a setuid or setgid
# bit: a job never changes user, and such a file is how a process would.
strip() {
  local stdlib site left
  stdlib=$("$python" -I -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
  site=$("$python" -I -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  rm -rf "$site"/pip "$site"/pip-*.dist-info "$site"/setuptools "$site"/setuptools-*.dist-info \
         "$site"/pkg_resources "$site"/_distutils_hack "$site"/distutils-precedence.pth \
         "$site"/wheel "$site"/wheel-*.dist-info "$stdlib"/ensurepip/_bundled/*.whl \
         /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel
  left=$("$python" -I -c 'import importlib.util as u; print(*[m for m in ("pip", "setuptools", "wheel") if u.find_spec(m)])')
  [ -z "$left" ] || { echo "image_steps strip: still importable from $python: $left" >&2; exit 1; }
  find / -xdev -type f -perm /6000 -exec chmod ug-s {} +
  left=$(find / -xdev -type f -perm /6000)
  [ -z "$left" ] || { echo "image_steps strip: setuid or setgid still set on: $left" >&2; exit 1; }
}

# The SBOM of the whole image (docs/images.md#sbom), taken when its last package is in: dpkg's
# packages (SPDX, by distro2sbom, pinned in images/sbom/requirements.lock, installed by the venv's
# pip into a throwaway venv, deleted here) and every Python distribution on disk, in the venv, in
# /usr/local, vendored inside other packages, every wheel file and the interpreter itself
# (CycloneDX, images/sbom/python_sbom.py, run by the base's interpreter in isolated mode).
sbom() {
  local tools
  tools=$(mktemp -d)
  "$python" -m venv --without-pip "$tools"
  /opt/venv/bin/pip --python "$tools/bin/python" install --quiet "${pip_options[@]}" -r "$here/sbom-requirements.lock"
  mkdir -p /opt/sbom
  # shellcheck disable=SC1091
  . /etc/os-release
  "$tools/bin/distro2sbom" --distro deb --system --name "${ID}" --release "${VERSION_ID}" \
    --sbom spdx --format json -o /opt/sbom/os.spdx.json
  rm -rf "$tools" /root/.cache
  "$python" -I "$here/python_sbom.py" / > /opt/sbom/python.cdx.json
}

step=${1:-}
shift || true
case "$step" in
  venv) venv "$@" ;;
  strip) strip ;;
  sbom) sbom ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
