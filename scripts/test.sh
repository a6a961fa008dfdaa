#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite: unit, integration (real TensorFlow processes) and
# container (builds and runs the images) tiers. Arguments go to pytest, e.g. `-m unit`.
# On Debian/Ubuntu as root it also installs the daemonless container tools the container tier
# needs when no Docker daemon answers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
# Vertex AI's prebuilt prediction runtime's TensorFlow, which the serving tests load exports into.
./scripts/setup_venv.sh .venv-serving requirements/serving-runtime.lock
if ! (command -v docker >/dev/null && docker info >/dev/null 2>&1) && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  ./scripts/supply_chain/install_image_tools.sh
fi
exec .venv/bin/python -m pytest "$@"
