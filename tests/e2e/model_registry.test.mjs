// A model argument that is not a folder is looked up in the local Hugging Face
// hub cache (HF_HUB_CACHE): models--{org}--{name}/refs/main → snapshots/{rev}.
// Exact ids and unique substrings resolve; ambiguous and unknown queries are
// refused with the candidates or the cache named.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const demo = resolve(new URL('../../models/kettle-demo', import.meta.url).pathname);
const draft = resolve(new URL('../../models/kettle-demo-draft', import.meta.url).pathname);
const cache = mkdtempSync(join(tmpdir(), 'kettle-hub-'));
function cacheModel(id, source, rev) {
  const repo = join(cache, `models--${id.replace('/', '--')}`);
  mkdirSync(join(repo, 'refs'), { recursive: true });
  mkdirSync(join(repo, 'snapshots', rev), { recursive: true });
  writeFileSync(join(repo, 'refs', 'main'), rev);
  for (const f of readdirSync(source)) symlinkSync(join(source, f), join(repo, 'snapshots', rev, f));
}
before(() => { cacheModel('Kettle/Demo-Chat', demo, '0123abc'); cacheModel('Kettle/Demo-Draft', draft, '99ff00'); });
after(() => rmSync(cache, { recursive: true, force: true }));

const env = { ...process.env, HF_HUB_CACHE: cache };
const generate = (model) => JSON.parse(execFileSync(kettle,
  ['generate', '--model', model, '--prompt', 'Once upon a time', '--max-tokens', '6', '--temp', '0', '--json'], { encoding: 'utf8', env }));

test('an exact id (any case) and a unique substring resolve to the cached snapshot', () => {
  const reference = generate(demo);
  assert.deepEqual(generate('Kettle/Demo-Chat').token_ids, reference.token_ids);
  assert.deepEqual(generate('kettle/demo-chat').token_ids, reference.token_ids);
  assert.deepEqual(generate('demo-chat').token_ids, reference.token_ids);
});

test('an ambiguous query lists the candidates (exit 2); an unknown one names the cache (exit 3)', () => {
  const ambiguous = spawnSync(kettle, ['generate', '--model', 'demo', '--prompt', 'x'], { encoding: 'utf8', env });
  assert.equal(ambiguous.status, 2);
  assert.match(ambiguous.stderr, /Kettle\/Demo-Chat, Kettle\/Demo-Draft/);
  const unknown = spawnSync(kettle, ['generate', '--model', 'no-such/model', '--prompt', 'x'], { encoding: 'utf8', env });
  assert.equal(unknown.status, 3);
  assert.ok(unknown.stderr.includes(cache), unknown.stderr);
  assert.match(unknown.stderr, /no-such\/model/);
});

test('kettle serve QUERY serves it under the name given', async () => {
  const saved = process.env.HF_HUB_CACHE;
  process.env.HF_HUB_CACHE = cache;  // startServer spawns with this process's environment
  const server = await startServer(['Kettle/Demo-Chat']).finally(() => {
    if (saved === undefined) delete process.env.HF_HUB_CACHE; else process.env.HF_HUB_CACHE = saved;
  });
  try {
    const models = await (await fetch(`${server.base}/v1/models`)).json();
    assert.deepEqual(models.data.map((m) => m.id), ['Kettle/Demo-Chat']);
  } finally {
    stopServer(server);
  }
});
