#!/usr/bin/env bash
# kettle vs llama.cpp on this machine's CPU, same model shape, same threads,
# one run: prints llama-bench's and kettle bench's numbers and their ratios.
#
#   bench/cpu_vs_llamacpp.sh [PRESET] [THREADS] [ROUNDS]   (default llama-3.2-1b, 2, 3)
#
# The two engines alternate for ROUNDS rounds (the machine's speed drifts);
# each round gives a ratio, and the table shows every round and the median.
#
# llama.cpp comes from ../shared/bench/llamacpp-peer.sh (built once into
# $PEER, default ./peer); its GGUF is F16 with random weights of the same shape.
# QUANT=q4_0 (or q8_0): that GGUF quantized by llama-quantize, against kettle's
# random affine weights of the same bits (--q-bits 4 or 8, groups of 64).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-llama-3.2-1b}
threads=${2:-2}
rounds=${3:-3}
peer=${PEER:-$here/peer}
peer_script=$here/../shared/bench/llamacpp-peer.sh
prompt=128
gen=32

[ -x "$peer/build/bin/llama-bench" ] || { bash "$peer_script" source "$peer" && bash "$peer_script" build "$peer" cpu; }
[ -f "$peer/$preset.f16.gguf" ] || bash "$peer_script" model "$peer" "$preset" f16
[ -x "$here/build/kettle" ] || make -C "$here" build
quant=${QUANT:-}
gguf=$peer/$preset.f16.gguf kettle_quant=() label=F16
if [ -n "$quant" ]; then
  gguf=$peer/$preset.$quant.gguf label=${quant^^}
  [ -f "$gguf" ] || "$peer/build/bin/llama-quantize" "$peer/$preset.f16.gguf" "$gguf" "${quant^^}" >/dev/null
  kettle_quant=(--q-bits "${quant:1:1}")
fi

results=()
for round in $(seq "$rounds"); do
  llama_json=$("$peer/build/bin/llama-bench" -m "$gguf" -t "$threads" -p "$prompt" -n "$gen" -r 2 -o json 2>/dev/null)
  kettle_json=$("$here/build/kettle" bench --synthetic "$preset" "${kettle_quant[@]}" -t "$threads" -p "$prompt" -g "$gen" \
    -r 2 --device cpu --json)
  results+=("$llama_json" "$kettle_json")
done

/usr/bin/env python3 - "$preset" "$threads" "$label" "${results[@]}" <<'PY'
import json, statistics, sys
preset, threads, label, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = []
for llama_text, kettle_text in zip(runs[0::2], runs[1::2]):
    llama, kettle = json.loads(llama_text), json.loads(kettle_text)
    pp = next(r["avg_ts"] for r in llama if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in llama if r["n_gen"] > 0)
    rows.append((pp, kettle["prefill_tokens_per_second"], tg, kettle["decode_tokens_per_second"], kettle))
ours = "bf16" if label == "F16" else f"{label[1]}-bit"
print(f"| {preset}, {threads} threads, round | llama.cpp {label} pp{rows[0][4]['prompt_tokens']} | kettle {ours} pp | ratio "
      f"| llama.cpp tg{rows[0][4]['gen_tokens']} | kettle tg | ratio | kettle weight GB/s |")
print("|---|---|---|---|---|---|---|---|")
for i, (pp, kp, tg, kt, k) in enumerate(rows, 1):
    print(f"| {i} | {pp:.1f} | {kp:.1f} | {kp/pp:.2f}x | {tg:.2f} | {kt:.2f} | {kt/tg:.2f}x | {k['decode_weight_gb_per_second']:.1f} |")
med = lambda xs: statistics.median(xs)
print(f"| median | | | {med([kp/pp for pp, kp, *_ in rows]):.2f}x | | | {med([kt/tg for _, _, tg, kt, _ in rows]):.2f}x | |")
print(f"kettle peak RSS: {rows[-1][4]['peak_rss_gib']:.2f} GiB")
PY
