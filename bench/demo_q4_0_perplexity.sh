#!/usr/bin/env bash
# Issue 21's quality bar against the peer: the bundled demo model's held-out
# perplexity at 4 bits in kettle (convert -q, groups of 64) beside llama.cpp's
# Q4_0 of the same model, each made by its own tools (llama.cpp's
# convert_hf_to_gguf.py, llama-quantize, llama-perplexity), on the same text
# at context 512, and each against its own unquantized model. Runs where
# llama.cpp's source and build are (the GPU box: torch, transformers and numpy
# are there for the converter).
#
#   KETTLE=path/to/kettle LLAMA=DIR bash bench/demo_q4_0_perplexity.sh OUT
# LLAMA: a llamacpp-peer.sh work folder (src/ and build/). The demo tokenizer is
# byte-level BPE with GPT-2's split regex, which the converter's table of
# tokenizer hashes does not list: it is named "gpt-2" for it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT}; mkdir -p "$out"
kettle=${KETTLE:?KETTLE=path}; llama=${LLAMA:?LLAMA=DIR}
model=models/kettle-demo; text=tests/data/heldout-sample.txt

cmake --build "$llama/build" --target llama-perplexity >"$out/perplexity-build.log" 2>&1 ||
  { echo "llama-perplexity did not build"; tail -5 "$out/perplexity-build.log"; exit 1; }
python3 - "$llama/src" "$model" "$out/demo.bf16.gguf" >"$out/gguf-convert.log" 2>&1 <<'PY' || { echo "convert_hf_to_gguf failed"; tail -5 "$out/gguf-convert.log"; exit 1; }
import sys
src, model, outfile = sys.argv[1:4]
sys.path.insert(0, src + "/gguf-py"); sys.path.insert(0, src)
import conversion
conversion.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf as c
sys.argv = ["convert_hf_to_gguf.py", model, "--outtype", "bf16", "--outfile", outfile]
c.main()
PY
"$llama/build/bin/llama-quantize" "$out/demo.bf16.gguf" "$out/demo.q4_0.gguf" Q4_0 >"$out/demo-quantize.log" 2>&1 ||
  { echo "llama-quantize failed"; tail -5 "$out/demo-quantize.log"; exit 1; }
for q in bf16 q4_0; do
  "$llama/build/bin/llama-perplexity" -m "$out/demo.$q.gguf" -f "$text" -c 512 -b 512 -ngl 99 \
    >"$out/llama-ppl-$q.log" 2>&1 || echo "llama-perplexity $q failed"
done
"$kettle" convert "$model" "$out/demo-q4g64" -q --q-bits 4 --q-group-size 64 >"$out/kettle-convert.log" 2>&1
for m in "$model" "$out/demo-q4g64"; do
  "$kettle" perplexity --model "$m" --file "$text" --context 512 --stride 256 --device cpu --json \
    >"$out/kettle-ppl-$(basename "$m").json" 2>"$out/kettle-ppl-$(basename "$m").err"
done

python3 - "$out" <<'PY'
import json, re, sys, os
out = sys.argv[1]
def llama(q):
    text = open(os.path.join(out, f"llama-ppl-{q}.log"), errors="replace").read()
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
    return float(m.group(1)) if m else None
def kettle(name):
    try: return json.load(open(os.path.join(out, f"kettle-ppl-{name}.json")))["perplexity"]
    except Exception: return None
lb, lq, kb, kq = llama("bf16"), llama("q4_0"), kettle("kettle-demo"), kettle("demo-q4g64")
print("| engine | unquantized ppl | 4-bit ppl | 4-bit / unquantized |")
print("|---|---|---|---|")
for name, b, q in [("llama.cpp (BF16 → Q4_0, llama-perplexity -c 512)", lb, lq),
                   ("kettle (bf16 → 4-bit g64, perplexity --context 512 --stride 256)", kb, kq)]:
    ratio = "%.4f" % (q / b) if b and q else "-"
    print("| %s | %s | %s | %s |" % (name, "%.4f" % b if b else "-", "%.4f" % q if q else "-", ratio))
if lb and lq and kb and kq:
    print("kettle's 4-bit loss %.2f %% vs llama.cpp Q4_0's %.2f %%: %s" % (100 * (kq / kb - 1), 100 * (lq / lb - 1),
          "no worse" if kq / kb <= lq / lb else "worse"))
PY
