// Embeddings against sentence-transformers: `kettle embed` and POST /v1/embeddings (through
// the official openai client, which asks for base64 by default and decodes it) on the
// embedding goldens (tests/data/embedding-goldens: tiny decoder embedding models saved as
// sentence-transformers saves them, with what it computed). Cosine >= 0.9999 per text,
// the same token counts, whole and chunked prefill, prompts, Matryoshka dimensions,
// token-id inputs, and the refusals by name.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const root = new URL('../data/embedding-goldens/', import.meta.url).pathname;
const demo = new URL('../../models/kettle-demo', import.meta.url).pathname;
const golden = (name) => JSON.parse(readFileSync(`${root}${name}/golden.json`, 'utf8'));
const modelDir = (name) => `${root}${name}/model`;
const qwen = golden('qwen3_last');
const llama = golden('llama_mean');

function cosine(a, b) {
  assert.equal(a.length, b.length);
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) { ab += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return ab / Math.sqrt(aa * bb);
}
function assertClose(got, want, what) {
  const c = cosine(got, want);
  assert.ok(c >= 0.9999, `${what}: cosine ${c}`);
}
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

// kettle with `input` on stdin, without blocking the event loop (the servers' kept-alive
// connections stay serviced meanwhile).
function runKettle(args, input = '') {
  return new Promise((resolve, reject) => {
    const child = spawn(kettle, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
    child.stdin.end(input);
  });
}

async function embedCli(name, cases, extra = []) {
  const r = await runKettle(['embed', '-m', modelDir(name), '--file', '-', ...extra], cases.map((c) => c.text).join('\n') + '\n');
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim().split('\n').map((l) => JSON.parse(l));
}

for (const [name, data] of [['qwen3_last', qwen], ['llama_mean', llama]]) {
  for (const [label, extra] of [['whole', []], ['chunked by 7, batch 3', ['--prefill-chunk', '7', '--batch', '3']]]) {
    test(`kettle embed ${name} (${data.pooling}, ${label}) equals sentence-transformers`, async () => {
      for (const prompt of [null, 'query']) {
        const cases = data.cases.filter((c) => c.prompt_name === prompt);
        if (cases.length === 0) continue;
        const rows = await embedCli(name, cases, [...extra, ...(prompt ? ['--prompt-name', prompt] : [])]);
        assert.equal(rows.length, cases.length);
        rows.forEach((r, i) => {
          assert.equal(r.index, i);
          assert.equal(r.tokens, cases[i].input_ids.length, `${name} text ${i}: token count`);
          assertClose(r.embedding, cases[i].embedding, `${name} ${prompt ?? 'no prompt'} text ${i}`);
          if (data.normalize) assert.ok(Math.abs(norm(r.embedding) - 1) < 1e-5);
        });
      }
    });
  }
}

test('kettle embed: --dimensions truncates and renormalizes; refusals exit non-zero naming the input', async () => {
  const cases = qwen.cases.filter((c) => c.prompt_name === null);
  const rows = await embedCli('qwen3_last', cases, ['--dimensions', '32']);
  rows.forEach((r, i) => {
    assert.equal(r.embedding.length, 32);
    assertClose(r.embedding, cases[i].embedding_truncated, `text ${i} at 32 dimensions`);
  });
  const fails = async (args, pattern) => {
    const r = await runKettle(['embed', ...args]);
    assert.notEqual(r.status, 0, `${args.join(' ')} should fail`);
    assert.match(r.stderr, pattern);
  };
  await fails(['-m', modelDir('llama_mean'), '--text', 'hi', '--dimensions', '32'], /not Matryoshka/);
  await fails(['-m', modelDir('qwen3_last'), '--text', 'hi', '--prompt-name', 'passage'], /prompt_name 'passage'.*'document', 'query'/);
  await fails(['-m', demo, '--text', 'hi'], /not an embedding model/);
  await fails(['-m', modelDir('qwen3_last'), '--text', 'word '.repeat(600)], /input 0 has \d+ tokens; this model embeds at most 512/);
});

let qwenServer, llamaServer, demoServer;
const client = (s) => new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 60000 });
before(async () => {
  qwenServer = await startServer([modelDir('qwen3_last'), '--batch', '4']);
  llamaServer = await startServer([modelDir('llama_mean')]);
  demoServer = await startServer([demo]);
});
after(() => { for (const s of [qwenServer, llamaServer, demoServer]) stopServer(s); });

test('embeddings.create (base64 by the client, and float): every input in order, equal to sentence-transformers', async () => {
  for (const [server, data] of [[qwenServer, qwen], [llamaServer, llama]]) {
    const cases = data.cases.filter((c) => c.prompt_name === null);
    const input = cases.map((c) => c.text);
    for (const encoding_format of [undefined, 'float']) {
      const r = await client(server).embeddings.create({ model: 'text-embedding-3-small', input, encoding_format });
      assert.equal(r.object, 'list');
      assert.equal(r.data.length, cases.length);
      r.data.forEach((d, i) => {
        assert.equal(d.index, i);
        assert.equal(d.object, 'embedding');
        assertClose(d.embedding, cases[i].embedding, `${data.pooling} text ${i} (${encoding_format ?? 'base64'})`);
      });
      const tokens = cases.reduce((s, c) => s + c.input_ids.length, 0);
      assert.equal(r.usage.prompt_tokens, tokens);
      assert.equal(r.usage.total_tokens, tokens);
      assert.notEqual(r.model, 'text-embedding-3-small');  // the served model's id
    }
  }
});

test('raw base64 is the little-endian float32 bytes; a single string input; prompt_name; dimensions; token ids', async () => {
  const c = qwen.cases.filter((x) => x.prompt_name === null);
  const raw = await (await fetch(`${qwenServer.base}/v1/embeddings`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ input: c[0].text, encoding_format: 'base64' }),
  })).json();
  const bytes = Buffer.from(raw.data[0].embedding, 'base64');
  const floats = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
  assertClose(floats, c[0].embedding, 'base64 bytes');

  const q = qwen.cases.filter((x) => x.prompt_name === 'query');
  const withPrompt = await client(qwenServer).embeddings.create({ model: 'm', input: q.map((x) => x.text), prompt_name: 'query' });
  withPrompt.data.forEach((d, i) => assertClose(d.embedding, q[i].embedding, `query text ${i}`));
  assert.equal(withPrompt.usage.prompt_tokens, q.reduce((s, x) => s + x.input_ids.length, 0));

  const short = await client(qwenServer).embeddings.create({ model: 'm', input: c.map((x) => x.text), dimensions: 32, encoding_format: 'float' });
  short.data.forEach((d, i) => {
    assert.equal(d.embedding.length, 32);
    assertClose(d.embedding, c[i].embedding_truncated, `text ${i} at 32 dimensions`);
  });

  const ids = await client(qwenServer).embeddings.create({ model: 'm', input: c.map((x) => x.input_ids), encoding_format: 'float' });
  ids.data.forEach((d, i) => assertClose(d.embedding, c[i].embedding, `token ids of text ${i}`));
  const one = await client(qwenServer).embeddings.create({ model: 'm', input: c[1].input_ids, encoding_format: 'float' });
  assert.equal(one.data.length, 1);
  assertClose(one.data[0].embedding, c[1].embedding, 'one list of token ids');
});

test('refusals: 400 naming the field, the server keeps serving', async () => {
  const refused = async (server, body, param, pattern) => {
    const r = await fetch(`${server.base}/v1/embeddings`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(r.status, 400, JSON.stringify(body));
    const e = (await r.json()).error;
    if (param) assert.equal(e.param, param);
    assert.match(e.message, pattern);
    return e;
  };
  const e = await refused(demoServer, { input: 'hi' }, 'model', /not an embedding model/);
  assert.equal(e.code, 'model_not_embedding');
  await refused(llamaServer, { input: 'hi', dimensions: 32 }, 'dimensions', /not Matryoshka/);
  await refused(qwenServer, { input: 'hi', dimensions: 65 }, 'dimensions', /give 1 to 64/);
  await refused(qwenServer, { input: 'hi', prompt_name: 'passage' }, 'prompt_name', /'document', 'query'/);
  await refused(qwenServer, { input: ['a', 'word '.repeat(600)] }, 'input[1]', /input 1 has \d+ tokens/);
  await refused(qwenServer, { input: [] }, 'input', /not empty/);
  await refused(qwenServer, { input: '' }, 'input', /non-empty/);
  await refused(qwenServer, { input: ['a', [1, 2]] }, 'input[1]', /same kind/);
  await refused(qwenServer, { input: [1, 99999] }, 'input', /token ids in \[0, 4096\)/);
  await refused(qwenServer, { input: Array(2049).fill('a') }, 'input', /at most 2048/);
  await refused(qwenServer, { input: 'a', encoding_format: 'int8' }, 'encoding_format', /"float" or "base64"/);
  await refused(qwenServer, { input: 'a', normalize: false }, 'normalize', /normalize/);
  await refused(qwenServer, { input: 'a', color: 'blue' }, 'color', /color/);
  await refused(qwenServer, { input: [5, 6], prompt_name: 'query' }, 'prompt_name', /token-id inputs/);
  // An embedding model asked to generate.
  const g = await fetch(`${qwenServer.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(g.status, 400);
  assert.equal((await g.json()).error.code, 'model_not_generative');
  const r = await client(qwenServer).embeddings.create({ model: 'm', input: 'still here', encoding_format: 'float' });
  assert.equal(r.data[0].embedding.length, 64);
  const card = await client(qwenServer).models.retrieve('anything');
  assert.deepEqual(card.capabilities, ['embedding']);
});
