#!/usr/bin/env bash
# One device call: train the demo models from the carried data and pack the
# result into $OUT in pieces small enough to come back (16 MB each at most).
#   (device) bash tools/demo-model/run_on_gpu.sh .demo-data/gz
set -euo pipefail
data=${1:?data folder}
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 tools/demo-model/train.py --data "$data" --out "$work" --target-minutes "${TARGET_MINUTES:-4.5}" \
  --draft-minutes "${DRAFT_MINUTES:-1.5}"
cp "$work/report.json" "$work/train.log" "$OUT/"
tar -C "$work" -cf - kettle-demo kettle-demo-draft golden | split -b 15M - "$OUT/models.tar.part-"
ls -la "$OUT"
