#!/usr/bin/env bash
# Issue 23's measure: time to first token for a long prompt, cold (prefilled) and after a
# restart (restored from --ssd-cache), and the restore's read speed beside the disk's
# sequential read speed (dd, O_DIRECT, 1 MiB blocks) measured in the same run, on the same
# disk. On this machine (CPU, the demo model) the prompt is the longest the demo model's
# context takes; on the GPU box bench/cuda_ssd_restart.sh runs it on the llama-3.1-8b shape.
#
#   [WORDS=1410] [SERVE_FLAGS=...] bash bench/ssd_restart_ttft.sh [DIR on the disk to measure] [MODEL]
# WORDS: the prompt's words (about a token each); SERVE_FLAGS go to both servers.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$PWD/.bench-ssd}
model=${2:-models/kettle-demo}
kettle=${KETTLE_BIN:-$PWD/build/kettle}
port=18390
rm -rf "$dir" && mkdir -p "$dir"
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo dropped || echo kept; }
serve() { "$kettle" serve "$model" --port $port --no-open --ssd-cache "$dir/cache" ${SERVE_FLAGS:-} >>"$dir/serve.log" 2>&1 & pid=$!
  until curl -sf localhost:$port/health >/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "serve exited:"; tail -5 "$dir/serve.log"; exit 1; }; sleep 0.05; done
  until curl -sf localhost:$port/stats | grep -q '"scanning":false'; do sleep 0.05; done; }
prompt=$(WORDS=${WORDS:-1410} python3 -c "
import json, os
words = 'the kettle sings while the water warms and the tea waits in its pot by the window'.split(' ')
s, x = 'Note 1:', 1 * 7919 + 13
for i in range(int(os.environ['WORDS'])):
    x = (x * 1103515245 + 12345) % 2147483648
    s += ' ' + words[x % len(words)]
print(json.dumps({'prompt': s, 'max_tokens': 1, 'temperature': 0}, separators=(',', ':')))")
ttft() { curl -s -o "$dir/answer.json" -w '%{time_total}' localhost:$port/v1/completions -H 'content-type: application/json' -d "$prompt"; }

serve
curl -s localhost:$port/v1/completions -H 'content-type: application/json' -d '{"prompt":"warm up","max_tokens":1}' >/dev/null
cold=$(ttft); tokens=$(python3 -c "import json; print(json.load(open('$dir/answer.json'))['usage']['prompt_tokens'])")
curl -s -XPOST localhost:$port/admin/cache/flush >/dev/null
kill -TERM $pid; wait $pid || true
caches=$(drop_caches)
serve
warm_restart=$(curl -s localhost:$port/v1/completions -H 'content-type: application/json' -d '{"prompt":"warm up","max_tokens":1}' -o /dev/null -w '%{time_total}')
restored=$(ttft)
cached=$(python3 -c "import json; print(json.load(open('$dir/answer.json'))['usage']['prompt_tokens_details']['cached_tokens'])")
read -r restore_mbs restore_mb < <(curl -s localhost:$port/stats | python3 -c "import json,sys; s=json.load(sys.stdin)['ssd_cache']; print('%.0f %.1f' % (s['restore_bytes_per_second']/1e6, s['restore_bytes']/1e6))")
kill -TERM $pid; wait $pid || true
dd if=/dev/urandom of="$dir/seq.bin" bs=1M count=512 oflag=direct status=none
drop_caches >/dev/null
dd_mbs=$(dd if="$dir/seq.bin" of=/dev/null bs=1M iflag=direct 2>&1 | python3 -c "import sys,re; t=sys.stdin.read(); m=re.search(r'copied, ([0-9.]+) s', t); print('%.0f' % (512*1048576/float(m.group(1))/1e6))")
echo "| measure | value |"
echo "|---|---|"
echo "| prompt tokens (cached after restart) | $tokens ($cached) |"
echo "| TTFT cold (prefill) | $(python3 -c "print('%.3f s' % $cold)") |"
echo "| TTFT after restart (restored from disk; page cache $caches) | $(python3 -c "print('%.3f s' % $restored)") |"
echo "| ratio restored / cold | $(python3 -c "print('%.1f %%' % (100*$restored/$cold))") |"
echo "| restore read speed ($restore_mb MB) | $restore_mbs MB/s |"
echo "| disk sequential read (dd, O_DIRECT, 1 MiB) | $dd_mbs MB/s |"
echo "| restore / disk | $(python3 -c "print('%.0f %%' % (100*$restore_mbs/$dd_mbs))") |"
[ -n "${KEEP:-}" ] || rm -rf "$dir"
