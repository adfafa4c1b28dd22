#!/usr/bin/env bash
# `kettle serve --device cuda` on the GPU box (no Node there): the same
# REQUESTS (32) greedy completions of mixed lengths, half sharing a prefix,
# sent at once to a --batch BATCH (32) server and one at a time to a --batch 1
# --prompt-cache 0 server must come back with identical text (issue 7's
# check); then a timed burst reports throughput and time to first token of
# the batched server.
#   [REQUESTS=32] [BATCH=32] [FLAGS=...] [BATCHED_FLAGS=...] bash bench/cuda_serve_check.sh KETTLE_BIN MODEL_DIR
# FLAGS go to both servers (e.g. --no-batch-invariant: the fast decode, which may
# differ), BATCHED_FLAGS to the batched one.
set -uo pipefail
kettle=${1:?kettle binary}; model=${2:?model folder}
start() {  # port, flags...
  local port=$1; shift
  "$kettle" serve "$model" --device "${DEVICE:-cuda}" --port "$port" --no-open "$@" >"/tmp/serve-$port.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do  # this server, not one left on the port
    kill -0 $pid 2>/dev/null || break
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0; sleep 0.5
  done
  echo "server on $port did not start"; tail -5 "/tmp/serve-$port.log"; return 1
}
start 8091 --batch "${BATCH:-32}" ${FLAGS:-} ${BATCHED_FLAGS:-} || exit 1
start 8092 --batch 1 --prompt-cache 0 ${FLAGS:-} || exit 1
REQUESTS=${REQUESTS:-32} python3 - <<'PY'
import json, os, threading, time, urllib.request
N = int(os.environ["REQUESTS"])
def complete(port, prompt, n, stream=False):
    fields = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}
    if os.environ.get("LOGPROBS") and port == 8091: fields["logprobs"] = 1  # host sampling
    body = json.dumps(fields).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"})
    t0 = time.time(); first = None; text = ""
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.load(r)["choices"][0]["text"], 0.0
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            if first is None: first = time.time() - t0
            text += json.loads(line[6:])["choices"][0]["text"]
    return text, first
shared = "The kettle is a vessel for boiling water, " * 12
prompts = [(shared if i % 2 else "") + f"Story {i}: once upon a time " * (1 + i % 5) for i in range(N)]
lengths = [16 + (i * 7) % 48 for i in range(N)]
together = [None] * N
def run(i): together[i] = complete(8091, prompts[i], lengths[i])[0]
threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
[t.start() for t in threads]; [t.join() for t in threads]
alone = [complete(8092, prompts[i], lengths[i])[0] for i in range(N)]
same = sum(a == b for a, b in zip(together, alone))
print(f"serve: {same}/{N} batched completions identical to serial ones")
for i, (a, b) in enumerate(zip(together, alone)):
    if a != b: print(f"  differs: request {i}: {a[:60]!r} vs {b[:60]!r}")
stats = json.load(urllib.request.urlopen("http://127.0.0.1:8091/stats"))
print("stats kv:", json.dumps(stats["kv"]), "prefix hits:", stats["prefix_cache"]["hits"])
# Timed burst: 64 streaming requests, BATCH at a time on the engine.
res = [None] * 64; t0 = time.time()
def burst(i): res[i] = complete(8091, prompts[i % N] + f" #{i}", 64, stream=True)
threads = [threading.Thread(target=burst, args=(i,)) for i in range(64)]
[t.start() for t in threads]; [t.join() for t in threads]
wall = time.time() - t0
ttft = sorted(r[1] for r in res)
print(f"burst: 64 streams × 64 tokens in {wall:.2f} s = {64 * 64 / wall:.0f} tok/s; "
      f"TTFT p50 {1000 * ttft[32]:.0f} ms p99 {1000 * ttft[63]:.0f} ms")
PY
kill %1 %2 2>/dev/null; wait 2>/dev/null
