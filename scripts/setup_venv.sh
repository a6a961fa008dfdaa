#!/usr/bin/env bash
# Creates a virtual environment in the repo root from a hash-pinned lock:
#   scripts/setup_venv.sh                      .venv from requirements/dev.lock (CPU TensorFlow, test and submit tools)
#   scripts/setup_venv.sh DIR LOCK             DIR from LOCK (the tests' .venv-serving, say)
# Idempotent: a venv whose recorded lock hash matches is reused as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv}
lock=${2:-requirements/dev.lock}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
  echo "setup_venv: Python 3.11 is required (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
}

stamp=$venv/.lock-sha256
# The lock and the installer's: a venv another installer put together is made again.
want=$(cat "$lock" requirements/uv.lock | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

"$PYTHON" -m venv "$venv"
# uv puts the lock together, pip only uv itself: from empty caches uv took 31 s where pip took 74 s
# for the dev lock on a 2-core EPYC (both compiling the bytecode, which every test process would
# otherwise compile anew where PYTHONDONTWRITEBYTECODE is set). uv reads no pip configuration: a
# private index is UV_DEFAULT_INDEX. (The grep drops pip's warnings about this machine's optional
# local mirrors.)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-deps --require-hashes -r requirements/uv.lock 2> >(grep -v "is ignored: it is neither" >&2)
# --no-deps: the lock is complete, and the dev lock deliberately omits the `tensorflow` that
# tf-keras declares (tensorflow-cpu provides it); resolving would install both wheels.
"$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps --require-hashes \
  --compile-bytecode -r "$lock"
echo "$want" > "$stamp"
echo "setup_venv: $venv ready ($("$venv/bin/python" -c 'import tensorflow as tf; print("tensorflow", tf.__version__)' 2>/dev/null))"
