#!/usr/bin/env bash
# kettle vs llama.cpp on this machine's CPU, same model shape, same threads,
# one run: prints llama-bench's and kettle bench's numbers and their ratios.
#
#   bench/cpu_vs_llamacpp.sh [PRESET] [THREADS]     (default llama-3.2-1b, 2)
#
# llama.cpp comes from ../shared/bench/llamacpp-peer.sh (built once into
# $PEER, default ./peer); its GGUF is F16 with random weights of the same shape.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-llama-3.2-1b}
threads=${2:-2}
peer=${PEER:-$here/peer}
peer_script=$here/../shared/bench/llamacpp-peer.sh
prompt=128
gen=32

[ -x "$peer/build/bin/llama-bench" ] || { bash "$peer_script" source "$peer" && bash "$peer_script" build "$peer" cpu; }
[ -f "$peer/$preset.f16.gguf" ] || bash "$peer_script" model "$peer" "$preset" f16
[ -x "$here/build/kettle" ] || make -C "$here" build

llama_json=$("$peer/build/bin/llama-bench" -m "$peer/$preset.f16.gguf" -t "$threads" -p "$prompt" -n "$gen" -r 3 -o json 2>/dev/null)
kettle_json=$("$here/build/kettle" bench --synthetic "$preset" -t "$threads" -p "$prompt" -g "$gen" -r 3 --json)

/usr/bin/env python3 - "$llama_json" "$kettle_json" "$preset" "$threads" <<'PY'
import json, sys
llama = json.loads(sys.argv[1]); kettle = json.loads(sys.argv[2]); preset, threads = sys.argv[3], sys.argv[4]
pp = next(r["avg_ts"] for r in llama if r["n_prompt"] > 0)
tg = next(r["avg_ts"] for r in llama if r["n_gen"] > 0)
kp, kt = kettle["prefill_tokens_per_second"], kettle["decode_tokens_per_second"]
print(f"| {preset}, {threads} threads | llama.cpp F16 | kettle bf16 | kettle / llama.cpp |")
print("|---|---|---|---|")
print(f"| prefill {kettle['prompt_tokens']} tok/s | {pp:.1f} | {kp:.1f} | {kp/pp:.2f}x |")
print(f"| decode tok/s | {tg:.2f} | {kt:.2f} | {kt/tg:.2f}x |")
print(f"| decode weight GB/s | {tg*kettle['weight_bytes']/1e9:.1f} | {kettle['decode_weight_gb_per_second']:.1f} | |")
print(f"| kettle peak RSS | | {kettle['peak_rss_gib']:.2f} GiB | |")
PY
