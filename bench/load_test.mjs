// A bounded load test on loopback: CLIENTS concurrent streaming clients send
// REQUESTS chat requests in all (greedy, max_tokens each, end-of-sequence
// ignored so every output has its full length) to a fresh `kettle serve`;
// every request must complete with its full output. Prints throughput and
// time-to-first-token percentiles.
//   cd tests && KETTLE_BIN=../build/kettle node ../bench/load_test.mjs [--clients 16] [--requests 64]
//        [--max-tokens 64] [--model DIR] [-- extra serve flags...]
import { sseJson, startServer, stopServer } from '../tests/support/kettle_server.mjs';

const args = process.argv.slice(2);
const flag = (name, fallback) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : fallback; };
const clients = Number(flag('--clients', 16));
const total = Number(flag('--requests', 64));
const maxTokens = Number(flag('--max-tokens', 64));
const model = flag('--model', null);
const extra = args.includes('--') ? args.slice(args.indexOf('--') + 1) : [];

const server = await startServer([...(model ? [model] : []), ...extra]);
const topics = ['kettle', 'river', 'stone', 'bread', 'glass', 'horse', 'cloud', 'salt'];

async function one(i) {
  const t0 = performance.now();
  const res = await fetch(`${server.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      messages: [{ role: 'user', content: `Request ${i}: what is a ${topics[i % topics.length]}?` }],
      max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    }),
  });
  if (res.status !== 200) throw new Error(`request ${i}: HTTP ${res.status}`);
  let first = null, usage = null;
  for await (const chunk of sseJson(res)) {
    if (chunk.error) throw new Error(`request ${i}: ${chunk.error.message}`);
    if (first === null && chunk.choices?.[0]?.delta?.content) first = performance.now() - t0;
    usage = chunk.usage ?? usage;
  }
  if (usage?.completion_tokens !== maxTokens) throw new Error(`request ${i}: ${usage?.completion_tokens} of ${maxTokens} tokens`);
  return { ttft: first, total: performance.now() - t0 };
}

let next = 0;
const results = [];
const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, async () => {
  while (next < total) results.push(await one(next++));
}));
const seconds = (performance.now() - t0) / 1000;
stopServer(server);
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const ttfts = results.map((r) => r.ttft);
console.log(`| serve flags | clients | requests | completed | output tok/s | TTFT p50 | TTFT p99 |`);
console.log(`|---|---|---|---|---|---|---|`);
console.log(`| ${extra.join(' ') || '(defaults)'} | ${clients} | ${total} | ${results.length} | ${(results.length * maxTokens / seconds).toFixed(0)} | ${pct(ttfts, 0.5).toFixed(0)} ms | ${pct(ttfts, 0.99).toFixed(0)} ms |`);
