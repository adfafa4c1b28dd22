// Time to first token with and without the prefix cache: a long shared system
// prompt (~1,500 tokens on the demo model), then questions that share it.
//   cd tests && KETTLE_BIN=../build/kettle node ../bench/prefix_cache_ttft.mjs [MODEL_DIR] [ROUNDS]
import { sseJson, startServer, stopServer } from '../tests/support/kettle_server.mjs';

const model = process.argv[2] ? [process.argv[2]] : [];
const rounds = Number(process.argv[3] ?? 5);
const system = Array.from({ length: 60 }, (_, i) => `Rule ${i + 1}: answer as the dictionary does, with one example.`).join(' ');

// Milliseconds from sending the request to the first chunk with content (the role chunk comes first).
async function ttft(base, question) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      messages: [{ role: 'system', content: system }, { role: 'user', content: question }],
      max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true }, ignore_eos: true,
    }),
  });
  let first = null, usage = null;
  for await (const chunk of sseJson(res)) {
    if (first === null && chunk.choices?.[0]?.delta?.content) first = performance.now() - t0;
    usage = chunk.usage ?? usage;
  }
  return { ms: first, prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details.cached_tokens };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = [];
for (const [label, args] of [['cache on', []], ['cache off', ['--prompt-cache', '0']]]) {
  const server = await startServer([...model, ...args]);
  const times = [];
  let last;
  for (let r = 0; r < rounds; r++) { last = await ttft(server.base, `Question ${r}: what is a kettle?`); times.push(last.ms); }
  rows.push({ label, first: times[0], median_later: median(times.slice(1)), prompt: last.prompt, cached: last.cached });
  stopServer(server);
}
console.log('| server | prompt tokens | cached (later requests) | TTFT first request | TTFT later (median) |');
console.log('|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.label} | ${r.prompt} | ${r.cached} | ${r.first.toFixed(1)} ms | ${r.median_later.toFixed(1)} ms |`);
