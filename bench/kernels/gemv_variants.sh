#!/usr/bin/env bash
# One GPU-box call for the GEMV work: op tests (with each forced split), goldens, then
# `kettle bench --synthetic` per preset for the old kernels and the new ones (auto split,
# late and early PDL trigger, forced splits). Needs KETTLE_PREBUILT (scripts/pack-gpu-bin.sh).
#   OUT=DIR KETTLE_PREBUILT=DIR bash bench/kernels/gemv_variants.sh PRESET...
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/gemv-out}; mkdir -p "$out"
bin=$KETTLE_PREBUILT/bin
export LD_LIBRARY_PATH=$KETTLE_PREBUILT/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
"$bin/backend_cuda_test" >"$out/ops.log" 2>&1; echo "ops (auto): $(grep -E '^\[  (PASSED|FAILED) ' "$out/ops.log" | tr '\n' ' ')"
for s in 1 2 4; do
  KETTLE_GEMV_SPLIT=$s "$bin/backend_cuda_test" >"$out/ops-split$s.log" 2>&1
  echo "ops (split $s): $(grep -E '^\[  (PASSED|FAILED) ' "$out/ops-split$s.log" | tr '\n' ' ')"
done
grep -h -A8 "Failure" "$out"/ops*.log | head -30
"$bin/golden_cuda_test" >"$out/golden.log" 2>&1
echo "golden: $(grep -E '^\[  (PASSED|FAILED) ' "$out/golden.log" | tr '\n' ' ')"; grep -E "^\[  FAILED  \]" "$out/golden.log" | head
echo "tests: $(( $(date +%s) - t0 )) s"
variants=("old:KETTLE_GEMV=old" "new-late:KETTLE_PDL_EARLY=0" "new:" "split1:KETTLE_GEMV_SPLIT=1" "split2:KETTLE_GEMV_SPLIT=2" "split4:KETTLE_GEMV_SPLIT=4")
echo "| preset | variant | pp512 tok/s | tg128 tok/s | weight GB/s | copy GB/s | % of copy |"
echo "|---|---|---|---|---|---|---|"
for p in "$@"; do
  for v in "${variants[@]}"; do
    name=${v%%:*} envs=${v#*:}
    [ $(( $(date +%s) - t0 )) -lt "${BUDGET_S:-360}" ] || { echo "| $p | $name | skipped (time) | | | | |"; continue; }
    env $envs timeout 90 "$bin/kettle" bench --synthetic "$p" --device cuda -p 512 -g 128 -r 3 --json \
      >"$out/bench-$p-$name.json" 2>"$out/bench-$p-$name.err" || { echo "bench $p $name failed"; tail -3 "$out/bench-$p-$name.err"; }
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('| %s | %s | %.0f | %.1f | %.0f | %.0f | %.1f%% |' % (sys.argv[2], sys.argv[3], j['prefill_tokens_per_second'], j['decode_tokens_per_second'], j['decode_weight_gb_per_second'], j['copy_gb_per_second'], 100*j['decode_fraction_of_copy']))" "$out/bench-$p-$name.json" "$p" "$name" 2>/dev/null
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
