#!/usr/bin/env bash
# Sets up what the tests need and runs them on every core: the unit, integration (real TensorFlow
# processes) and container (builds and runs the images) tiers. Arguments go to pytest.
#
#   bash scripts/test.sh               everything, as CI runs it
#   bash scripts/test.sh --quick       before a commit: the unit tier and the fast integration tests (under 5 minutes)
#   bash scripts/test.sh -m unit       any pytest selection (-n 0: one process)
#
# Side by side: .venv, .venv-serving (Vertex AI's prebuilt prediction runtime's TensorFlow, which
# the serving tests load exports into) and, on Debian/Ubuntu as root when no Docker daemon answers,
# the daemonless container tools. A run of everything then builds the container tier's images in
# the background, under the lock the tests' own builds take (tests/container/conftest.py), while the
# venvs finish and the other tiers run. pytest-xdist runs the tests (tests/parallel.py). Each step's
# time and the whole run's are printed; pytest's summary says where the tests' time went.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
logs=$(mktemp -d "${TMPDIR:-/tmp}/test-sh.XXXXXX")

quick=false
for argument in "$@"; do [ "$argument" = --quick ] && quick=true; done

# One week of OS updates for the whole run: images.sh otherwise takes the ISO week at each build,
# and a run that crossed Monday 00:00 UTC built its later images on the new week, from the OS
# layer up, where a test expected the cache (a trainer-only rebuild's test failed so, issue 53).
export OS_UPDATES=${OS_UPDATES:-$(date -u +%G-W%V)}

# step NAME COMMAND...: runs COMMAND, its output kept in $logs/NAME.log; prints its time, and on
# failure its last lines.
step() {
  local name=$1 began=$SECONDS code=0
  shift
  "$@" >"$logs/$name.log" 2>&1 || code=$?
  grep -v "is ignored: it is neither" "$logs/$name.log" | grep -E "^(setup_venv|install_image_tools|test.sh):" || true
  if [ "$code" -eq 0 ]; then
    echo "test.sh: $name: $((SECONDS - began)) s"
  else
    echo "test.sh: $name failed (exit $code) after $((SECONDS - began)) s; its last lines ($logs/$name.log):" >&2
    tail -n 40 "$logs/$name.log" >&2
  fi
  return "$code"
}

# The images the container tier builds, in the order its tests first need them (the GPU images'
# tests run last: tests/container/conftest.py), each under the lock the tests' build of it takes.
prebuild_images() {
  source scripts/supply_chain/engine.sh
  local base=${BASE_IMAGE:-}
  [ -n "$base" ] || base=$(scripts/supply_chain/standin_base.sh | tail -n 1)  # under its own lock
  for image in tf-runtime-cpu cassava-trainer-cpu tf-predictor-cpu tf-runtime-gpu cassava-trainer-gpu; do
    BASE_IMAGE=$base TAG=test flock "$IMAGES_WORK/test-build-$image.lock" scripts/supply_chain/images.sh build "$image"
  done
}

step venv ./scripts/setup_venv.sh &
venv=$!
step serving-venv ./scripts/setup_venv.sh .venv-serving requirements/serving-runtime.lock &
serving=$!
prebuild=""
if ! $quick; then
  if ! (command -v docker >/dev/null && docker info >/dev/null 2>&1) && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step image-tools ./scripts/supply_chain/install_image_tools.sh || exit 1
  fi
  # PREBUILD_IMAGES=1 or 0 decides; by default a run with no arguments (everything) builds ahead.
  whole=0
  [ $# -eq 0 ] && whole=1
  if [ "${PREBUILD_IMAGES:-$whole}" = 1 ] && python3 scripts/rehearsal/engine.py >/dev/null 2>&1; then
    # Its line is printed after the tests' (it ends while they run).
    step images-in-background prebuild_images >"$logs/images-in-background.said" 2>&1 &
    prebuild=$!
  fi
fi
wait "$venv" || exit 1
wait "$serving" || exit 1
echo "test.sh: setup: $((SECONDS - started)) s"

tests_began=$SECONDS
code=0
# One worker more than the cores: most tests start processes and wait on them (a job's tasks, a
# container, a build, a server), and with one worker a core each the cores sat idle 12 % of a run
# (from nothing on 2 cores: 32.6 min with 3 workers against 38.8 with 2, issue 53).
workers=${TEST_WORKERS:-$(($(nproc) + 1))}
.venv/bin/python -m pytest -n "$workers" --dist loadscope "$@" || code=$?
if [ -n "$prebuild" ]; then
  # Its images were the tests' too: by now they have waited for it. A failure is the tests' to report.
  wait "$prebuild" || echo "test.sh: the background image builds failed; the tests built what they needed themselves"
  cat "$logs/images-in-background.said"
fi
echo "test.sh: $((SECONDS - started)) s in all: setup $((tests_began - started)) s, tests $((SECONDS - tests_began)) s (exit $code)"
# The steps' logs are kept for a run that failed, and named in its output; a green run leaves none.
[ "$code" -ne 0 ] || rm -rf "$logs"
exit "$code"
