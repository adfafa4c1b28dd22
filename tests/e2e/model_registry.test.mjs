// A model argument that is not a folder is looked up in the local Hugging Face
// hub cache (HF_HUB_CACHE): models--{org}--{name}/refs/main → snapshots/{rev}.
// Exact ids and unique substrings resolve; ambiguous and unknown queries are
// refused with the candidates or the cache named.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
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

test('kettle ls lists the cache and --models-dir: architecture, parameters, bytes, context, fits', () => {
  const ls = (...args) => JSON.parse(execFileSync(kettle, ['ls', '--json', ...args], { encoding: 'utf8', env }));
  const all = ls('--models-dir', resolve(demo, '..'));
  const byId = Object.fromEntries(all.models.map((m) => [m.id, m]));
  assert.deepEqual(Object.keys(byId).sort(), ['Kettle/Demo-Chat', 'Kettle/Demo-Draft', 'kettle-demo', 'kettle-demo-draft']);
  const config = JSON.parse(readFileSync(join(demo, 'config.json'), 'utf8'));
  const weights = readdirSync(demo).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + statSync(join(demo, f)).size, 0);
  for (const id of ['Kettle/Demo-Chat', 'kettle-demo']) {
    const m = byId[id];
    assert.equal(m.arch, config.model_type);
    assert.equal(m.context, config.max_position_embeddings);
    assert.equal(m.bytes, weights);
    assert.equal(m.quantization, null);
    assert.equal(m.fits, true);
    assert.equal(m.max_context, config.max_position_embeddings);
  }
  // The parameter count from the config's shapes, as transformers counts them (no biases in Llama).
  const { hidden_size: h, intermediate_size: i, num_hidden_layers: l, num_attention_heads: nh,
    num_key_value_heads: kv, head_dim: hd, vocab_size: v } = config;
  const perLayer = h * nh * hd + 2 * h * kv * hd + nh * hd * h + 3 * h * i + 2 * h;
  const expected = v * h + l * perLayer + h + (config.tie_word_embeddings ? 0 : v * h);
  assert.ok(Math.abs(byId['kettle-demo'].parameters - expected) / expected < 0.01,
    `${byId['kettle-demo'].parameters} vs ${expected}`);
  // A query filters; the table names the device.
  assert.deepEqual(ls('draft').models.map((m) => m.id), ['Kettle/Demo-Draft']);
  const table = execFileSync(kettle, ['ls', 'chat'], { encoding: 'utf8', env });
  assert.match(table, /\| Kettle\/Demo-Chat \| llama \| 14\.\dM \| - \| 28\.\d MB \| 2048 \| yes, 2048 positions \|/);
  assert.match(table, /fits cpu/);
});

test('kettle gc: superseded snapshots and unreferenced blobs, listed in a dry run, removed with --yes', () => {
  const hub = mkdtempSync(join(tmpdir(), 'kettle-gc-'));
  try {
    const repo = join(hub, 'models--Org--M');
    for (const d of ['refs', 'blobs', 'snapshots/new', 'snapshots/old']) mkdirSync(join(repo, d), { recursive: true });
    writeFileSync(join(repo, 'refs', 'main'), 'new');
    writeFileSync(join(repo, 'blobs', 'aaa'), 'x'.repeat(1000));   // the current config
    writeFileSync(join(repo, 'blobs', 'bbb'), 'y'.repeat(2000));   // only the old snapshot's
    writeFileSync(join(repo, 'blobs', 'ccc.incomplete'), 'z'.repeat(300));
    symlinkSync('../../blobs/aaa', join(repo, 'snapshots', 'new', 'config.json'));
    symlinkSync('../../blobs/bbb', join(repo, 'snapshots', 'old', 'config.json'));
    const gcEnv = { ...process.env, HF_HUB_CACHE: hub };
    const dry = JSON.parse(execFileSync(kettle, ['gc', '--json'], { encoding: 'utf8', env: gcEnv }));
    assert.equal(dry.removed, false);
    const items = Object.fromEntries(dry.items.map((x) => [x.path.slice(repo.length + 1), x]));
    assert.deepEqual(Object.keys(items).sort(), ['blobs/bbb', 'blobs/ccc.incomplete', 'snapshots/old']);
    assert.equal(items['blobs/bbb'].why, 'unreferenced blob');
    assert.equal(items['blobs/bbb'].bytes, 2000);
    assert.equal(items['blobs/ccc.incomplete'].why, 'unfinished download');
    assert.equal(items['snapshots/old'].why, 'superseded snapshot');
    assert.ok(existsSync(join(repo, 'blobs', 'bbb')), 'a dry run removed something');
    const text = execFileSync(kettle, ['gc'], { encoding: 'utf8', env: gcEnv });
    assert.match(text, /dry run: 3 item\(s\).*run with --yes/);
    execFileSync(kettle, ['gc', '--yes'], { encoding: 'utf8', env: gcEnv });
    assert.deepEqual(readdirSync(join(repo, 'blobs')), ['aaa']);
    assert.deepEqual(readdirSync(join(repo, 'snapshots')), ['new']);
    assert.equal(readFileSync(join(repo, 'snapshots', 'new', 'config.json'), 'utf8'), 'x'.repeat(1000));
  } finally {
    rmSync(hub, { recursive: true, force: true });
  }
});
