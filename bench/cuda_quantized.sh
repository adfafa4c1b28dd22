#!/usr/bin/env bash
# Issue 21's measure on the GPU box in one call: quantized weights on CUDA.
# The checks first (the affine kernels against the CPU, the quantized goldens
# on CUDA, the bf16 goldens unchanged), while llama.cpp builds and its GGUFs of
# the llama-3.1-8b shape are made (F16 random weights, then llama-quantize
# Q4_0 and Q8_0); once those are done, kettle bench on the same shape (random affine weights,
# 4-bit and 8-bit, groups of 64, bf16 scales and biases: 4.5 and 8.5 bits per
# weight, as Q4_0's 4.5 and Q8_0's 8.5) beside llama-bench, a 70B-class shape
# at 4 bits (fit, then decode), the device copy ceiling from the same run, and
# one table last.
#
#   KETTLE_PREBUILT=DIR PEER=DIR bash bench/cuda_quantized.sh
# KETTLE_PREBUILT: an unpacked scripts/pack-gpu-bin.sh bundle (bin/, lib/).
# PEER: llamacpp.tar.xz + vocab-llama3.gguf.xz and bin/llamacpp-peer.sh +
# bin/make_random_gguf.py (copies of ../shared/bench), as for cuda_long_moe.sh.
# LLAMA_DEADLINE (s, default 400): how long the peer may take to be ready.
# WORK: where llama.cpp is built; one built there by an earlier call (build.rc and
# gguf.rc both 0) is used as it is. SKIP_CHECKS=1: the benches alone.
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}; peer=$(cd "${PEER:?PEER=DIR}" && pwd)
out=${OUT:-$PWD/quantized-out}; mkdir -p "$out"
work=${WORK:-/tmp/kettle-peer}; mkdir -p "$work/src"
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
kettle=$prebuilt/bin/kettle
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

# SKIP_PEER=1: kettle alone (a second call on the same kind of machine, the peer's numbers
# taken from the first).
build_job= gguf_job=
if [ -z "${SKIP_PEER:-}" ] && [ "$(cat "$work/build.rc" 2>/dev/null)$(cat "$work/gguf.rc" 2>/dev/null)" != 00 ]; then
  xz -dc "$peer/vocab-llama3.gguf.xz" >"$work/vocab-llama3.gguf"
  tar xJf "$peer/llamacpp.tar.xz" -C "$work/src"
  ( bash "$peer/bin/llamacpp-peer.sh" build "$work" cuda >"$out/llamacpp-build.log" 2>&1; echo $? >"$work/build.rc" ) &
  build_job=$!
  ( bash "$peer/bin/llamacpp-peer.sh" model "$work" llama-3.1-8b f16 >"$out/gguf.log" 2>&1; echo $? >"$work/gguf.rc" ) &
  gguf_job=$!
fi

if [ -z "${SKIP_CHECKS:-}" ]; then
# The test binaries read tests/data where they were built; point that path here.
data=$(strings "$prebuilt/bin/quantized_test" | grep -m1 -o '/[^ ]*/tests/data$')
[ -n "$data" ] && [ ! -e "$data" ] && mkdir -p "$(dirname "$(dirname "$data")")" && ln -s "$PWD" "$(dirname "$(dirname "$data")")"
"$prebuilt/bin/backend_cuda_test" --gtest_filter="${OPS_FILTER:-*Affine*:*Matmul*}" >"$out/ops.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|rel_err|Expected|Which is|-bit" "$out/ops.log" | head -30
"$prebuilt/bin/quantized_test" --gtest_filter='*Cuda*' >"$out/quantized.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|position|exception|what" "$out/quantized.log" | head -20
if grep -q "^\[  FAILED  \]" "$out/quantized.log"; then  # the first failing case under the memory checker
  first=$(grep -m1 -o "CudaRunsQuantizedWeightsAsTheCpuDoes/[a-z0-9_]*" "$out/quantized.log")
  timeout 120 compute-sanitizer --tool memcheck "$prebuilt/bin/quantized_test" --gtest_filter="*$first" 2>&1 |
    grep -E "Invalid|ERROR SUMMARY|at 0x|by thread|Address|exception|what|Failure" | head -24
fi
"$prebuilt/bin/golden_cuda_test" --gtest_filter="${GOLDEN_FILTER:-*PromptLogitsMatch*:*Greedy*:*Batching*}" >"$out/golden.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/golden.log"
stamp "checks done"
fi

# kettle's benches wait for llama.cpp's build: run beside a compile on the same host, they
# measured 10-30 % slow (2026-12-06).
deadline=${LLAMA_DEADLINE:-400}
while [ -n "$build_job" ] && { kill -0 $build_job 2>/dev/null || kill -0 $gguf_job 2>/dev/null; }; do
  [ $(( $(date +%s) - t0 )) -gt "$deadline" ] && { stamp "llama.cpp not ready by ${deadline}s: skipped"; break; }
  sleep 3
done
stamp "llama.cpp build rc $(cat "$work/build.rc" 2>/dev/null), GGUF rc $(cat "$work/gguf.rc" 2>/dev/null)"
bench() {  # name, args...: kettle bench --json into $out/kettle-NAME.json
  local name=$1; shift
  timeout 300 "$kettle" bench --device cuda --json "$@" >"$out/kettle-$name.json" 2>"$out/kettle-$name.err" ||
    { echo "kettle $name failed"; tail -3 "$out/kettle-$name.err"; }
}
# QUICK=1: the fastest mode only for bf16 and 8-bit, both modes for 4-bit.
for mode in no-batch-invariant batch-invariant; do
  [ -n "${QUICK:-}" ] && [ $mode = batch-invariant ] || bench "bf16-$mode" --synthetic llama-3.1-8b -p 512 -g 128 -r 2 --$mode
  [ -n "${QUICK:-}" ] && [ $mode = batch-invariant ] || bench "q8-$mode" --synthetic llama-3.1-8b --q-bits 8 -p 512 -g 128 -r 2 --$mode
  bench "q4-$mode" --synthetic llama-3.1-8b --q-bits 4 -p 512 -g 128 -r 2 --$mode
done
bench q4-1b --synthetic llama-3.2-1b --q-bits 4 -p 512 -g 128 -r 2
if [ -z "${SKIP_70B:-}" ]; then
  "$kettle" fit --synthetic llama-3.1-70b --q-bits 4 --device cuda --ctx 8192 >"$out/fit-70b.txt" 2>&1; tail -6 "$out/fit-70b.txt"
  bench q4-70b --synthetic llama-3.1-70b --q-bits 4 -p 512 -g 64 -r 1
fi
stamp "kettle benches done"

if [ "$(cat "$work/build.rc" 2>/dev/null)" = 0 ] && [ "$(cat "$work/gguf.rc" 2>/dev/null)" = 0 ]; then
  for q in Q4_0 Q8_0; do
    "$work/build/bin/llama-quantize" "$work/llama-3.1-8b.f16.gguf" "$work/8b.$q.gguf" $q >"$out/quantize-$q.log" 2>&1 &&
      timeout 200 "$work/build/bin/llama-bench" -m "$work/8b.$q.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json \
        >"$out/llamacpp-$q.json" 2>"$out/llamacpp-$q.err" || echo "llama.cpp $q failed"
    stamp "llama.cpp $q done"
  done
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f: return json.load(f)
    except Exception: return None
def peer(q):
    j = load(f"llamacpp-{q}.json") or []
    pp = next((r["avg_ts"] for r in j if r.get("n_prompt") == 512 and r.get("n_gen") == 0), None)
    tg = next((r["avg_ts"] for r in j if r.get("n_gen") == 128 and r.get("n_prompt") == 0), None)
    size = j[0].get("model_size") if j else None
    return pp, tg, size
print("| kettle run | pp512 tok/s | tg128 tok/s | weight GB | weight GB/s | % of copy |")
print("|---|---|---|---|---|---|")
rows = {}
for name in ["bf16-no-batch-invariant", "bf16-batch-invariant", "q8-no-batch-invariant", "q8-batch-invariant",
             "q4-no-batch-invariant", "q4-batch-invariant", "q4-1b", "q4-70b"]:
    j = load(f"kettle-{name}.json")
    if not j: print(f"| {name} | failed | | | | |"); continue
    rows[name] = j
    gb = j.get("weight_bytes", 0) / 1e9
    print("| %s | %.0f | %.1f | %.2f | %.0f | %.1f%% |" % (name, j["prefill_tokens_per_second"], j["decode_tokens_per_second"],
          gb, j["decode_weight_gb_per_second"], 100 * j["decode_fraction_of_copy"]))
print()
print("| llama.cpp | pp512 tok/s | tg128 tok/s | GGUF GB |")
print("|---|---|---|---|")
for q in ["Q4_0", "Q8_0"]:
    pp, tg, size = peer(q)
    print("| %s | %s | %s | %s |" % (q, "%.0f" % pp if pp else "-", "%.1f" % tg if tg else "-", "%.2f" % (size / 1e9) if size else "-"))
print()
for ours, q in [("q4-no-batch-invariant", "Q4_0"), ("q4-batch-invariant", "Q4_0"), ("q8-no-batch-invariant", "Q8_0"), ("q8-batch-invariant", "Q8_0")]:
    _, tg, _ = peer(q)
    if ours in rows and tg:
        print("%s decode / llama.cpp %s: %.2fx" % (ours, q, rows[ours]["decode_tokens_per_second"] / tg))
PY
