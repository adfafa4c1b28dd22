#!/usr/bin/env bash
# A refactor's proof on the GPU box, in one call: two prebuilt bundles
# (scripts/pack-gpu-bin.sh), BEFORE and AFTER; the AFTER bundle's CUDA checks
# (ops, goldens, serve batching 32/32), then both bundles' `bench` on the same
# shapes, alternating before/after so drift hits both alike; a table of means
# and after/before ratios prints last.
#   bash bench/cuda_before_after.sh BEFORE.tar.xz AFTER.tar.xz [presets...]
# OUT (default ./before-after-out) keeps the logs and JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
before_tar=${1:?before bundle}; after_tar=${2:?after bundle}; shift 2
presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(llama-3.2-1b llama-3.1-8b)
out=${OUT:-$PWD/before-after-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
for side in before after; do
  mkdir -p "/tmp/$side" && tar -C "/tmp/$side" -xJf "$([ $side = before ] && echo "$before_tar" || echo "$after_tar")"
done
run() {  # side, args... (the side's kettle with its libraries)
  local side=$1; shift
  LD_LIBRARY_PATH=/tmp/$side/lib:/usr/local/cuda/lib64 "/tmp/$side/bin/$@"
}
run after backend_cuda_test >"$out/ops.log" 2>&1; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/ops.log" | head -12
run after golden_cuda_test >"$out/golden.log" 2>&1; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/golden.log" | head -12
LD_LIBRARY_PATH=/tmp/after/lib:/usr/local/cuda/lib64 bash bench/cuda_serve_check.sh /tmp/after/bin/kettle models/kettle-demo \
  >"$out/serve-check.log" 2>&1; grep -E "identical|tok/s|TTFT|ttft" "$out/serve-check.log" | head -6
for side in before after; do  # the same text's perplexity through each side (after: the engine's scored prompts)
  run "$side" kettle perplexity --model models/kettle-demo --file tests/data/heldout-sample.txt --context 512 \
    --device cuda --json >"$out/perplexity-$side.json" 2>"$out/perplexity-$side.err" || tail -3 "$out/perplexity-$side.err"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('perplexity', sys.argv[2], j['perplexity'], j['scored_tokens'])" \
    "$out/perplexity-$side.json" "$side" 2>/dev/null
done
for rep in $(seq 1 "${REPS:-1}"); do
  for p in "${presets[@]}"; do
    for side in before after; do
      run "$side" kettle bench --synthetic "$p" --device cuda -p 512 -g 128 -r 3 --json \
        >"$out/single-$p-$side-$rep.json" 2>"$out/single-$p-$side-$rep.err" || tail -3 "$out/single-$p-$side-$rep.err"
      run "$side" kettle bench --synthetic "$p" --device cuda -p 128 -g 128 -r 2 --parallel 1,8,32,64 \
        --prefill-chunk 8192 --json >"$out/parallel-$p-$side-$rep.json" 2>"$out/parallel-$p-$side-$rep.err" ||
        tail -3 "$out/parallel-$p-$side-$rep.err"
    done
  done
done
python3 - "$out" "${presets[@]}" <<'PY'
import json, sys, glob, statistics as st
out, presets = sys.argv[1], sys.argv[2:]
def load(pattern):
    rows = []
    for f in sorted(glob.glob(f"{out}/{pattern}")):
        try: rows.append(json.load(open(f)))
        except Exception: pass
    return rows
print("| model | test | before | after | after/before |\n|---|---|---|---|---|")
for p in presets:
    for key, name in (("prefill_tokens_per_second", "pp512"), ("decode_tokens_per_second", "tg128")):
        b = [r[key] for r in load(f"single-{p}-before-*.json")]; a = [r[key] for r in load(f"single-{p}-after-*.json")]
        if a and b: print(f"| {p} | {name} | {st.mean(b):.1f} | {st.mean(a):.1f} | {st.mean(a)/st.mean(b):.3f} |")
    for batch in (1, 8, 32, 64):
        for key, name in (("decode_tokens_per_second", "decode"), ("prefill_tokens_per_second", "prefill")):
            pick = lambda rows: [x[key] for r in rows for x in r["batched"] if x["batch"] == batch]
            b = pick(load(f"parallel-{p}-before-*.json")); a = pick(load(f"parallel-{p}-after-*.json"))
            if a and b: print(f"| {p} | B={batch} {name} | {st.mean(b):.1f} | {st.mean(a):.1f} | {st.mean(a)/st.mean(b):.3f} |")
PY
