// The prefix cache's disk tier (--ssd-cache DIR), on real disks with real
// signals: a restarted server restores cached prompts from disk and answers
// with the tokens of a cold server; kill -9 in the middle of writes never
// leaves an entry that loads wrong, and every entry reported durable
// (POST /admin/cache/flush → 200) comes back; flipped bytes, foreign files, a
// full disk, a read-only directory and a second server on the same directory
// are each handled as the issue asks, and serving goes on.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, writeFileSync, writeSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

import { kettle, startServer, stopServer, sleep } from '../support/kettle_server.mjs';

const root = mkdtempSync(join(tmpdir(), 'kettle-ssd-'));
const mounts = [];
after(() => {
  for (const m of mounts) spawnSync('umount', ['-l', m]);
  rmSync(root, { recursive: true, force: true });
});

const demo = resolve(dirname(fileURLToPath(import.meta.url)), '../../models/kettle-demo');
const words = 'the kettle sings while the water warms and the tea waits in its pot by the window'.split(' ');
// A prompt of about n words (the demo tokenizer gives roughly a token a word), distinct per seed.
function prompt(seed, n = 400) {
  let s = `Note ${seed}:`;
  let x = seed * 7919 + 13;
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; s += ' ' + words[x % words.length]; }
  return s;
}

async function complete(server, text, maxTokens = 12) {
  const r = await fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: text, max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  const j = await r.json();
  return { text: j.choices[0].text, prompt: j.usage.prompt_tokens, cached: j.usage.prompt_tokens_details.cached_tokens };
}
const stats = async (server) => (await (await fetch(`${server.base}/stats`)).json()).ssd_cache;
// Serving starts at once; the index of what is on disk fills in the background. Tests wait for it.
async function startIndexed(args) {
  const server = await startServer(args);
  for (let i = 0; i < 200 && (await stats(server)).scanning; i++) await sleep(10);
  assert.equal((await stats(server)).scanning, false);
  return server;
}
const flush = async (server) => {
  const r = await fetch(`${server.base}/admin/cache/flush`, { method: 'POST' });
  return { status: r.status, body: await r.json() };
};
async function terminate(server) {
  server.proc.kill('SIGTERM');
  return server.exit;
}
// The one entry directory under dir (DIR/<model>-<fingerprint>/<policy>-<layout>).
function entryDir(dir) {
  const model = readdirSync(dir).filter((n) => !n.startsWith('.'));
  assert.equal(model.length, 1, `one model directory in ${dir}: ${model}`);
  const policy = readdirSync(join(dir, model[0]));
  assert.equal(policy.length, 1);
  return join(dir, model[0], policy[0]);
}
const entries = (dir) => readdirSync(dir).filter((n) => n.endsWith('.kv'));
// Where an entry's first tensor starts (after the JSON header, 4096-aligned) and its header's JSON.
function header(file) {
  const b = readFileSync(file);
  assert.equal(b.subarray(0, 8).toString(), 'KETTLEKV');
  const n = b.readUInt32LE(12);
  return JSON.parse(b.subarray(24, 24 + n).toString());
}
function flipByte(file, offset) {
  const fd = openSync(file, 'r+');
  const one = Buffer.alloc(1);
  readSync(fd, one, 0, 1, offset);
  one[0] ^= 0x40;
  writeSync(fd, one, 0, 1, offset);
  closeSync(fd);
}
function tryMount(dir, options) {
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', options, 'tmpfs', dir]);
  if (r.status === 0) mounts.push(dir);
  return r.status === 0;
}

// A cold server's answers, the reference every restored answer must equal.
let cold;
const reference = new Map();
async function coldAnswer(text, maxTokens = 12) {
  const key = `${maxTokens}\u0000${text}`;
  if (!reference.has(key)) {
    cold ??= await startServer(['--prompt-cache', '0']);
    reference.set(key, (await complete(cold, text, maxTokens)).text);
  }
  return reference.get(key);
}
after(() => stopServer(cold));

test('a restarted server restores a cached prompt from disk: the same tokens as a cold run, prefill skipped', async () => {
  const dir = join(root, 'restart');
  const text = prompt(1, 1410);  // 2,033 tokens: the longest the demo model's 2,048-token context takes with 12 more
  const first = await startServer(['--ssd-cache', dir]);
  const a = await complete(first, text);
  assert.equal(a.cached, 0);
  assert.ok(a.prompt >= 2000, `${a.prompt} prompt tokens`);
  const f = await flush(first);
  assert.equal(f.status, 200, JSON.stringify(f.body));
  assert.equal(f.body.durable, true);
  assert.ok(f.body.written >= Math.floor((a.prompt - 1) / 16), JSON.stringify(f.body));
  assert.deepEqual(await terminate(first), { code: 0, signal: null });
  assert.match(first.stderr, /ssd cache at shutdown: every cached block is on disk/);

  const second = await startIndexed(['--ssd-cache', dir]);
  try {
    const b = await complete(second, text);
    assert.equal(b.text, await coldAnswer(text));
    assert.equal(a.text, b.text);
    assert.equal(b.cached, Math.floor((b.prompt - 1) / 16) * 16, JSON.stringify(b));
    const s = await stats(second);
    assert.equal(s.hits, 1);
    assert.equal(s.restores, b.cached / 16);
    assert.ok(s.restore_bytes > 0 && s.restore_bytes_per_second > 0, JSON.stringify(s));
    assert.equal(s.errors, 0);
    const metrics = await (await fetch(`${second.base}/metrics`)).text();
    assert.match(metrics, new RegExp(`kettle_ssd_cache_restores_total\\{model="kettle-demo"\\} ${s.restores}\\n`));
    // A prompt sharing only the first part restores that part.
    const shorter = text.slice(0, Math.floor(text.length / 2)) + ' and then something else entirely';
    const c = await complete(second, shorter);
    assert.equal(c.text, await coldAnswer(shorter));
  } finally { stopServer(second); }
});

test('kill -9 at random points during writes, 50 times: nothing bad loads, every durable entry comes back', async () => {
  const dir = join(root, 'kill');
  const durable = [];  // prompts whose flush answered 200 before the kill
  let seed = 100;
  for (let round = 0; round < 50; round++) {
    const server = await startIndexed(['--ssd-cache', dir, '--ssd-cache-verify']);
    const s = await stats(server);
    // The scan of what the last kill left: headers whole, nothing refused (cut writes are temporary files).
    assert.equal((await stats(server)).errors, 0, `round ${round}: ${server.stderr}`);
    assert.equal(s.enabled, true);
    const text = prompt(seed++, 300);
    await complete(server, text, 1);
    if (round % 5 === 0) {  // now and then a barrier: what it reports durable must survive every later kill
      const f = await flush(server);
      assert.equal(f.status, 200, JSON.stringify(f.body));
      durable.push(text);
      await complete(server, prompt(seed++, 300), 1);
    }
    // Killed while the entries of the last prompt are written behind.
    await sleep(Math.floor(Math.random() * 40));
    server.proc.kill('SIGKILL');
    await server.exit;
  }
  const check = await startIndexed(['--ssd-cache', dir, '--ssd-cache-verify']);
  try {
    for (const text of durable) {
      const r = await complete(check, text, 4);
      assert.equal(r.cached, Math.floor((r.prompt - 1) / 16) * 16, `a durable prompt came back only in part: ${JSON.stringify(r)}`);
      assert.equal(r.text, await coldAnswer(text, 4));
    }
    const s = await stats(check);
    assert.equal(s.errors, 0, JSON.stringify(s));
    assert.ok(s.restores >= durable.length, JSON.stringify(s));
    assert.equal(readdirSync(entryDir(dir)).filter((n) => n.endsWith('.tmp')).length, 0, 'the scan removes cut writes');
  } finally { stopServer(check); }
});

test('a flipped byte in a header is refused and removed; in a tensor, refused under --ssd-cache-verify', async () => {
  const dir = join(root, 'flip');
  const text = prompt(2, 600);
  const first = await startServer(['--ssd-cache', dir]);
  await complete(first, text);
  assert.equal((await flush(first)).status, 200);
  await terminate(first);
  const files = entries(entryDir(dir)).map((n) => join(entryDir(dir), n));
  // The fifth block of the prompt: its header flipped; the ninth: a byte in its keys.
  const byDepth = new Map(files.map((f) => [header(f).depth, f]));
  const headerFlipped = byDepth.get(4), tensorFlipped = byDepth.get(8);
  flipByte(headerFlipped, 60);
  flipByte(tensorFlipped, header(tensorFlipped).tensors[0].offset + 100);

  const verified = await startIndexed(['--ssd-cache', dir, '--ssd-cache-verify']);
  try {
    assert.ok(!existsSync(headerFlipped), 'the scan removes a file whose header checksum fails');
    assert.match(verified.stderr, /header checksum mismatch/);
    const r = await complete(verified, text);
    assert.equal(r.text, await coldAnswer(text));
    assert.equal(r.cached, 4 * 16, 'blocks before the bad header restore; the chain stops there');
    const s = await stats(verified);
    assert.ok(s.errors >= 1 && s.removed >= 1, JSON.stringify(s));
  } finally { stopServer(verified); }

  // Without verify, tensors are not checked (the documented cost of skipping it): the header
  // check alone still refuses a flipped header.
  const dir2 = join(root, 'flip2');
  const again = await startServer(['--ssd-cache', dir2]);
  await complete(again, text);
  assert.equal((await flush(again)).status, 200);
  await terminate(again);
  const f2 = entries(entryDir(dir2)).map((n) => join(entryDir(dir2), n)).find((f) => header(f).depth === 2);
  flipByte(f2, 40);
  const plain = await startIndexed(['--ssd-cache', dir2]);
  try {
    const r = await complete(plain, text);
    assert.equal(r.cached, 2 * 16);
    assert.equal(r.text, await coldAnswer(text));
  } finally { stopServer(plain); }

  // A tensor flipped and read with verify: refused at restore, removed, the answer still right.
  const dir3 = join(root, 'flip3');
  const third = await startServer(['--ssd-cache', dir3]);
  await complete(third, text);
  assert.equal((await flush(third)).status, 200);
  await terminate(third);
  const f3 = entries(entryDir(dir3)).map((n) => join(entryDir(dir3), n)).find((f) => header(f).depth === 3);
  flipByte(f3, header(f3).tensors[0].offset + 7);
  const checking = await startIndexed(['--ssd-cache', dir3, '--ssd-cache-verify']);
  try {
    const r = await complete(checking, text);
    assert.equal(r.cached, 3 * 16);
    assert.equal(r.text, await coldAnswer(text));
    assert.match(checking.stderr, /tensor 0 checksum mismatch/);
    const s = await stats(checking);
    assert.ok(s.errors >= 1 && s.removed >= 1, JSON.stringify(s));  // (recomputed, the block is written again)
  } finally { stopServer(checking); }
});

test('entries of another model or another tokenizer are never loaded; a foreign file in our directory is removed', async () => {
  const dir = join(root, 'foreign');
  const text = prompt(3, 400);
  const own = await startServer(['--ssd-cache', dir]);
  await complete(own, text);
  assert.equal((await flush(own)).status, 200);
  await terminate(own);
  const ours = entryDir(dir);

  // The same weights with another tokenizer file: its own directory, no hit.
  const copy = join(root, 'demo-copy');
  cpSync(demo, copy, { recursive: true });
  const tok = JSON.parse(readFileSync(join(copy, 'tokenizer.json'), 'utf8'));
  tok.truncation = null; tok.padding = null;
  writeFileSync(join(copy, 'tokenizer.json'), JSON.stringify(tok, null, 1));
  const other = await startIndexed([copy, '--ssd-cache', dir]);
  try {
    const r = await complete(other, text);
    assert.equal(r.cached, 0, 'another tokenizer hash: nothing of the first model is used');
    assert.equal(r.text, await coldAnswer(text));
    assert.equal((await flush(other)).status, 200);
  } finally { await terminate(other); }
  const theirs = readdirSync(dir).filter((n) => !n.startsWith('.')).map((m) => join(dir, m))
    .find((m) => !ours.startsWith(m));
  const theirDir = join(theirs, readdirSync(theirs)[0]);
  // Their entries copied into our directory: foreign, removed at the scan, never restored.
  const planted = entries(theirDir).slice(0, 3).map((n) => { const to = join(ours, `planted-${n}`); cpSync(join(theirDir, n), to); return to; });
  const back = await startIndexed(['--ssd-cache', dir]);
  try {
    for (const p of planted) assert.ok(!existsSync(p), `${p} removed`);
    assert.match(back.stderr, /written for another model, tokenizer or KV layout/);
    const r = await complete(back, text);
    assert.equal(r.text, await coldAnswer(text));
    assert.ok(r.cached > 0);
  } finally { stopServer(back); }
});

test('a full disk stops the spilling (logged, counted, flush answers 503) and serving goes on', async (t) => {
  const dir = join(root, 'full');
  execFileSync('mkdir', ['-p', dir]);
  if (!tryMount(dir, 'size=600k')) return t.skip('mounting a small tmpfs needs root (CAP_SYS_ADMIN); not available here');
  const server = await startServer(['--ssd-cache', dir]);
  try {
    const texts = [prompt(4, 900), prompt(5, 900)];
    for (const text of texts) {
      const r = await complete(server, text);
      assert.equal(r.text, await coldAnswer(text));
    }
    const f = await flush(server);
    assert.equal(f.status, 503, JSON.stringify(f.body));
    assert.equal(f.body.durable, false);
    assert.ok(f.body.not_on_disk > 0);
    const s = await stats(server);
    assert.equal(s.spilling, false);
    assert.ok(s.errors >= 1, JSON.stringify(s));
    assert.match(server.stderr, /spilling stopped: .*No space left on device/);
    const again = prompt(6, 200);
    assert.equal((await complete(server, again)).text, await coldAnswer(again));
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
  } finally { stopServer(server); }
});

test('a read-only directory: entries already there restore, nothing is written, serving goes on', async (t) => {
  const dir = join(root, 'readonly');
  execFileSync('mkdir', ['-p', dir]);
  if (!tryMount(dir, 'size=16m')) return t.skip('mounting a tmpfs needs root (CAP_SYS_ADMIN); not available here');
  const text = prompt(7, 500);
  const writer = await startServer(['--ssd-cache', dir]);
  await complete(writer, text);
  assert.equal((await flush(writer)).status, 200);
  await terminate(writer);
  assert.equal(spawnSync('mount', ['-o', 'remount,ro', dir]).status, 0);
  const reader = await startIndexed(['--ssd-cache', dir]);
  try {
    assert.match(reader.stderr, /spilling stopped: .*not writable/);
    const r = await complete(reader, text);
    assert.equal(r.text, await coldAnswer(text));
    assert.ok(r.cached > 0, 'what is on the read-only disk still restores');
    const fresh = prompt(8, 200);
    assert.equal((await complete(reader, fresh)).text, await coldAnswer(fresh));
    const f = await flush(reader);
    assert.equal(f.status, 503);
    assert.equal((await stats(reader)).spilling, false);
  } finally { stopServer(reader); }
});

test('two servers never share a directory: the second refuses to start, naming it', async () => {
  const dir = join(root, 'shared');
  const first = await startServer(['--ssd-cache', dir]);
  try {
    const second = spawnSync(kettle, ['serve', '--port', '1', '--no-open', '--ssd-cache', dir], { encoding: 'utf8', timeout: 20000 });
    assert.notEqual(second.status, 0);
    assert.match(second.stderr, /--ssd-cache .*shared: another kettle server uses this directory \(pid \d+\)/);
    assert.equal((await fetch(`${first.base}/health`)).status, 200);
  } finally { stopServer(first); }
});

test('POST /admin/cache/clear empties memory and disk; the disk-tier flags need --ssd-cache', async () => {
  const dir = join(root, 'clear');
  const server = await startServer(['--ssd-cache', dir]);
  try {
    const text = prompt(9, 300);
    await complete(server, text);
    assert.equal((await flush(server)).status, 200);
    const before = await stats(server);
    assert.ok(before.entries > 0);
    const cleared = await (await fetch(`${server.base}/admin/cache/clear`, { method: 'POST' })).json();
    assert.ok(cleared.cleared_entries >= 2 * before.entries, JSON.stringify(cleared));
    assert.equal((await stats(server)).entries, 0);
    assert.equal(entries(entryDir(dir)).length, 0);
    assert.equal((await complete(server, text)).cached, 0);
  } finally { stopServer(server); }
  const orphan = spawnSync(kettle, ['serve', '--ssd-cache-verify'], { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(orphan.status, 0);
  assert.match(orphan.stderr, /--ssd-cache-verify requires --ssd-cache/);
});

// --generation-checkpoint: a long greedy answer, its server killed (kill -9) mid-stream; the
// same request to the restarted server returns every token an uninterrupted run returns.
const checkpointFiles = (dir) => {
  const d = join(entryDir(dir), 'checkpoints');
  return existsSync(d) ? readdirSync(d).filter((n) => n.endsWith('.json')) : [];
};
async function streamUntil(server, body, chunks) {
  const controller = new AbortController();
  const r = await fetch(`${server.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
    signal: controller.signal,
  });
  let seen = 0, text = '';
  const decoder = new TextDecoder();
  for await (const bytes of r.body) {
    text += decoder.decode(bytes, { stream: true });
    seen = text.split('data: {').length - 1;
    if (seen >= chunks) break;
  }
  return { seen, controller };
}

test('a generation killed mid-answer resumes from its checkpoint to the tokens of an uninterrupted run', async () => {
  const dir = join(root, 'checkpoint');
  const body = { prompt: 'Once upon a time, in a small village by the sea,', max_tokens: 900, temperature: 0 };
  const reference = await coldAnswer(body.prompt, body.max_tokens);
  const first = await startServer(['--ssd-cache', dir, '--generation-checkpoint', '16']);
  const { seen } = await streamUntil(first, body, 200);
  first.proc.kill('SIGKILL');
  await first.exit;
  assert.ok(seen >= 200);
  assert.equal(checkpointFiles(dir).length, 1, 'the running generation left its checkpoint');
  // The last checkpoint that reached the disk before the kill (its write may trail the stream by one interval).
  const saved = JSON.parse(readFileSync(join(entryDir(dir), 'checkpoints', checkpointFiles(dir)[0]), 'utf8'));
  const checkpointed = JSON.parse(saved.state).produced.length;
  assert.ok(checkpointed % 16 === 0 && checkpointed >= 128 && checkpointed <= 900, `checkpoint after ${checkpointed}`);

  const second = await startIndexed(['--ssd-cache', dir, '--generation-checkpoint', '16']);
  try {
    const r = await fetch(`${second.base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const j = await r.json();
    assert.equal(j.choices[0].text, reference);
    assert.equal(j.usage.completion_tokens, body.max_tokens);
    const m = second.stderr.match(/resuming a generation from its checkpoint after (\d+) tokens/);
    assert.ok(m && Number(m[1]) === checkpointed, second.stderr);
    assert.equal((await stats(second)).resumed, 1);
    assert.equal((await flush(second)).status, 200);  // the removal is queued behind the writes
    assert.equal(checkpointFiles(dir).length, 0, 'a finished generation deletes its checkpoint');

    // Streamed, resumed again after a client that went away: the replayed text comes first, then the rest.
    const { controller } = await streamUntil(second, body, 100);
    controller.abort();
    for (let i = 0; i < 100 && checkpointFiles(dir).length === 0; i++) await sleep(20);
    await sleep(200);
    assert.equal(checkpointFiles(dir).length, 1, 'a cancelled generation keeps its checkpoint');
    const s = await fetch(`${second.base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
    });
    let text = '';
    for await (const e of (await import('../support/kettle_server.mjs')).sseJson(s)) text += e.choices?.[0]?.text ?? '';
    assert.equal(text, reference);
    assert.equal((await stats(second)).resumed, 2);
  } finally { stopServer(second); }
});

test('only reproducible generations are checkpointed; --generation-checkpoint needs --ssd-cache', async () => {
  const dir = join(root, 'checkpoint-random');
  const server = await startServer(['--ssd-cache', dir, '--generation-checkpoint', '4']);
  try {
    // Sampled without a seed: a retry is a new sample, so nothing is written for it.
    const { controller } = await streamUntil(server, { prompt: 'The sea was', max_tokens: 400, temperature: 0.8 }, 40);
    controller.abort();
    await sleep(300);
    assert.equal(checkpointFiles(dir).length, 0);
    assert.equal((await stats(server)).checkpoints_written, 0);
  } finally { stopServer(server); }
  const orphan = spawnSync(kettle, ['serve', '--generation-checkpoint', '8'], { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(orphan.status, 0);
  assert.match(orphan.stderr, /--generation-checkpoint requires --ssd-cache/);
});
