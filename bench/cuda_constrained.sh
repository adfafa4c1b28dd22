#!/usr/bin/env bash
# Constrained decoding on the GPU box, one call: the mask op and the samplers against
# the CPU, the GPU goldens and batching equivalence (fidelity kept), the demo model
# served on CUDA answering json_schema requests (each output parsed; a lone request and
# the same request among 15 others give the same text), and the masks' cost at batch 32
# on the llama-3.1-8b shape with its 128k vocabulary (bench --json-schema).
#   KETTLE_PREBUILT=DIR TOKENIZER=llama3/tokenizer.json OUT=DIR bash bench/cuda_constrained.sh
set -uo pipefail
prebuilt=${KETTLE_PREBUILT:?KETTLE_PREBUILT=DIR}; tokenizer=${TOKENIZER:?TOKENIZER=tokenizer.json}; out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$prebuilt/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
kettle=$prebuilt/bin/kettle
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
status=0

echo "== op tests"
"$prebuilt/bin/backend_cuda_test" --gtest_filter='*Mask*:*Sample*:*Greedy*' 2>&1 | tail -4 || status=1
echo "== goldens (exact, both modes) and batching equivalence"
"$prebuilt/bin/golden_cuda_test" --gtest_filter='*Greedy*:*Batching*:*PromptLogitsMatch*' 2>&1 | tail -4 || status=1

echo "== serve on CUDA: json_schema requests"
port=18555
"$kettle" serve --device cuda --port $port --batch 16 >"$out/serve.log" 2>&1 &
server=$!
for i in $(seq 1 100); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.3; done
python3 - "$port" <<'PY' || status=1
import json, sys, urllib.request, concurrent.futures as cf
port = sys.argv[1]
schema = json.load(open("bench/schemas/book_flight.json"))
def ask(t, seed, content="Book a flight."):
    body = {"messages": [{"role": "user", "content": content}], "temperature": t, "seed": seed, "max_tokens": 600,
            "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=120))
    return r["choices"][0]["finish_reason"], r["choices"][0]["message"]["content"]
bad = 0
for t in (0, 1):
    for seed in range(8):
        finish, text = ask(t, seed)
        try:
            v = json.loads(text); ok = finish == "stop" and set(schema["required"]) <= set(v)
        except Exception:
            ok = False
        bad += not ok
        if not ok: print("INVALID", t, seed, finish, text[:300])
alone = ask(0, 1, "Book a flight to Oslo.")
with cf.ThreadPoolExecutor(16) as pool:
    many = list(pool.map(lambda i: ask(0, 1, "Book a flight to Oslo." if i == 5 else f"Book flight {i}."), range(16)))
same = many[5] == alone
print(f"served: {16 - bad}/16 valid and stopped; alone == in a batch of 16: {same}")
sys.exit(0 if bad == 0 and same else 1)
PY
kill $server; wait $server 2>/dev/null

echo "== mask cost: llama-3.1-8b shape, 128k vocabulary"
"$kettle" bench --synthetic llama-3.1-8b --device cuda --parallel 1,8,32 -p 128 -g 128 -r 3 \
  --json-schema bench/schemas/book_flight.json --tokenizer "$tokenizer" 2>&1 | tee "$out/mask_cost.md" | grep '^|'
exit $status
