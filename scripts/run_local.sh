#!/usr/bin/env bash
# The main job on one machine: a 2-worker MultiWorkerMirrored training of the real ResNet50, from
# scratch, on generated cassava-like data, through the same cassava.task the images run. It ends
# with a line saying what its validation accuracy means (5 classes: guessing scores 0.20).
# The sizes fit about 4 minutes on 2 cores, data generation and the save included: 384 images at
# 64 px, 6 epochs of 12 steps. Extra arguments go to cassava.task (after the defaults, so they win).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh

model_dir=${MODEL_DIR:-output/model}
if [ $# -eq 0 ]; then
  # Generated once here: both workers would otherwise generate the same files at once on the
  # same cores (each keeps the first copy finished), twice the time for one result.
  # Through the images' stderr relay (trainer.run): TensorFlow's load-time lines are left out here too.
  TF_CPP_MIN_LOG_LEVEL=1 .venv/bin/python -m trainer.run -- python -c 'from cassava import sources, synthetic
synthetic.ensure(sources.DEFAULT_CACHE_DIR, 384)'
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
.venv/bin/python -m trainer.launch --replicas 2 --timeout 1800 -- python -m cassava.task \
  --dataset synthetic:384 --epochs 6 --per-replica-batch-size 16 --image-size 64 --weights none \
  --model-dir "$model_dir" "$@" | tee "$log"
# The save prints after training ends; repeat the verdict last, where a reader looks.
grep -o "trainer: final .*" "$log" | tail -n 1 || true
echo "model saved to $(cd "$model_dir" && pwd); classify images with:"
echo "  .venv/bin/python -m serving.predict $model_dir IMAGE..."
