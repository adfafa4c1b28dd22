// Running `kettle serve` as an operator sees it: /stats and /metrics agree
// with the usage the clients were told; browsers' CORS preflight; a full
// queue answers 429 with Retry-After; a client that leaves a non-streaming
// request cancels its generation; SIGTERM past --drain-timeout cancels the
// in-flight stream with an error event and still exits 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { sleep, startServer, stopServer } from '../support/kettle_server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
});
after(() => stopServer(server));

const stats = async (s = server) => (await fetch(`${s.base}/stats`)).json();
// One sample of a Prometheus text exposition: the value of `name{labels}`, summed over matching lines.
function sample(text, name, labels = '') {
  return text.split('\n').filter((l) => l.startsWith(name + '{') && l.includes(labels))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}

test('/stats and /metrics count what the clients were told', async () => {
  const before = await stats();
  const beforeText = await (await fetch(`${server.base}/metrics`)).text();
  let prompt = 0, completion = 0;
  for (const max_tokens of [3, 5, 7]) {
    const r = await client.completions.create({ prompt: 'Once upon a time', max_tokens, temperature: 0, ignore_eos: true });
    prompt += r.usage.prompt_tokens;
    completion += r.usage.completion_tokens;
  }
  const after = await stats();
  assert.equal(after.tokens.prompt - before.tokens.prompt, prompt);
  assert.equal(after.tokens.completion - before.tokens.completion, completion);
  assert.equal(after.generations - before.generations, 3);
  assert.equal(after.requests.running, 0);
  assert.equal(after.requests.queued, 0);
  assert.equal(after.model, 'kettle-demo');
  const res = await fetch(`${server.base}/metrics`);
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  assert.equal(sample(text, 'kettle_generation_tokens_total') - sample(beforeText, 'kettle_generation_tokens_total'), completion);
  assert.equal(sample(text, 'kettle_prompt_tokens_total') - sample(beforeText, 'kettle_prompt_tokens_total'), prompt);
  assert.equal(sample(text, 'kettle_http_requests_total', 'route="/v1/completions",status="200"') -
    sample(beforeText, 'kettle_http_requests_total', 'route="/v1/completions",status="200"'), 3);
  // every family is declared once, and the histogram's +Inf bucket equals its count
  for (const family of text.match(/^# TYPE \S+/gm)) assert.equal(text.split(family + ' ').length, 2, family);
  assert.equal(sample(text, 'kettle_time_to_first_token_seconds_bucket', 'le="+Inf"'),
    sample(text, 'kettle_time_to_first_token_seconds_count'));
});

test('CORS: the chat page origin passes; another origin is refused unless --cors-origin names it', async () => {
  const own = await fetch(`${server.base}/v1/models`, { headers: { origin: server.base } });
  assert.equal(own.status, 200);
  const pre = await fetch(`${server.base}/v1/chat/completions`, {
    method: 'OPTIONS',
    headers: { origin: 'http://example.test', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,authorization' },
  });
  assert.equal(pre.status, 403);
  assert.equal(pre.headers.get('access-control-allow-origin'), null);
  // a simple (no-preflight) text/plain POST from another site is refused before it runs
  const simple = await fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { origin: 'http://example.test', 'content-type': 'text/plain' }, body: '{"prompt":"hi","max_tokens":1}',
  });
  assert.equal(simple.status, 403);
  assert.match((await simple.json()).error.message, /example\.test/);
  const allowed = await startServer(['--cors-origin', 'http://example.test']);
  try {
    const ok = await fetch(`${allowed.base}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://example.test', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,authorization' },
    });
    assert.equal(ok.status, 204);
    assert.equal(ok.headers.get('access-control-allow-origin'), 'http://example.test');
    assert.match(ok.headers.get('access-control-allow-methods'), /POST/);
    assert.match(ok.headers.get('access-control-allow-headers'), /Authorization/i);
    const r = await fetch(`${allowed.base}/v1/models`, { headers: { origin: 'http://example.test' } });
    assert.equal(r.headers.get('access-control-allow-origin'), 'http://example.test');
    const other = await fetch(`${allowed.base}/v1/models`, { headers: { origin: 'http://elsewhere.test' } });
    assert.equal(other.status, 403);
  } finally {
    stopServer(allowed);
  }
});

test('a full queue answers 429 with Retry-After; the admitted requests all finish', async () => {
  const own = await startServer(['--max-queue', '1', '--batch', '1']);
  try {
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 60, ignore_eos: true });
    const post = () => fetch(`${own.base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const results = await Promise.all(Array.from({ length: 5 }, async (_, i) => { await sleep(30 * i); return post(); }));
    const statuses = results.map((r) => r.status);
    assert.ok(statuses.includes(429), statuses.join(','));
    assert.ok(statuses.filter((s) => s === 200).length >= 2, statuses.join(','));
    for (const r of results) {
      const j = await r.json();
      if (r.status === 429) {
        assert.equal(r.headers.get('retry-after'), '1');
        assert.equal(j.error.type, 'rate_limit_error');
      } else {
        assert.equal(r.status, 200);
        assert.equal(j.usage.completion_tokens, 60);
      }
    }
  } finally {
    stopServer(own);
  }
});

test('a client that leaves a non-streaming request cancels its generation', async () => {
  const controller = new AbortController();
  const request = fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: controller.signal,
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, ignore_eos: true }),
  }).catch(() => null);
  for (let i = 0; i < 50 && (await stats()).requests.running === 0; i++) await sleep(50);
  assert.equal((await stats()).requests.running, 1);
  controller.abort();
  await request;
  const t0 = Date.now();
  while ((await stats()).requests.running !== 0 && Date.now() - t0 < 5000) await sleep(50);
  assert.equal((await stats()).requests.running, 0, 'the generation kept running after its client left');
  assert.match(server.stderr, /generation cancelled/);
  const text = await (await fetch(`${server.base}/metrics`)).text();
  assert.ok(sample(text, 'kettle_http_requests_total', 'status="499"') >= 1);
  const r = await client.completions.create({ prompt: 'Hello', max_tokens: 3, temperature: 0 });
  assert.equal(r.usage.completion_tokens <= 3, true);
});

test('SIGTERM past --drain-timeout: the stream gets an error event, the process exits 0', async () => {
  const own = await startServer(['--drain-timeout', '0.5']);
  try {
    const res = await fetch(`${own.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1900, ignore_eos: true, stream: true }),
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    let signalled = false;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      if (!signalled && text.includes('"content"')) { signalled = true; own.proc.kill('SIGTERM'); }
    }
    assert.ok(signalled);
    const events = text.trim().split('\n\n').map((e) => JSON.parse(e.replace(/^data: /, '')));
    const last = events.at(-1);
    assert.equal(last.error?.type, 'server_error', JSON.stringify(last));
    assert.match(last.error.message, /shutting down/);
    assert.ok(!text.includes('[DONE]'));
    const exit = await Promise.race([own.exit, sleep(20000).then(() => 'timeout')]);
    assert.deepEqual(exit, { code: 0, signal: null });
    assert.match(own.stderr, /cancelling/);
  } finally {
    stopServer(own);
  }
});

test('--kv-budget: requests whose KV does not fit beside the running ones wait; one that never fits is 400', async () => {
  // The demo model keeps 8 layers × 128 floats × (k, v) = 8 KiB of KV per token: 0.0005 GB ≈ 61 tokens.
  const own = await startServer(['--kv-budget', '0.0005', '--batch', '8']);
  try {
    const post = (body) => fetch(`${own.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const messages = [{ role: 'user', content: 'What is a kettle?' }];
    const never = await post({ messages, max_tokens: 100 });
    assert.equal(never.status, 400);
    const err = await never.json();
    assert.equal(err.error.code, 'kv_budget_exceeded');
    assert.equal(err.error.param, 'max_tokens');
    assert.match(err.error.message, /--kv-budget/);
    let maxRunning = 0, maxQueued = 0, polling = true;
    const poll = (async () => {
      while (polling) {
        const s = (await (await fetch(`${own.base}/stats`)).json()).requests;
        maxRunning = Math.max(maxRunning, s.running);
        maxQueued = Math.max(maxQueued, s.queued);
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    const results = await Promise.all(Array.from({ length: 4 }, () => post({ messages, max_tokens: 30, temperature: 0, ignore_eos: true })));
    polling = false;
    await poll;
    for (const r of results) {
      assert.equal(r.status, 200);
      assert.equal((await r.json()).usage.completion_tokens, 30);
    }
    assert.equal(maxRunning, 1, 'two sequences of 45 tokens do not fit in 61 tokens of KV');
    assert.ok(maxQueued >= 1);
    const stats = await (await fetch(`${own.base}/stats`)).json();
    assert.equal(stats.kv.budget_bytes, 500000);
    assert.equal(stats.kv.bytes_in_use, 0);
  } finally {
    stopServer(own);
  }
});

test('--paged-kv-block-size sets the KV block; --paged-kv is accepted; greedy tokens do not depend on the block size', async () => {
  const a = await startServer(['--paged-kv', '--paged-kv-block-size', '32', '--prompt-cache', '0']);
  const b = await startServer(['--paged-kv-block-size', '5', '--prompt-cache', '0']);
  try {
    const body = { messages: [{ role: 'user', content: 'Tell me about kettles and teapots.' }], max_tokens: 40, temperature: 0, ignore_eos: true };
    const ask = async (s) => (await (await fetch(`${s.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    })).json()).choices[0].message.content;
    assert.equal(await ask(a), await ask(b));
    assert.equal((await (await fetch(`${a.base}/stats`)).json()).kv.block_size, 32);
    assert.equal((await (await fetch(`${b.base}/stats`)).json()).kv.block_size, 5);
  } finally {
    stopServer(a);
    stopServer(b);
  }
});

test('--memory-budget below the weights exits non-zero naming the flag; a workable one caps the KV cache', async () => {
  const { spawnSync } = await import('node:child_process');
  const kettle = process.env.KETTLE_BIN;
  const small = spawnSync(kettle, ['serve', '--port', '65001', '--memory-budget', '0.5', '--no-open'], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(small.status, 0);
  assert.match(small.stderr, /--memory-budget 0\.50 GB does not hold the model's weights/);
  // 2 GiB and a prefill step's activations are set aside as working memory: 2.3 GB leaves the
  // demo model's KV a few tens of MB.
  const own = await startServer(['--memory-budget', '2.3']);
  try {
    const kv = (await (await fetch(`${own.base}/stats`)).json()).kv;
    assert.ok(kv.budget_bytes > 0 && kv.budget_bytes < 100e6, JSON.stringify(kv));
  } finally {
    stopServer(own);
  }
});

// One memory policy: `kettle fit` reports the KV budget and prompt cache `serve` allocates
// for the same model and flags (on the same default device).
test('fit reports exactly the KV budget and prompt cache serve allocates with the same flags', async () => {
  const { execFileSync } = await import('node:child_process');
  const kettle = process.env.KETTLE_BIN;
  for (const flags of [['--memory-budget', '2.3'], ['--kv-budget', '0.05', '--prompt-cache', '0.01'],
                       ['--memory-budget', '2.4', '--kv-budget', '0.09', '--prefill-chunk', '512']]) {
    const fit = JSON.parse(execFileSync(kettle, ['fit', '--json', ...flags], { encoding: 'utf8' }));
    const own = await startServer(flags);
    try {
      const stats = await (await fetch(`${own.base}/stats`)).json();
      assert.equal(stats.kv.budget_bytes, fit.kv_budget_bytes, flags.join(' '));
      assert.equal(stats.prefix_cache.capacity_bytes, fit.prompt_cache_bytes, flags.join(' '));
      assert.ok(fit.kv_budget_bytes > 0);
    } finally {
      stopServer(own);
    }
  }
});
