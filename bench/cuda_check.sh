#!/usr/bin/env bash
# One GPU-box call: build kettle with CUDA, run the cuda-labelled tests (ops
# against the CPU, goldens), then `kettle bench --synthetic` on the three
# shapes. Logs go to $OUT (or ./cuda-check-out); a short table prints last.
#   bash bench/cuda_check.sh [presets...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/cuda-check-out}; mkdir -p "$out"
presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(llama-3.2-1b qwen3-0.6b llama-3.1-8b)
jobs=$(nproc)
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$out/configure.log" 2>&1 ||
  { tail -40 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j"$jobs" >"$out/build.log" 2>&1 || { grep -B2 -A12 -m8 "error" "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
(cd build-gpu && ctest -L cuda -j4 --output-on-failure >"$out/ctest-cuda.log" 2>&1); tail -4 "$out/ctest-cuda.log"
grep -E "Failed|\(Failed\)|Skipped" "$out/ctest-cuda.log" | head -20
build-gpu/tests/golden_cuda_test --gtest_filter='*PromptLogits*' 2>&1 | grep "\[ golden \]" | tee "$out/golden-errors.log"
if [ -n "${SANITIZE:-}" ]; then
  timeout 240 compute-sanitizer --tool memcheck build-gpu/tests/backend_cuda_test >"$out/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -3
fi
for p in "${presets[@]}"; do
  build-gpu/kettle bench --synthetic "$p" --device cuda -p 512 -g 128 -r 3 --json >"$out/bench-$p.json" 2>"$out/bench-$p.err" ||
    { echo "bench $p failed"; tail -5 "$out/bench-$p.err"; }
done
echo "| model | pp512 tok/s | tg128 tok/s | weight GB/s | copy GB/s | % of copy |"
echo "|---|---|---|---|---|---|"
for p in "${presets[@]}"; do
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('| %s | %.0f | %.1f | %.0f | %.0f | %.1f%% |' % (sys.argv[2], j['prefill_tokens_per_second'], j['decode_tokens_per_second'], j['decode_weight_gb_per_second'], j['copy_gb_per_second'], 100*j['decode_fraction_of_copy']))" "$out/bench-$p.json" "$p" 2>/dev/null || echo "| $p | failed | | | | |"
done
