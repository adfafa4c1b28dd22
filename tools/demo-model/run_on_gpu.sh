#!/usr/bin/env bash
# One device call: train the demo models from the carried data and pack the
# result into $OUT in pieces small enough to come back (16 MB each at most).
#   (device) bash tools/demo-model/run_on_gpu.sh .demo-data/gz
set -euo pipefail
data=${1:?data folder}
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# The shipped weights: 1,581 target steps and 2,903 draft steps (longer runs overfit the 13 M tokens).
python3 tools/demo-model/train.py --data "$data" --out "$work" --target-steps "${TARGET_STEPS:-1581}" \
  --draft-steps "${DRAFT_STEPS:-2903}"
cp "$work/report.json" "$work/train.log" "$OUT/"
tar -C "$work" -cf - kettle-demo kettle-demo-draft golden | split -b 15M - "$OUT/models.tar.part-"
ls -la "$OUT"
