#!/usr/bin/env bash
# Issue 19's measure on the GPU box in one call: long prompts, decode at
# depth, many users and MoE, kettle against llama.cpp in the same run
# (random weights of the llama-3.1-8b / -3.2-1b shapes: kettle bf16
# synthetic, llama.cpp an F16 GGUF of the same shape; flash attention on).
# The CUDA checks (ops, goldens, serve batching 32/32) run while llama.cpp
# builds; one table of ratios prints last. MoE side by side: a Qwen3-MoE GGUF
# of 16 of the 30B-A3B shape's 48 layers (bench/make_random_moe_gguf.py) and
# kettle on the config.json it writes.
#
#   KETTLE_PREBUILT=DIR PEER=DIR bash bench/cuda_long_moe.sh
# KETTLE_PREBUILT: an unpacked scripts/pack-gpu-bin.sh bundle (bin/, lib/).
# PEER: llamacpp.tar.xz + vocab-llama3.gguf.xz and bin/llamacpp-peer.sh +
# bin/make_random_gguf.py (copies of ../shared/bench), as for cuda_vs_llamacpp.sh.
# LLAMA_DEADLINE (s, default 430): how long the peer's build may take.
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}; peer=$(cd "${PEER:?PEER=DIR}" && pwd)
out=${OUT:-$PWD/long-moe-out}; mkdir -p "$out"
work=${WORK:-/tmp/kettle-peer}; mkdir -p "$work/src"
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
kettle=$prebuilt/bin/kettle
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

xz -dc "$peer/vocab-llama3.gguf.xz" >"$work/vocab-llama3.gguf"
tar xJf "$peer/llamacpp.tar.xz" -C "$work/src"
( bash "$peer/bin/llamacpp-peer.sh" build "$work" cuda >"$out/llamacpp-build.log" 2>&1; echo $? >"$work/build.rc" ) &
build_job=$!
# The MoE GGUF: 16 of the 30B-A3B shape's 48 layers (the disk holds it beside the dense
# ones), with the config.json kettle benches for the same shape.
py=python3; $py -c 'import numpy' 2>/dev/null || py=/usr/bin/python3
( for p in llama-3.1-8b llama-3.2-1b; do bash "$peer/bin/llamacpp-peer.sh" model "$work" $p f16 || exit 1; done &&
    $py bench/make_random_moe_gguf.py "$work/src/gguf-py" "$work/vocab-llama3.gguf" "$work/moe16.gguf" "$work/moe16.json" 16 \
    >"$out/gguf.log" 2>&1; echo $? >"$work/gguf.rc" ) &
gguf_job=$!

"$prebuilt/bin/backend_cuda_test" >"$out/ops.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|prompt attention|paged decode attention 1 seqs" "$out/ops.log"
"$prebuilt/bin/golden_cuda_test" --gtest_filter="${GOLDEN_FILTER:-*}" >"$out/golden.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/golden.log"
bash bench/cuda_serve_check.sh "$kettle" models/kettle-demo 2>&1 | grep -E "identical|differ" | head -3
stamp "checks done"

bench() {  # name, args...: kettle bench --json into $out/kettle-NAME.json
  local name=$1; shift
  timeout 240 "$kettle" bench --device cuda --json "$@" >"$out/kettle-$name.json" 2>"$out/kettle-$name.err" ||
    { echo "kettle $name failed"; tail -3 "$out/kettle-$name.err"; }
}
for p in 4096 16384 32768; do bench "pp$p" --synthetic llama-3.1-8b -p $p -g 16 -r 1; done
bench tg128 --synthetic llama-3.1-8b -p 512 -g 128 -r 2
bench depth --synthetic llama-3.1-8b -p 512 -g 64 -r 2 --depth 32768
bench tg128-1b --synthetic llama-3.2-1b -p 512 -g 128 -r 2
bench batched --synthetic llama-3.1-8b -p 512 -g 128 -r 1 --parallel 64,256 --prefill-chunk 8192
bench moe --synthetic qwen3-30b-a3b -p 512 -g 128 -r 2
bench moe-batched --synthetic qwen3-30b-a3b -p 128 -g 64 -r 1 --parallel 1,32 --prefill-chunk 8192
while kill -0 $gguf_job 2>/dev/null; do sleep 2; done  # the MoE config comes with its GGUF
[ -f "$work/moe16.json" ] && bench moe16 --synthetic "$work/moe16.json" -p 512 -g 128 -r 2
stamp "kettle benches done"

deadline=${LLAMA_DEADLINE:-430}
while kill -0 $build_job 2>/dev/null || kill -0 $gguf_job 2>/dev/null; do
  [ $(( $(date +%s) - t0 )) -gt "$deadline" ] && { stamp "llama.cpp not ready by ${deadline}s: skipped"; break; }
  sleep 3
done
stamp "llama.cpp build rc $(cat "$work/build.rc" 2>/dev/null), GGUFs rc $(cat "$work/gguf.rc" 2>/dev/null)"
lb="$work/build/bin/llama-bench"; g8="$work/llama-3.1-8b.f16.gguf"; g1="$work/llama-3.2-1b.f16.gguf"
peer_bench() {  # name, gguf, args...: llama-bench JSON into $out/llama-NAME.json
  local name=$1 gguf=$2; shift 2
  [ -x "$lb" ] && [ -f "$gguf" ] || return 0
  timeout 200 "$lb" -m "$gguf" -ngl 99 -fa 1 -o json "$@" >"$out/llama-$name.json" 2>"$out/llama-$name.err" ||
    { echo "llama-bench $name failed"; tail -3 "$out/llama-$name.err"; }
}
peer_bench pp "$g8" -p 4096,16384,32768 -n 0 -r 1
peer_bench tg128 "$g8" -p 0 -n 128 -r 2
peer_bench depth "$g8" -p 0 -n 64 -d 32768 -r 1
peer_bench tg128-1b "$g1" -p 0 -n 128 -r 2
peer_bench moe16 "$work/moe16.gguf" -p 512 -n 128 -r 2
if [ -x "$work/build/bin/llama-batched-bench" ] && [ -f "$g8" ]; then
  timeout 200 "$work/build/bin/llama-batched-bench" -m "$g8" -ngl 99 -fa 1 -c 170000 -b 2048 -ub 512 -npp 512 -ntg 128 \
    -npl 256 --output-format jsonl >"$out/llama-batched.jsonl" 2>"$out/llama-batched.err" ||
    { echo "llama-batched-bench failed"; tail -3 "$out/llama-batched.err"; }
fi
stamp "llama.cpp benches done"

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def load(name):
    try: return json.load(open(f"{out}/{name}.json"))
    except Exception: return None
def peer(name, **match):
    for r in load(f"llama-{name}") or []:
        if all(r.get(k) == v for k, v in match.items()): return r["avg_ts"]
def batched(name, b, key):
    k = load(f"kettle-{name}")
    return next((x[key] for x in (k or {}).get("batched", []) if x["batch"] == b), None)
peer_batched = {}
try:
    for line in open(f"{out}/llama-batched.jsonl"):
        if line.startswith("{") and '"pl"' in line: r = json.loads(line); peer_batched[int(r["pl"])] = r
except Exception: pass
k = lambda name, key: (load(f"kettle-{name}") or {}).get(key)
rows = [("8b prefill 4,096", k("pp4096", "prefill_tokens_per_second"), peer("pp", n_prompt=4096, n_gen=0)),
        ("8b prefill 16,384", k("pp16384", "prefill_tokens_per_second"), peer("pp", n_prompt=16384, n_gen=0)),
        ("8b prefill 32,768", k("pp32768", "prefill_tokens_per_second"), peer("pp", n_prompt=32768, n_gen=0)),
        ("8b decode at depth 32,768", k("depth", "decode_tokens_per_second"), peer("depth", n_gen=64)),
        ("8b tg128 (default mode)", k("tg128", "decode_tokens_per_second"), peer("tg128", n_gen=128)),
        ("1b tg128 (default mode)", k("tg128-1b", "decode_tokens_per_second"), peer("tg128-1b", n_gen=128)),
        ("8b batch 256 decode (512 + 128)", batched("batched", 256, "decode_tokens_per_second"),
         peer_batched.get(256, {}).get("speed_tg")),
        ("8b batch 64 decode (kettle)", batched("batched", 64, "decode_tokens_per_second"), None),
        ("MoE 30B-A3B shape, 16 of 48 layers, pp512", k("moe16", "prefill_tokens_per_second"),
         peer("moe16", n_prompt=512, n_gen=0)),
        ("MoE 30B-A3B shape, 16 of 48 layers, tg128", k("moe16", "decode_tokens_per_second"),
         peer("moe16", n_prompt=0, n_gen=128)),
        ("MoE 30B-A3B pp512 (all 48 layers)", k("moe", "prefill_tokens_per_second"), None),
        ("MoE 30B-A3B tg128 (all 48 layers)", k("moe", "decode_tokens_per_second"), None),
        ("MoE batch 1 / 32 decode", batched("moe-batched", 1, "decode_tokens_per_second"),
         batched("moe-batched", 32, "decode_tokens_per_second"))]
print("| test | kettle tok/s | llama.cpp tok/s | ratio |\n|---|---|---|---|")
for name, a, b in rows:
    f = lambda v: f"{v:,.1f}" if v else "–"
    print(f"| {name} | {f(a)} | {f(b)} | {f'{a / b:.2f}×' if a and b else '–'} |")
moe = load("kettle-moe")
if moe:
    print(f"MoE decode: {moe['decode_weight_gb_per_second']:.0f} GB/s of weights read, copy {moe['copy_gb_per_second']:.0f} GB/s")
PY
