#!/usr/bin/env bash
# Prints the path of a uv at the version requirements/uv.lock pins, installing it by that lock's
# hashes into DIR when the uv on PATH is another version or there is none.
#
#   bash scripts/supply_chain/pinned_uv.sh DIR [LOCK]      LOCK: requirements/uv.lock by default
#
# lock.sh compiles every lock with it: a uv of another version resolves and writes the locks
# differently, and one fetched by name alone is whatever the index serves for that name.
# setup_venv.sh installs the same lock into each venv with pip.
set -euo pipefail

dir=${1:-}
lock=${2:-"$(dirname "$0")/../../requirements/uv.lock"}
[ -n "$dir" ] || { sed -n '2,5p' "$0" >&2; exit 2; }
[ -r "$lock" ] || { echo "pinned_uv.sh: no uv lock at $lock" >&2; exit 2; }
version=$(sed -n 's/^uv==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "pinned_uv.sh: $lock pins no uv (a line uv==VERSION with its hashes)" >&2; exit 2; }

is_pinned() { [ "$("$1" --version 2>/dev/null | cut -d' ' -f1-2)" = "uv $version" ]; }

if on_path=$(command -v uv) && is_pinned "$on_path"; then
  echo "$on_path"
  exit 0
fi
mkdir -p "$dir"
# --target puts the wheel's binary in DIR/bin.
if ! python3 -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes --target "$dir" \
     -r "$lock" 2>"$dir/pip.log"; then
  reason=$(grep -m1 -E "ERROR|THESE PACKAGES DO NOT MATCH" "$dir/pip.log" || true)
  echo "pinned_uv.sh: pip could not install uv $version by the hashes in $lock: ${reason:-see $dir/pip.log}" >&2
  exit 1
fi
rm -f "$dir/pip.log"
is_pinned "$dir/bin/uv" || { echo "pinned_uv.sh: $dir/bin/uv is not uv $version" >&2; exit 1; }
echo "$dir/bin/uv"
