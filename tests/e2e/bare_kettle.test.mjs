// A new user's first command: bare `kettle` (no command, no model) on a fresh
// checkout serves the bundled demo model on 127.0.0.1:8080, and the official
// openai client gets a non-empty, on-topic answer from it.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

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
