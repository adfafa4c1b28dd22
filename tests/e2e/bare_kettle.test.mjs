// A new user's first command: bare `kettle` (no command, no model) on a fresh
// checkout serves the bundled demo model on 127.0.0.1:8080, and the official
// openai client gets a non-empty, on-topic answer from it.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

// Benches record into the eval history: a test's go to a file of its own, not the user's.
process.env.KETTLE_EVALS_DB ??= `${process.env.TMPDIR ?? '/tmp'}/kettle-test-evals-${process.pid}.sqlite`;

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
const base = 'http://127.0.0.1:8080';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let proc;
after(() => { if (proc && proc.exitCode === null) proc.kill('SIGKILL'); });

test('bare kettle serves the demo model and answers on topic', async () => {
  try {
    await fetch(`${base}/health`);
    assert.fail('something already listens on 127.0.0.1:8080; this test needs the default port free');
  } catch (e) {
    if (e.code === 'ERR_ASSERTION') throw e;
  }
  let stderr = '';
  proc = spawn(kettle, [], { stdio: ['ignore', 'pipe', 'pipe'] });
  proc.stderr.on('data', (d) => { stderr += d; });
  let up = false;
  for (let i = 0; i < 100 && proc.exitCode === null && !up; i++) {
    try { up = (await fetch(`${base}/health`)).ok; } catch { await sleep(100); }
  }
  assert.ok(up, `bare kettle did not come up on ${base}: ${stderr}`);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'kettle-demo');
  const reply = await client.chat.completions.create({
    model: 'kettle-demo', messages: [{ role: 'user', content: 'What does water mean?' }], max_tokens: 48, seed: 1,
  });
  const text = reply.choices[0].message.content;
  assert.ok(text.trim().length > 0, 'empty answer');
  assert.match(text.toLowerCase(), /water/, `answer not about water: ${text}`);
  proc.kill('SIGTERM');
  const code = await new Promise((r) => (proc.exitCode !== null ? r(proc.exitCode) : proc.on('exit', r)));
  assert.equal(code, 0);
});

// The appliance rule's other half: serve's options without the command serve.
test('kettle --port N --no-open serves as kettle serve --port N does', async () => {
  const { freePort } = await import('../support/kettle_server.mjs');
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  let stderr = '';
  const p = spawn(kettle, ['--port', String(port), '--no-open', '--threads', '2'], { stdio: ['ignore', 'pipe', 'pipe'] });
  p.stderr.on('data', (d) => { stderr += d; });
  try {
    let up = false;
    for (let i = 0; i < 100 && p.exitCode === null && !up; i++) {
      try { up = (await fetch(`${url}/health`)).ok; } catch { await sleep(100); }
    }
    assert.ok(up, `kettle --port ${port} did not come up: ${stderr}`);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
    const reply = await client.chat.completions.create({
      model: 'kettle-demo', messages: [{ role: 'user', content: 'What does water mean?' }], max_tokens: 16, seed: 1,
    });
    assert.ok(reply.choices[0].message.content.trim().length > 0, 'empty answer');
  } finally {
    p.kill('SIGKILL');
  }
});

test('kettle --version names the version, the commit built and CUDA on or off', async () => {
  const { execFileSync, spawnSync } = await import('node:child_process');
  const out = execFileSync(kettle, ['--version'], { encoding: 'utf8' });
  const m = out.match(/^kettle (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}|unknown), CUDA (on|off)\)$/m);
  assert.ok(m, `unexpected --version output: ${out}`);
  const git = spawnSync('git', ['-C', resolve(testsDir, '..'), 'rev-parse', '--short=12', 'HEAD'], { encoding: 'utf8' });
  if (git.status === 0 && m[2] !== 'unknown') {
    // the binary may lag a commit made after its build only in a working checkout; CI builds the clone's HEAD
    const log = spawnSync('git', ['-C', resolve(testsDir, '..'), 'log', '--format=%h', '--abbrev=12', '-20'], { encoding: 'utf8' });
    assert.ok(log.stdout.split('\n').includes(m[2]), `--version's commit ${m[2]} is not among the last commits (HEAD ${git.stdout.trim()})`);
  }
});

test('kettle help [command] lists the flags; an unknown flag fails naming it', async () => {
  const { spawnSync } = await import('node:child_process');
  const top = spawnSync(kettle, ['help'], { encoding: 'utf8' });
  assert.equal(top.status, 0);
  for (const cmd of ['serve', 'generate', 'bench', 'fit', 'tokenize', 'render', 'perplexity']) assert.match(top.stdout, new RegExp(`\\b${cmd}\\b`));
  const serve = spawnSync(kettle, ['help', 'serve'], { encoding: 'utf8' });
  assert.equal(serve.status, 0);
  assert.match(serve.stdout, /--port/);
  assert.match(serve.stdout, /--max-queue/);
  const bad = spawnSync(kettle, ['--no-such-flag'], { encoding: 'utf8' });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr + bad.stdout, /--no-such-flag/);
});
