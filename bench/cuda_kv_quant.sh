#!/usr/bin/env bash
# Issue 22's measure on the GPU box in one call: the quantized KV cache on CUDA.
# The checks first — the store's bytes equal the host codec's, both attention
# kernels read quantized rows as the CPU does, batching changes no golden token
# under each mode — then decode at depth 32,768 on the llama-3.1-8b shape per
# --kv-quant mode (tok/s and the KV GB/s a step reads), and a 4k-token prefill
# off and 8-bit. llama.cpp's `-ctk q8_0 -ctv q8_0 -d 32768` beside it needs
# its CUDA build (bench/cuda_quantized.sh's PEER handling); not done here.
#
#   KETTLE_PREBUILT=DIR bash bench/cuda_kv_quant.sh
# KETTLE_PREBUILT: an unpacked scripts/pack-gpu-bin.sh bundle (bin/, lib/). The tests
# read tests/data at the path they were built with: it is linked to this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}
out=${OUT:-$PWD/kv-quant-out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
kettle=$prebuilt/bin/kettle
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
data=$(strings "$prebuilt/bin/golden_cuda_test" | grep -m1 -o '/[^ ]*/tests/data$')
[ -n "$data" ] && [ ! -e "$data" ] && mkdir -p "$(dirname "$(dirname "$data")")" && ln -s "$PWD" "$(dirname "$(dirname "$data")")"
summary() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|Which is|Expected|\(prompt of" "$1" | head -20; }

if [ -z "${SKIP_CHECKS:-}" ]; then
  timeout 150 "$prebuilt/bin/backend_cuda_test" --gtest_filter='*Quantized*:*QkvRope*:*Attention*' >"$out/ops.log" 2>&1
  summary "$out/ops.log"
  timeout 200 "$prebuilt/bin/golden_cuda_test" --gtest_filter='*KvQuant*:*GreedyTokens*' >"$out/golden.log" 2>&1
  summary "$out/golden.log"
  stamp "checks done"
fi
bench() {
  timeout 200 "$kettle" bench --device cuda --json "$@" 2>"$out/bench-err.log" | python3 -c '
import json, sys
j = json.load(sys.stdin)
print("| %s | %.0f | %.1f | %.0f | %.0f |" % (j["kv_quant"], j["prefill_tokens_per_second"], j["decode_tokens_per_second"],
      j["kv_bytes_at_depth"] / 1e6, j["decode_kv_gb_per_second"]))' || tail -3 "$out/bench-err.log"
}
echo "| --kv-quant, depth 32768, llama-3.1-8b | pp16 tok/s | tg32 tok/s | KV MB read a step | KV GB/s |"
echo "|---|---|---|---|---|"
for q in off 8 4 turbo fp8; do bench --synthetic llama-3.1-8b -p 16 -g 32 -r 2 --depth 32768 --kv-quant "$q"; done
echo "| --kv-quant, pp4096 from empty | pp tok/s | tg tok/s | | |"
for q in off 8; do bench --synthetic llama-3.1-8b -p 4096 -g 8 -r 1 --kv-quant "$q"; done
stamp "done"
