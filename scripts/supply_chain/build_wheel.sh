#!/usr/bin/env bash
# Builds, once, the wheel of a locked package that PyPI publishes only as a source distribution, so
# that no image build ever runs a package's own setup.py (every `pip install` in the images takes
# wheels only: --only-binary=:all:). The wheel is committed under images/wheels/, and the locks
# pin it by its hash (scripts/supply_chain/lock.sh writes that hash in place of the sdist's).
#
#   bash scripts/supply_chain/build_wheel.sh promise==2.3            build it into images/wheels/
#   bash scripts/supply_chain/build_wheel.sh --check promise==2.3    build it again and compare, byte for byte
#
# The source distribution is the one the locks name, checked against its hash in requirements/dev.lock;
# it is built with no network access to anything but that file, by the setuptools and wheel the
# runtime's lock pins (hash-checked, in a throwaway venv, no build isolation), with every timestamp
# set to SOURCE_DATE_EPOCH, so the same inputs give the same bytes: --check proves it.
set -euo pipefail
cd "$(dirname "$0")/../.."
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
requirement=${1:?"usage: build_wheel.sh [--check] NAME==VERSION"}
name=${requirement%%==*} version=${requirement#*==}
[ "$name" != "$requirement" ] && [ -n "$version" ] || { echo "build_wheel.sh: give NAME==VERSION, got '$requirement'" >&2; exit 2; }
# 2020-01-01: any fixed instant; wheel's zip timestamps cannot be earlier than 1980.
export SOURCE_DATE_EPOCH=1577836800 PYTHONHASHSEED=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sdist's hash, from the development lock (which installs it from PyPI as it is).
sdist_hash=$(python3 - "$name" "$version" <<'PY'
import re, sys
name, version = sys.argv[1:]
text = open("requirements/dev.lock").read()
block = re.search(rf"^{re.escape(name)}=={re.escape(version)} \\\n((?:\s+--hash=sha256:\w+ ?\\?\n?)+)", text, re.M | re.I)
if not block:
    sys.exit(f"build_wheel.sh: requirements/dev.lock has no {name}=={version}")
print(" ".join(f"--hash=sha256:{h}" for h in re.findall(r"sha256:(\w+)", block.group(1))))
PY
)
printf '%s==%s %s\n' "$name" "$version" "$sdist_hash" > "$work/sdist.txt"
python3 -m pip download --quiet --no-deps --no-binary=:all: --require-hashes -r "$work/sdist.txt" -d "$work/sdist"
# The build tools: the runtime lock's setuptools and wheel, by hash.
grep -A3 -E '^(setuptools|wheel)==' images/cpu/requirements.lock | grep -E '^(setuptools|wheel)==|--hash' \
  | sed 's/ \\$//' | awk '/==/{if (line) print line; line=$0; next} {line=line" "$1} END{print line}' > "$work/tools.txt"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --no-deps --require-hashes --only-binary=:all: -r "$work/tools.txt"
mkdir -p "$work/out"
"$work/venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --no-index -w "$work/out" "$work"/sdist/*
built=$(ls "$work"/out/*.whl)
if [ "$check" = 1 ]; then
  committed="images/wheels/$(basename "$built")"
  if cmp -s "$built" "$committed"; then
    echo "build_wheel.sh: $(basename "$built") rebuilt byte for byte ($(sha256sum "$built" | cut -c1-64))"
  else
    echo "build_wheel.sh: $(basename "$built") rebuilt differs from $committed" >&2
    exit 1
  fi
else
  cp "$built" images/wheels/
  echo "images/wheels/$(basename "$built") sha256:$(sha256sum "$built" | cut -c1-64)"
fi
