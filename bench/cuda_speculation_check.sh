#!/usr/bin/env bash
# Issue 24's and the decode-attention fix's GPU-box call, one script: the CUDA checks
# (a decode query's bits whatever its step's bound; speculation and batching change no token
# on the goldens), the demo model's serve check alone vs 32 at once for off/8/4/turbo, then
# speculation on the demo model (ngram on the edit prompt, the draft model on held-out prose)
# and on the llama-3.1-8b shape with a random llama-3.2-1b-shaped draft of the same vocabulary
# (written by transformers; the box has torch): decode with and without drafts.
#   KETTLE_PREBUILT=DIR bash bench/cuda_speculation_check.sh
# KETTLE_PREBUILT: an unpacked scripts/pack-gpu-bin.sh bundle with kettle, backend_cuda_test
# and golden_cuda_test (BINS="kettle tests/backend_cuda_test tests/golden_cuda_test").
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}; bin=$prebuilt/bin
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
timeout 200 "$bin/backend_cuda_test" --gtest_filter='*DecodeQuery*:*Quantized*:*Attention*' 2>&1 | grep -E "Failure|alone|PASSED|FAILED" | head -12
stamp "ops"
timeout 300 "$bin/golden_cuda_test" --gtest_filter='*Speculation*:*ContinuousBatching*' 2>&1 | grep -E "Failure|sequence|PASSED|FAILED" | head -12
stamp "goldens"
for q in turbo off 8 4; do
  echo "serve --kv-quant $q:"
  FLAGS="--kv-quant $q" timeout 100 bash bench/cuda_serve_check.sh "$bin/kettle" models/kettle-demo 2>&1 | grep -E "serve:|differs|did not" | head -5
done
stamp "serve checks"
B="$bin/kettle bench models/kettle-demo --device cuda -r 3 -g 200"
$B --draft-kind ngram --prompt-file bench/prompts/edit_repeat.txt 2>&1 | tail -1
$B --draft-kind model --draft-model models/kettle-demo-draft --prompt-file bench/prompts/heldout_prose.txt 2>&1 | tail -1
stamp "demo speculation"
draft=${DRAFT_DIR:-$PWD/.bench-model/llama-3.2-1b-random-128k}
if [ ! -f "$draft/config.json" ]; then
  python3 - "$draft" <<'PY'
import sys, torch, transformers
config = transformers.LlamaConfig(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    head_dim=64, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
PY
fi
"$bin/kettle" bench --synthetic llama-3.1-8b --device cuda -r 2 -p 128 -g 128 --draft-kind model --draft-model "$draft" \
  --num-draft-tokens 4 2>&1 | tail -1
"$bin/kettle" bench --synthetic llama-3.1-8b --device cuda -r 2 -p 128 -g 128 --draft-kind ngram --temp 1 2>&1 | tail -1
stamp "8b speculation"
