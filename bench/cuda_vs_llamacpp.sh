#!/usr/bin/env bash
# kettle (CUDA) vs llama.cpp (CUDA) on the GPU box, in one call: the same
# shapes, random weights (kettle bf16 synthetic, llama.cpp F16 GGUF: the same
# bytes per weight), llama-bench's tests (pp512: one 512-token forward; tg128:
# 128 single-token steps from an empty cache), the device copy ceiling from
# the same run, one table of ratios at the end. Then the batched test on the
# llama-3.1-8b shape (issue 7): `kettle bench --parallel` against
# llama-batched-bench, -npp 512 -ntg 128 -npl 1,8,32,64, a second table.
#
#   PEER=DIR bash bench/cuda_vs_llamacpp.sh
# PEER holds llamacpp.tgz + vocab-llama3.gguf (`llamacpp-peer.sh source DIR`, run
# where npm works; or the same xz-compressed: llamacpp.tar.xz, vocab-llama3.gguf.xz) and bin/llamacpp-peer.sh + bin/make_random_gguf.py (copies of
# ../shared/bench: the GPU box sees only what the call carries). kettle is built
# here unless KETTLE_PREBUILT=DIR (DIR/bin/kettle, DIR/lib) is given.
# KETTLE_BENCH_FLAGS go to kettle's benches: `--no-batch-invariant` for the fastest
# one-stream decode (the default is batch-invariant).
set -uo pipefail
cd "$(dirname "$0")/.."
peer=${PEER:?PEER=DIR with llamacpp.tgz or .tar.xz}; peer=$(cd "$peer" && pwd)
out=${OUT:-$PWD/cuda-vs-llamacpp-out}; mkdir -p "$out"
work=${WORK:-/tmp/kettle-peer}; mkdir -p "$work"
# The source and vocab as `llamacpp-peer.sh source` writes them, or xz-compressed (smaller to carry).
if [ -f "$peer/vocab-llama3.gguf.xz" ]; then xz -dc "$peer/vocab-llama3.gguf.xz" >"$work/vocab-llama3.gguf"; else cp "$peer/vocab-llama3.gguf" "$work/"; fi
peer_sh="$peer/bin/llamacpp-peer.sh"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

# llama.cpp's build and its GGUFs run in the background while kettle is built and checked.
mkdir -p "$work/src"
if [ -f "$peer/llamacpp.tar.xz" ]; then tar xJf "$peer/llamacpp.tar.xz" -C "$work/src"; else tar xzf "$peer/llamacpp.tgz" -C "$work/src"; fi
( bash "$peer_sh" build "$work" cuda >"$out/llamacpp-build.log" 2>&1; echo $? >"$work/build.rc" ) &
build_job=$!
( bash "$peer_sh" model "$work" llama-3.2-1b f16 >"$out/gguf.log" 2>&1 &&
  bash "$peer_sh" model "$work" llama-3.1-8b f16 >>"$out/gguf.log" 2>&1; echo $? >"$work/gguf.rc" ) &
gguf_job=$!

if [ -n "${KETTLE_PREBUILT:-}" ]; then
  kettle=$KETTLE_PREBUILT/bin/kettle
  export LD_LIBRARY_PATH=$KETTLE_PREBUILT/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$out/kettle-build.log" 2>&1 &&
    cmake --build build-gpu -j8 --target kettle >>"$out/kettle-build.log" 2>&1 || { tail -30 "$out/kettle-build.log"; exit 1; }
  kettle=build-gpu/kettle
fi
stamp "kettle ready"
# KETTLE_TESTS=DIR (backend_cuda_test, golden_cuda_test): the CUDA checks run while llama.cpp builds.
if [ -n "${KETTLE_TESTS:-}" ]; then
  "$KETTLE_TESTS/backend_cuda_test" >"$out/ops.log" 2>&1; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$out/ops.log"
  "$KETTLE_TESTS/golden_cuda_test" >"$out/golden.log" 2>&1; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$out/golden.log"
  stamp "checks done"
fi
# SERVE_MODEL=DIR: `kettle serve --device cuda` batched vs serial, and a timed burst.
if [ -n "${SERVE_MODEL:-}" ]; then bash bench/cuda_serve_check.sh "$kettle" "$SERVE_MODEL" 2>&1 | tail -12; stamp "serve check done"; fi
if [ -n "${PROFILE:-}" ]; then bash bench/cuda_profile.sh "$kettle" "$PROFILE" "$out" | head -24; stamp "profile done"; fi
# Wait for the peer, but not past LLAMA_DEADLINE seconds: kettle's numbers print either way.
deadline=${LLAMA_DEADLINE:-470}
while kill -0 $build_job 2>/dev/null || kill -0 $gguf_job 2>/dev/null; do
  [ $(( $(date +%s) - t0 )) -gt "$deadline" ] && { stamp "llama.cpp not ready by ${deadline}s: skipped"; break; }
  sleep 5
done
stamp "llama.cpp build rc $(cat "$work/build.rc" 2>/dev/null), GGUFs rc $(cat "$work/gguf.rc" 2>/dev/null)"
tail -2 "$out/llamacpp-build.log"

presets=(llama-3.2-1b llama-3.1-8b qwen3-0.6b)
for p in "${presets[@]}"; do
  "$kettle" bench --synthetic "$p" --device cuda ${KETTLE_BENCH_FLAGS:-} -p 512 -g 128 -r 3 --json >"$out/kettle-$p.json" 2>"$out/kettle-$p.err" ||
    { echo "kettle bench $p failed"; tail -3 "$out/kettle-$p.err"; }
  gguf="$work/$p.f16.gguf"
  if [ -f "$gguf" ] && [ -x "$work/build/bin/llama-bench" ] && [ "$(cat "$work/gguf.rc" 2>/dev/null)" = 0 ]; then
    "$work/build/bin/llama-bench" -m "$gguf" -ngl 99 -fa 1 -p 512 -n 128 -o json >"$out/llamacpp-$p.json" 2>"$out/llamacpp-$p.err" ||
      { echo "llama-bench $p failed"; tail -3 "$out/llamacpp-$p.err"; }
  fi
  stamp "$p done"
done

python3 - "$out" "${presets[@]}" <<'PY'
import json, sys, os
out, presets = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        with open(path) as f: return json.load(f)
    except Exception: return None
print("| shape | kettle pp512 | llama.cpp pp512 | ratio | kettle tg128 | llama.cpp tg128 | ratio | kettle weight GB/s | copy GB/s | % of copy |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in presets:
    k = load(f"{out}/kettle-{p}.json"); l = load(f"{out}/llamacpp-{p}.json") or []
    lp = next((r["avg_ts"] for r in l if r.get("n_prompt") == 512 and r.get("n_gen") == 0), None)
    lg = next((r["avg_ts"] for r in l if r.get("n_gen") == 128 and r.get("n_prompt") == 0), None)
    if not k: print(f"| {p} | failed | | | | | | | | |"); continue
    kp, kg = k["prefill_tokens_per_second"], k["decode_tokens_per_second"]
    ratio = lambda a, b: f"{a / b:.2f}×" if b else "–"
    fmt = lambda v, d=0: f"{v:.{d}f}" if v else "–"
    print(f"| {p} | {kp:.0f} | {fmt(lp)} | {ratio(kp, lp)} | {kg:.1f} | {fmt(lg, 1)} | {ratio(kg, lg)} | "
          f"{k['decode_weight_gb_per_second']:.0f} | {k['copy_gb_per_second']:.0f} | {100 * k['decode_fraction_of_copy']:.1f}% |")
PY

# Batched decode (llama-batched-bench's measure) on the 8b shape.
npl=${NPL:-1,8,32,64}
"$kettle" bench --synthetic llama-3.1-8b --device cuda ${KETTLE_BENCH_FLAGS:-} -p 512 -g 128 -r 2 --parallel "$npl" --json \
  >"$out/kettle-batched.json" 2>"$out/kettle-batched.err" || { echo "kettle batched failed"; tail -3 "$out/kettle-batched.err"; }
stamp "kettle batched done"
if [ -x "$work/build/bin/llama-batched-bench" ] && [ -f "$work/llama-3.1-8b.f16.gguf" ]; then
  "$work/build/bin/llama-batched-bench" -m "$work/llama-3.1-8b.f16.gguf" -ngl 99 -fa 1 -c 65536 -b 2048 -ub 512 \
    -npp 512 -ntg 128 -npl "$npl" --output-format jsonl >"$out/llamacpp-batched.jsonl" 2>"$out/llamacpp-batched.err" ||
    { echo "llama-batched-bench failed"; tail -3 "$out/llamacpp-batched.err"; }
  stamp "llama-batched-bench done"
fi
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
try: k = json.load(open(f"{out}/kettle-batched.json"))["batched"]
except Exception: k = []
peer = {}
try:
    for line in open(f"{out}/llamacpp-batched.jsonl"):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if "pl" in r: peer[int(r["pl"])] = r
except Exception: pass
print("| B | kettle prefill tok/s | llama.cpp prefill | ratio | kettle decode tok/s | llama.cpp decode | ratio |")
print("|---|---|---|---|---|---|---|")
for r in k:
    b = r["batch"]; l = peer.get(b, {})
    lp, lg = l.get("speed_pp"), l.get("speed_tg")
    ratio = lambda a, c: f"{a / c:.2f}×" if c else "–"
    print(f"| {b} | {r['prefill_tokens_per_second']:.0f} | {lp or '–'} | {ratio(r['prefill_tokens_per_second'], lp)} | "
          f"{r['decode_tokens_per_second']:.1f} | {lg or '–'} | {ratio(r['decode_tokens_per_second'], lg)} |")
PY
