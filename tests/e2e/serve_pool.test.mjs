// `serve --model-pool N`: three demo-sized models (the bundled demo, its draft
// model, and the demo converted to 8 bits) behind --model-pool 2, requests
// alternating among them through the official OpenAI and Anthropic clients:
// every answer equals the one a single-model server of that model gives; at
// most 2 engines run at once; the least recently used is stopped (its prefix
// cache written to its disk-tier folder); /v1/models lists every local model
// with its size, quantization and fit; an unknown name is 404 model_not_found;
// a stored response is found in whichever engine made it; an engine whose model
// cannot load gives its slot up before a working one does.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, mkdirSync, rmSync, symlinkSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { kettle, freePort, sleep, startServer, stopServer } from '../support/kettle_server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = mkdtempSync(join(tmpdir(), 'kettle-pool-'));
const modelsDir = join(root, 'models');
const ssdDir = join(root, 'ssd');
const running = [];
const models = ['kettle-demo', 'kettle-demo-draft', 'demo-q8'];
const single = new Map();  // model id → its own single-model server
let pool;

async function startPool(args, dir = modelsDir) {
  const port = await freePort();
  const proc = spawn(kettle, ['serve', '--model-pool', '2', '--models-dir', dir, '--port', String(port),
    '--threads', '2', '--no-open', ...args], { stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, HF_HUB_CACHE: join(root, 'empty-hub') } });
  const server = { proc, port, stderr: '', exited: null, base: `http://127.0.0.1:${port}` };
  running.push(server);
  proc.stderr.on('data', (d) => { server.stderr += d; });
  server.exit = new Promise((r) => proc.on('exit', (code, signal) => { server.exited = { code, signal }; r(server.exited); }));
  for (let i = 0; i < 300 && !server.exited; i++) {
    try { if ((await fetch(`${server.base}/health`)).ok) return server; } catch { /* not up yet */ }
    await sleep(100);
  }
  throw new Error(`kettle serve --model-pool did not come up: ${server.stderr}`);
}

before(async () => {
  mkdirSync(modelsDir);
  symlinkSync(resolve(here, '../../models/kettle-demo'), join(modelsDir, 'kettle-demo'));
  symlinkSync(resolve(here, '../../models/kettle-demo-draft'), join(modelsDir, 'kettle-demo-draft'));
  execFileSync(kettle, ['convert', '-q', '--q-bits', '8', '--threads', '2', resolve(here, '../../models/kettle-demo'),
    join(modelsDir, 'demo-q8')], { stdio: 'ignore' });
  for (const m of models) {
    const s = await startServer([join(modelsDir, m), '--no-open']);
    running.push(s);
    single.set(m, s);
  }
  pool = await startPool(['--ssd-cache', ssdDir]);
});
after(() => {
  for (const s of running) stopServer(s);
  rmSync(root, { recursive: true, force: true });
});

const chat = (base, model, content) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 })
  .chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: 24, temperature: 0 });
const message = (base, model, content) => new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 })
  .messages.create({ model, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content }] });
const engines = async () => (await (await fetch(`${pool.base}/engine`)).json()).engines;
const filesUnder = (dir) => {
  let n = 0;
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    n += statSync(p).isDirectory() ? filesUnder(p) : 1;
  }
  return n;
};

test('requests alternating among three models behind --model-pool 2 get the single-model servers\' answers', async () => {
  for (let round = 0; round < 2; round++) {
    for (const [i, m] of models.entries()) {
      const content = `Round ${round}, model ${i}: tell me about the sea`;
      const [got, want] = await Promise.all([chat(pool.base, m, content), chat(single.get(m).base, m, content)]);
      assert.equal(got.choices[0].message.content, want.choices[0].message.content, `${m}, round ${round}`);
      assert.equal(got.model, m);
      const [gotA, wantA] = await Promise.all([message(pool.base, m, content), message(single.get(m).base, m, content)]);
      assert.deepEqual(gotA.content, wantA.content, `${m} (Anthropic), round ${round}`);
      const now = await engines();
      assert.ok(now.length <= 2, `at most 2 engines: ${JSON.stringify(now)}`);
      assert.ok(now.some((e) => e.model === m && e.state === 'ready'), `${m} runs: ${JSON.stringify(now)}`);
    }
  }
  // demo-q8 was evicted (least recently used) at least once: its prefix cache went to its own disk-tier folder.
  assert.ok(filesUnder(join(ssdDir, 'demo-q8')) > 0, 'the evicted engine wrote its prefix cache to the disk tier');
  assert.match(pool.stderr, /stopping demo-q8 \(least recently used\)/);
});

test('requests for three models at once behind --model-pool 2: each answered, each as its own server answers', async () => {
  const asks = [];
  for (let i = 0; i < 6; i++) asks.push({ m: models[i % 3], content: `Concurrent ${i}: a short poem` });
  const got = await Promise.all(asks.map((a) => chat(pool.base, a.m, a.content)));
  const want = await Promise.all(asks.map((a) => chat(single.get(a.m).base, a.m, a.content)));
  for (let i = 0; i < asks.length; i++) assert.equal(got[i].choices[0].message.content, want[i].choices[0].message.content);
  assert.ok((await engines()).length <= 2);
});

test('/v1/models lists every local model with its size, quantization and fit; an unknown model is 404', async () => {
  const list = await (await fetch(`${pool.base}/v1/models`)).json();
  const byId = new Map(list.data.map((m) => [m.id, m]));
  for (const m of models) {
    const card = byId.get(m);
    assert.ok(card, `${m} listed: ${JSON.stringify(list)}`);
    assert.equal(card.object, 'model');
    assert.equal(card.fits, true);
    assert.ok(card.bytes > 0);
    assert.equal(typeof card.loaded, 'boolean');
  }
  assert.equal(byId.get('demo-q8').quantization, 'affine 8-bit');
  assert.equal(byId.get('kettle-demo').quantization, null);
  assert.ok(byId.get('kettle-demo').bytes > byId.get('demo-q8').bytes);
  // The official client sees a missing model as NotFoundError with OpenAI's code.
  await assert.rejects(chat(pool.base, 'no-such-model', 'hi'), (e) => e.status === 404 && e.code === 'model_not_found');
  // A unique part of an id names it, as `kettle ls` queries do.
  const part = await chat(pool.base, 'q8', 'tell me about the sea');
  assert.equal(part.model, 'demo-q8');
});

test('a stored response is retrieved and deleted through the pool, whichever engine made it', async () => {
  const c = new OpenAI({ baseURL: `${pool.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const made = await c.responses.create({ model: 'kettle-demo-draft', input: 'Name a colour', max_output_tokens: 6,
    temperature: 0 });
  await chat(pool.base, 'kettle-demo', 'Hello there');  // the maker is no longer the most recently used engine
  const running = (await engines()).map((e) => e.model).sort();
  assert.deepEqual(running, ['kettle-demo', 'kettle-demo-draft']);
  const got = await c.responses.retrieve(made.id);
  assert.equal(got.id, made.id);
  assert.equal(got.model, 'kettle-demo-draft');
  assert.deepEqual(got.output, made.output);
  const deleted = await fetch(`${pool.base}/v1/responses/${made.id}`, { method: 'DELETE' });
  assert.deepEqual(await deleted.json(), { id: made.id, object: 'response.deleted', deleted: true });
  await assert.rejects(c.responses.retrieve(made.id), (e) => e.status === 404);
  await assert.rejects(c.responses.retrieve('resp_unknown'), (e) => e.status === 404);
});

test('SIGTERM to a pool\'s parent stops every engine child, then it exits 0', async () => {
  const server = await startPool([]);
  await chat(server.base, 'kettle-demo-draft', 'hello');
  const pids = (await (await fetch(`${server.base}/engine`)).json()).engines.map((e) => e.pid);
  assert.equal(pids.length, 2);
  server.proc.kill('SIGTERM');
  assert.deepEqual(await server.exit, { code: 0, signal: null });
  for (const pid of pids) assert.throws(() => process.kill(pid, 0), 'the engine child is gone');
});

test('a model that cannot load is down and gives its slot up first: the next model takes it, not a working engine', { timeout: 180000 }, async () => {
  const dir = join(root, 'models-with-broken');
  mkdirSync(dir);
  for (const m of ['kettle-demo', 'kettle-demo-draft']) symlinkSync(resolve(here, '../../models', m), join(dir, m));
  const broken = join(dir, 'broken-model');
  mkdirSync(broken);
  for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json'])
    cpSync(resolve(here, '../../models/kettle-demo', f), join(broken, f));
  writeFileSync(join(broken, 'model.safetensors'), Buffer.alloc(1000));  // no safetensors header: it cannot load
  const server = await startPool([], dir);
  running.push(server);
  const view = async () => (await (await fetch(`${server.base}/engine`)).json()).engines;
  await chat(server.base, 'kettle-demo', 'hello');
  const demo = (await view()).find((e) => e.model === 'kettle-demo');
  // The broken model's child fails until the restart limit: the request is told the engine is down.
  await assert.rejects(chat(server.base, 'broken-model', 'hello'), (e) => e.status === 503 && /engine is down/.test(e.message));
  assert.equal((await view()).find((e) => e.model === 'broken-model').state, 'down');
  // Two slots, both taken, the down engine the most recently used: it goes, the working one stays.
  assert.equal((await chat(server.base, 'kettle-demo-draft', 'hello')).model, 'kettle-demo-draft');
  const now = await view();
  assert.deepEqual(now.map((e) => e.model).sort(), ['kettle-demo', 'kettle-demo-draft']);
  assert.equal(now.find((e) => e.model === 'kettle-demo').pid, demo.pid, 'the working engine was not stopped');
  assert.match(server.stderr, /stopping broken-model \(down\) to load kettle-demo-draft/);
  stopServer(server);
});

test('--served-model-name names the model in /v1/models and in answers', async () => {
  const server = await startServer([join(modelsDir, 'kettle-demo-draft'), '--no-open', '--served-model-name', 'house-model']);
  running.push(server);
  const list = await (await fetch(`${server.base}/v1/models`)).json();
  assert.deepEqual(list.data.map((m) => m.id), ['house-model']);
  assert.equal((await chat(server.base, 'house-model', 'hello')).model, 'house-model');
});

test('ls --device-share: the memory each model is fitted against is that share of what the device has', () => {
  const ls = (args) => JSON.parse(execFileSync(kettle, ['ls', '--json', '--device', 'cpu', '--models-dir', modelsDir, ...args],
    { env: { ...process.env, HF_HUB_CACHE: join(root, 'empty-hub') } }).toString());
  const whole = ls([]);
  const quarter = ls(['--device-share', '0.25']);
  const ratio = quarter.device_bytes / whole.device_bytes;
  assert.ok(ratio > 0.2 && ratio < 0.3, `a quarter of the available RAM: ${ratio}`);
  assert.deepEqual(quarter.models.map((m) => m.id).sort(), models.slice().sort());
  assert.throws(() => ls(['--device-share', '2']), /device-share/);
});
