#!/usr/bin/env bash
# One GPU-box call: build kettle with CUDA (or use a prebuilt bundle), run the
# CUDA checks (ops against the CPU, goldens), then `kettle bench --synthetic`
# on the three shapes. Logs go to $OUT (or ./cuda-check-out); a short table
# prints last.
#   bash bench/cuda_check.sh [presets...]
#   KETTLE_PREBUILT=DIR (DIR/bin, DIR/lib: scripts/pack-gpu-bin.sh) skips the build:
#   the GPU box lacks PCRE2/ICU development files.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/cuda-check-out}; mkdir -p "$out"
presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(llama-3.2-1b qwen3-0.6b llama-3.1-8b)
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
if [ -n "${KETTLE_PREBUILT:-}" ]; then
  bin=$KETTLE_PREBUILT/bin tests=$KETTLE_PREBUILT/bin
  export LD_LIBRARY_PATH=$KETTLE_PREBUILT/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ldd "$bin/kettle" | grep "not found"
else
  t0=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$out/configure.log" 2>&1 ||
    { tail -40 "$out/configure.log"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -B2 -A12 -m8 "error" "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  (cd build-gpu && ctest -L cuda -j4 --output-on-failure >"$out/ctest-cuda.log" 2>&1); tail -4 "$out/ctest-cuda.log"
  bin=build-gpu tests=build-gpu/tests
fi
"$tests/backend_cuda_test" >"$out/ops.log" 2>&1; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|rel_err|Expected|Which is" "$out/ops.log" | head -30
"$tests/golden_cuda_test" >"$out/golden.log" 2>&1; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|\[ golden \]" "$out/golden.log" | head -40
if [ -n "${SANITIZE:-}" ]; then
  timeout 240 compute-sanitizer --tool memcheck "$tests/backend_cuda_test" >"$out/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$out/memcheck.log" | head -8
fi
for p in "${presets[@]}"; do
  "$bin/kettle" bench --synthetic "$p" --device cuda -p 512 -g 128 -r 3 --json >"$out/bench-$p.json" 2>"$out/bench-$p.err" ||
    { echo "bench $p failed"; tail -5 "$out/bench-$p.err"; }
done
echo "| model | pp512 tok/s | tg128 tok/s | weight GB/s | copy GB/s | % of copy |"
echo "|---|---|---|---|---|---|"
for p in "${presets[@]}"; do
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('| %s | %.0f | %.1f | %.0f | %.0f | %.1f%% |' % (sys.argv[2], j['prefill_tokens_per_second'], j['decode_tokens_per_second'], j['decode_weight_gb_per_second'], j['copy_gb_per_second'], 100*j['decode_fraction_of_copy']))" "$out/bench-$p.json" "$p" 2>/dev/null || echo "| $p | failed | | | | |"
done
if [ -n "${PROFILE:-}" ]; then bash bench/cuda_profile.sh "$bin/kettle" "$PROFILE" "$out"; fi
