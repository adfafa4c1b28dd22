// Continuous batching must not change a token: 32 concurrent greedy requests
// of mixed lengths (some sharing a long system prompt, some not, chat and
// completions) on a server batching up to 32 sequences give exactly what each
// gives alone on a strictly serial server (--batch 1, no prefix cache).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { sleep, startServer, stopServer } from '../support/kettle_server.mjs';

let serial, batched;
before(async () => {
  serial = await startServer(['--batch', '1', '--prompt-cache', '0']);
  batched = await startServer(['--batch', '32']);
});
after(() => { stopServer(serial); stopServer(batched); });

const system = 'You are a dictionary. Give the definition, then an example sentence. ';
const words = ['kettle', 'teapot', 'water', 'fire', 'stone', 'river', 'house', 'bread', 'salt', 'iron', 'glass', 'wool',
  'horse', 'cloud', 'bell', 'rope'];
function requests() {
  const out = [];
  words.forEach((word, i) => {
    const max_tokens = 6 + (i * 7) % 37;
    out.push({ path: 'chat/completions', body: { messages: [{ role: 'system', content: system.repeat(1 + (i % 3)) }, { role: 'user', content: `What is ${word}?` }], max_tokens, temperature: 0, ignore_eos: i % 2 === 0 } });
    out.push({ path: 'completions', body: { prompt: `${word[0].toUpperCase()}${word.slice(1)}, n.`.repeat(1 + (i % 4)), max_tokens: max_tokens + 3, temperature: 0 } });
  });
  return out;
}
async function run(server, { path, body }) {
  const res = await fetch(`${server.base}/v1/${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(res.status, 200);
  const j = await res.json();
  const c = j.choices[0];
  return { text: c.message?.content ?? c.text, finish: c.finish_reason, tokens: j.usage.completion_tokens };
}

test('32 concurrent requests equal each request run alone', async () => {
  const reqs = requests();
  assert.equal(reqs.length, 32);
  const alone = [];
  for (const r of reqs) alone.push(await run(serial, r));
  let maxRunning = 0;
  let polling = true;
  const poll = (async () => {
    while (polling) {
      maxRunning = Math.max(maxRunning, (await (await fetch(`${batched.base}/stats`)).json()).requests.running);
      await sleep(20);
    }
  })();
  const together = await Promise.all(reqs.map((r) => run(batched, r)));
  polling = false;
  await poll;
  for (let i = 0; i < reqs.length; i++) assert.deepEqual(together[i], alone[i], `request ${i}: ${JSON.stringify(reqs[i].body)}`);
  assert.ok(maxRunning >= 8, `at most ${maxRunning} sequences ran at once`);
  assert.ok(together.some((r) => r.finish === 'length') && together.some((r) => r.tokens > 30));
});

// And with a quantized KV cache (turbo: keys 8-bit affine, values rotated 3-bit Lloyd-Max,
// the most involved codec), its cached prefixes adopted by later requests.
test('--kv-quant turbo: 32 concurrent requests equal each run alone on a serial server of the same cache', async () => {
  const quantSerial = await startServer(['--batch', '1', '--prompt-cache', '0', '--kv-quant', 'turbo']);
  const quantBatched = await startServer(['--batch', '32', '--kv-quant', 'turbo']);
  try {
    const reqs = requests();
    const alone = [];
    for (const r of reqs) alone.push(await run(quantSerial, r));
    const together = await Promise.all(reqs.map((r) => run(quantBatched, r)));
    for (let i = 0; i < reqs.length; i++) assert.deepEqual(together[i], alone[i], `request ${i}: ${JSON.stringify(reqs[i].body)}`);
    const stats = await (await fetch(`${quantBatched.base}/stats`)).json();
    assert.equal(stats.kv.quant, 'turbo:k8v3');
    assert.ok(stats.prefix_cache.hits > 0, 'no request adopted a cached (quantized) prefix');
  } finally {
    stopServer(quantSerial);
    stopServer(quantBatched);
  }
});

test('a long prompt prefilled in chunks beside running streams gives the same tokens', async () => {
  const chunked = await startServer(['--batch', '4', '--prefill-chunk', '64', '--prompt-cache', '0']);
  try {
    const long = { path: 'completions', body: { prompt: 'Kettle, n. A vessel of metal for boiling water. '.repeat(40), max_tokens: 12, temperature: 0 } };
    const short = { path: 'chat/completions', body: { messages: [{ role: 'user', content: 'What is a kettle?' }], max_tokens: 40, temperature: 0, ignore_eos: true } };
    const [a, b] = await Promise.all([run(chunked, short), (async () => { await sleep(50); return run(chunked, long); })()]);
    assert.deepEqual(a, await run(serial, short));
    assert.deepEqual(b, await run(serial, long));
  } finally {
    stopServer(chunked);
  }
});

// Tensor parallelism on CPU ranks (issue 8's split, behind the real server): the demo
// model split over two ranks (heads, MLP columns and vocabulary) serves concurrent
// requests with the tokens the whole model gives each alone, and the prefix cache lends
// a repeated prompt's blocks to the next request.
test('--tensor-parallel 2 serves the same tokens, batched, with the prefix cache', async () => {
  const split = await startServer(['--tensor-parallel', '2', '--batch', '8']);
  try {
    const reqs = requests().slice(0, 12);
    const alone = [];
    for (const r of reqs) alone.push(await run(serial, r));
    const together = await Promise.all(reqs.map((r) => run(split, r)));
    for (let i = 0; i < reqs.length; i++) assert.deepEqual(together[i], alone[i], `request ${i}: ${JSON.stringify(reqs[i].body)}`);
    const again = await fetch(`${split.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(reqs[4].body),
    });
    const usage = (await again.json()).usage;
    assert.ok(usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(usage));
  } finally {
    stopServer(split);
  }
});

test('--tensor-parallel that the model cannot split exits non-zero naming the flag', async () => {
  const { spawnSync } = await import('node:child_process');
  // The demo model has 6 attention heads and 2 KV heads: 4 ranks cannot share them out.
  const r = spawnSync(process.env.KETTLE_BIN, ['serve', '--port', '65002', '--tp', '4', '--no-open'], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--tensor-parallel 4: the model's (attention|KV) heads \(\d+\) does not divide by 4/);
});
