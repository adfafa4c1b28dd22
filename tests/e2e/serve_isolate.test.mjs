// `serve --isolate` with real processes and real signals: the parent binds the
// port and relays to an engine child on a unix socket. kill -9 of the child
// during 16 streams (the official OpenAI and Anthropic clients) gives each an
// error event, the parent's PID stays, and the next request is served by a new
// child; a child that cannot load reaches the restart limit and /health says
// the engine is down; SIGTERM to the parent lets the child finish what is in
// flight; a client that leaves cancels the child's generation; the child sees
// the client's address, not the socket's; a child stopped with SIGSTOP is killed by the
// parent's watchdog and replaced. And `--unix PATH` for any server.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, cpSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { networkInterfaces, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { kettle, freePort, sleep, startServer, stopServer } from '../support/kettle_server.mjs';

const root = mkdtempSync(join(tmpdir(), 'kettle-isolate-'));
const running = [];
after(() => {
  for (const s of running) stopServer(s);
  rmSync(root, { recursive: true, force: true });
});
const demo = resolve(dirname(fileURLToPath(import.meta.url)), '../../models/kettle-demo');

// Starts `kettle serve --isolate` and waits until the parent answers /health (any status)
// and, unless ready is false, until the engine is ready.
async function startIsolated(args = [], { ready = true, host = '127.0.0.1' } = {}) {
  const port = await freePort();
  const proc = spawn(kettle, ['serve', '--isolate', '--host', host, '--port', String(port), '--threads', '2', ...args],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  const server = { proc, port, stderr: '', exited: null, base: `http://127.0.0.1:${port}` };
  running.push(server);
  proc.stderr.on('data', (d) => { server.stderr += d; });
  server.exit = new Promise((r) => proc.on('exit', (code, signal) => { server.exited = { code, signal }; r(server.exited); }));
  for (let i = 0; i < 300 && !server.exited; i++) {
    try {
      const r = await fetch(`${server.base}/health`);
      if (!ready || r.ok) return server;
    } catch { /* not listening yet */ }
    await sleep(100);
  }
  throw new Error(`kettle serve --isolate did not come up: ${server.stderr}`);
}
const engine = async (server) => (await fetch(`${server.base}/engine`)).json();
const processAlive = (pid) => { try { process.kill(pid, 0); return true; } catch { return false; } };

test('kill -9 of the engine child during 16 streams: each gets an error event, a new child serves the next', async () => {
  const server = await startIsolated(['--batch', '16']);
  const before = await engine(server);
  assert.equal(before.state, 'ready');
  assert.ok(processAlive(before.pid));
  const openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: server.base, apiKey: 'unused', maxRetries: 0 });
  // 12 OpenAI chat streams and 4 Anthropic message streams, each long enough to outlive the kill.
  const streams = [];
  for (let i = 0; i < 16; i++) {
    const content = `Story number ${i}: once upon a time`;
    streams.push(i % 4 === 3
      ? anthropic.messages.create({ model: 'kettle-demo', max_tokens: 1500, stream: true, messages: [{ role: 'user', content }] })
      : openai.chat.completions.create({ model: 'kettle-demo', max_tokens: 1500, stream: true, ignore_eos: true,
        messages: [{ role: 'user', content }] }));
  }
  const firstChunk = [];
  const outcomes = streams.map(async (created, i) => {
    let chunks = 0;
    let resolveFirst;
    firstChunk[i] = new Promise((r) => { resolveFirst = r; });
    try {
      for await (const _ of await created) { if (++chunks === 1) resolveFirst(); }
      resolveFirst();
      return { i, chunks, error: null };
    } catch (e) {
      resolveFirst();
      return { i, chunks, error: e };
    }
  });
  await Promise.all(firstChunk);
  const killedAt = Date.now();
  process.kill(before.pid, 'SIGKILL');
  const results = await Promise.all(outcomes);
  for (const r of results) {
    assert.ok(r.chunks >= 1, `stream ${r.i} got nothing before the kill`);
    assert.ok(r.error, `stream ${r.i} ended without an error (${r.chunks} chunks)`);
    assert.match(String(r.error.message), /engine stopped while answering/, `stream ${r.i}: ${r.error}`);
  }
  // The parent lives on; a new child serves the next request (sent once /health says the engine is back).
  assert.equal(server.exited, null);
  for (let i = 0; i < 300 && !(await fetch(`${server.base}/health`)).ok; i++) await sleep(100);
  const reply = await openai.completions.create({ model: 'kettle-demo', prompt: 'Hello', max_tokens: 4, temperature: 0 });
  assert.equal(reply.usage.completion_tokens, 4);
  const served = (Date.now() - killedAt) / 1000;
  const after = await engine(server);
  assert.equal(after.state, 'ready');
  assert.notEqual(after.pid, before.pid);
  assert.equal(after.restarts, 1);
  assert.match(after.last_exit, /signal 9/);
  assert.ok(!processAlive(before.pid));
  assert.ok(served < 30, `the next request took ${served} s after the kill`);
  // The answer is the model's own: the same as a plain server's.
  const plain = await startServer();
  running.push(plain);
  const direct = await (await fetch(`${plain.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Hello', max_tokens: 4, temperature: 0 }),
  })).json();
  assert.equal(reply.choices[0].text, direct.choices[0].text);
  stopServer(plain);
  server.proc.kill('SIGTERM');
  assert.deepEqual(await server.exit, { code: 0, signal: null });
});

test('a child that stops answering (SIGSTOP) is killed by the watchdog: the stream in flight ends with an error, a new child serves the next', { timeout: 120000 }, async () => {
  const server = await startIsolated();
  const before = await engine(server);
  assert.equal(before.state, 'ready');
  const openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const stream = await openai.completions.create({ model: 'kettle-demo', prompt: 'Once upon a time', max_tokens: 1900,
    stream: true, ignore_eos: true });
  const iterator = stream[Symbol.asyncIterator]();
  await iterator.next();  // the first chunk: the generation runs
  const stoppedAt = Date.now();
  process.kill(before.pid, 'SIGSTOP');
  try {
    let error = null;
    try { while (!(await iterator.next()).done) { /* what was already on its way */ } } catch (e) { error = e; }
    assert.ok(error, 'the stream ended without an error');
    assert.match(String(error.message), /engine stopped while answering/);
    const killedAfter = (Date.now() - stoppedAt) / 1000;
    assert.ok(killedAfter >= 10 && killedAfter < 60, `killed ${killedAfter} s after it stopped`);
    let now = await engine(server);
    for (let i = 0; i < 300 && !(now.state === 'ready' && now.pid !== before.pid); i++) {
      await sleep(100);
      now = await engine(server);
    }
    assert.equal(now.state, 'ready');
    assert.equal(now.restarts, 1);
    assert.match(now.last_exit, /signal 9.*watchdog/);
    assert.ok(!processAlive(before.pid));
    assert.match(server.stderr, new RegExp(`child ${before.pid} answered no /health 3 times in a row`));
    const reply = await openai.completions.create({ model: 'kettle-demo', prompt: 'Hello', max_tokens: 4, temperature: 0 });
    assert.equal(reply.usage.completion_tokens, 4);
  } finally {
    if (processAlive(before.pid)) process.kill(before.pid, 'SIGKILL');
  }
  server.proc.kill('SIGTERM');
  assert.deepEqual(await server.exit, { code: 0, signal: null });
});

test('a child that cannot load: restarted until the limit, then /health and requests say the engine is down', async () => {
  const broken = join(root, 'broken-model');
  mkdirSync(broken);
  writeFileSync(join(broken, 'config.json'), '{"model_type": "llama", "hidden_size": ');  // cut short
  const server = await startIsolated([broken], { ready: false });
  let health;
  for (let i = 0; i < 400; i++) {  // 3 restarts, 5 s apart (each child dies at once)
    health = await (await fetch(`${server.base}/health`)).json();
    if (health.engine.state === 'down') break;
    await sleep(100);
  }
  assert.equal(health.status, 'down');
  assert.equal(health.engine.restarts, 3);
  assert.match(health.engine.last_exit, /exit code [1-9]/);
  assert.equal(health.engine.pid, null);
  const r = await fetch(`${server.base}/health`);
  assert.equal(r.status, 503);
  const c = await fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'x', max_tokens: 2 }),
  });
  assert.equal(c.status, 503);
  const body = await c.json();
  assert.equal(body.error.code, 'engine_unavailable');
  assert.match(body.error.message, /engine is down .*exit code/);
  assert.match(server.stderr, /config\.json/);  // the child's own error reached the log
  assert.equal(server.exited, null);
  server.proc.kill('SIGTERM');
  assert.deepEqual(await server.exit, { code: 0, signal: null });
});

test('SIGTERM to the parent: the child finishes the request in flight, then both exit 0', async () => {
  const server = await startIsolated(['--drain-timeout', '30']);
  const { pid } = await engine(server);
  const inflight = fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 300, ignore_eos: true, temperature: 0 }),
  });
  const stats = async () => (await (await fetch(`${server.base}/stats`)).json()).requests.running;
  for (let i = 0; i < 100 && (await stats()) === 0; i++) await sleep(20);
  server.proc.kill('SIGTERM');
  const r = await inflight;
  assert.equal(r.status, 200);
  assert.equal((await r.json()).usage.completion_tokens, 300);
  assert.deepEqual(await server.exit, { code: 0, signal: null });
  for (let i = 0; i < 50 && processAlive(pid); i++) await sleep(100);
  assert.ok(!processAlive(pid), 'the engine child outlived its parent');
  assert.match(server.stderr, /finishing in-flight requests/);
});

test('a client that leaves: its upstream connection closes and the child cancels the generation', async () => {
  const server = await startIsolated();
  const stats = async () => (await (await fetch(`${server.base}/stats`)).json()).requests.running;
  const controller = new AbortController();
  const request = fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: controller.signal,
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1900, ignore_eos: true }),
  }).catch(() => null);
  for (let i = 0; i < 100 && (await stats()) === 0; i++) await sleep(20);
  assert.equal(await stats(), 1);
  controller.abort();
  await request;
  const t0 = Date.now();
  while ((await stats()) !== 0 && Date.now() - t0 < 5000) await sleep(50);
  assert.equal(await stats(), 0, 'the generation kept running after its client left');
  assert.match(server.stderr, /generation cancelled/);
  // A bodyless GET right as the child dies is answered by the next one.
  const { pid } = await engine(server);
  process.kill(pid, 'SIGKILL');
  const models = await fetch(`${server.base}/v1/models`);
  assert.equal(models.status, 200);
  assert.equal((await models.json()).data[0].id, 'kettle-demo');
  stopServer(server);
});

test('the child sees the client\'s address: /admin from another machine is refused through the parent', async (t) => {
  const address = Object.values(networkInterfaces()).flat().find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
  if (!address) return t.skip('this machine has no non-loopback IPv4 address');
  const server = await startIsolated([], { host: '0.0.0.0' });
  const remote = await fetch(`http://${address}:${server.port}/admin/cache/clear`, { method: 'POST' });
  assert.equal(remote.status, 403, await remote.clone().text());
  const local = await fetch(`${server.base}/admin/cache/clear`, { method: 'POST' });
  assert.equal(local.status, 200);
  // A client cannot claim another address through the forwarding headers.
  const spoofed = await fetch(`http://${address}:${server.port}/admin/cache/clear`, {
    method: 'POST', headers: { 'x-kettle-peer': '127.0.0.1', 'x-kettle-peer-loopback': '1' },
  });
  assert.equal(spoofed.status, 403);
  stopServer(server);
});

// One request over a unix socket.
function unixRequest(socketPath, method, path, body) {
  return new Promise((res, rej) => {
    const req = httpRequest({ socketPath, method, path, headers: { host: 'localhost', 'content-type': 'application/json' } },
      (r) => { let data = ''; r.on('data', (d) => { data += d; }); r.on('end', () => res({ status: r.statusCode, body: data })); });
    req.on('error', rej);
    if (body) req.write(JSON.stringify(body));
    req.end();
  });
}

test('--unix PATH: a server on a unix socket; a stale socket is replaced, another file is refused', async () => {
  const socketPath = join(root, 'kettle.sock');
  const start = () => {
    const proc = spawn(kettle, ['serve', '--unix', socketPath, '--threads', '2'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const s = { proc, stderr: '', exited: null };
    running.push(s);
    proc.stderr.on('data', (d) => { s.stderr += d; });
    s.exit = new Promise((r) => proc.on('exit', (code, signal) => { s.exited = { code, signal }; r(s.exited); }));
    return s;
  };
  const waitUp = async (s) => {
    for (let i = 0; i < 100 && !s.exited; i++) {
      try { if ((await unixRequest(socketPath, 'GET', '/health')).status === 200) return; } catch { /* not yet */ }
      await sleep(100);
    }
    throw new Error(`not up: ${s.stderr}`);
  };
  let s = start();
  await waitUp(s);
  const r = await unixRequest(socketPath, 'POST', '/v1/completions', { prompt: 'Hello', max_tokens: 3, temperature: 0 });
  assert.equal(r.status, 200, r.body);
  assert.equal(JSON.parse(r.body).usage.completion_tokens, 3);
  // /admin answers a unix-socket client (a local one).
  assert.equal((await unixRequest(socketPath, 'POST', '/admin/cache/clear')).status, 200);
  // A second server on the same live socket is refused; the first keeps serving.
  const second = start();
  assert.notEqual((await second.exit).code, 0);
  assert.match(second.stderr, /another server is listening there/);
  assert.equal((await unixRequest(socketPath, 'GET', '/health')).status, 200);
  // kill -9 leaves the socket file behind: the next server replaces it.
  s.proc.kill('SIGKILL');
  await s.exit;
  assert.ok(existsSync(socketPath));
  s = start();
  await waitUp(s);
  s.proc.kill('SIGTERM');
  assert.deepEqual(await s.exit, { code: 0, signal: null });
  assert.ok(!existsSync(socketPath), 'the socket file outlived its server');
  // A path that is not a socket is never touched.
  const plainFile = join(root, 'not-a-socket');
  cpSync(join(demo, 'config.json'), plainFile);
  const refused = spawn(kettle, ['serve', '--unix', plainFile], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  refused.stderr.on('data', (d) => { err += d; });
  const code = await new Promise((r) => refused.on('exit', r));
  assert.notEqual(code, 0);
  assert.match(err, /not-a-socket: exists and is not a socket/);
  assert.ok(existsSync(plainFile));
});
