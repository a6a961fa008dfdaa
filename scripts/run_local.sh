#!/usr/bin/env bash
# The main job on one machine: a 2-worker MultiWorkerMirrored training of the real ResNet50 on
# generated cassava-like data, through the same trainer.task the images run.
# Extra arguments go to trainer.task (after the defaults, so they win).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh

model_dir=${MODEL_DIR:-output/model}
.venv/bin/python -m trainer.launch --workers 2 --timeout 1800 -- \
  --dataset synthetic:256 --epochs 2 --per-replica-batch-size 16 --image-size 64 --weights none \
  --model-dir "$model_dir" "$@"
echo "model saved to $(cd "$model_dir" && pwd); classify images with:"
echo "  .venv/bin/python -m trainer.predict $model_dir IMAGE..."
