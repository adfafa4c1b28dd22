// `kettle get ORG/NAME` against a local server that speaks the Hub's API
// (tests/support/fake_hub.mjs): the files land in the standard hub cache layout
// and the model then passes its golden; a transfer cut at 50 % resumes with a
// Range request (within the run, and from a file an earlier run left
// unfinished); a blob with a wrong checksum is fetched again, and refused when
// it stays wrong; a private repo needs HF_TOKEN; an unknown one is not found;
// a disk without room is refused before anything is fetched.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { kettle } from '../support/kettle_server.mjs';
import { startFakeHub, fixtureFiles } from '../support/fake_hub.mjs';

const goldenDir = resolve(dirname(fileURLToPath(import.meta.url)), '../data/goldens/llama');
const golden = JSON.parse(readFileSync(join(goldenDir, 'golden.json'), 'utf8'));
const modelFiles = ['config.json', 'generation_config.json', 'model.safetensors'];
const root = mkdtempSync(join(tmpdir(), 'kettle-get-'));
const mounts = [];
let hub;
let caseNo = 0;
before(async () => { hub = await startFakeHub(); });
after(async () => {
  await hub.close();
  for (const m of mounts) spawnSync('umount', ['-l', m]);
  rmSync(root, { recursive: true, force: true });
});

// What `kettle get` did: { status, stdout, stderr } (run asynchronously: the hub answers from this process).
function get(repo, { cache, token, args = [] } = {}) {
  const env = { ...process.env, HF_ENDPOINT: hub.endpoint, HF_HUB_CACHE: cache };
  delete env.HF_TOKEN;
  if (token) env.HF_TOKEN = token;
  return new Promise((res) => {
    const proc = spawn(kettle, ['get', repo, ...args], { env });
    let stdout = '', stderr = '';
    proc.stdout.on('data', (d) => { stdout += d; });
    proc.stderr.on('data', (d) => { stderr += d; });
    proc.on('close', (status) => res({ status, stdout, stderr }));
  });
}
const newCase = (token) => {
  const id = `Org/Tiny-${++caseNo}`;
  const { sha, entries } = hub.addRepo(id, fixtureFiles(join(goldenDir, 'model'), modelFiles, ['model.safetensors']), { token });
  const cache = join(root, `cache-${caseNo}`);
  mkdirSync(cache);
  return { id, sha, entries, cache, repoDir: join(cache, `models--${id.replace('/', '--')}`) };
};
const fileRequests = (id, name) => hub.log.filter((r) => r.path === `/${id}/resolve/main/${name}` || r.path.endsWith(`/${name}`) && r.path.startsWith(`/${id}/resolve/`));
const sha256 = (path) => createHash('sha256').update(readFileSync(path)).digest('hex');

test('the files land in the hub cache layout, and the model passes its golden', async () => {
  const c = newCase();
  const r = await get(c.id, { cache: c.cache });
  assert.equal(r.status, 0, r.stderr);
  const snapshot = join(c.repoDir, 'snapshots', c.sha);
  assert.equal(r.stdout.trim(), snapshot);
  assert.equal(readFileSync(join(c.repoDir, 'refs', 'main'), 'utf8'), c.sha);
  for (const e of c.entries) {
    const link = readlinkSync(join(snapshot, e.name));
    assert.equal(link, `../../blobs/${e.lfs ? e.sha256 : e.blob}`);
    assert.deepEqual(readFileSync(join(snapshot, e.name)), e.data);
  }
  assert.deepEqual(readdirSync(join(c.repoDir, 'blobs')).sort(), c.entries.map((e) => (e.lfs ? e.sha256 : e.blob)).sort());
  // By its id, through the registry: the golden greedy tokens.
  const out = JSON.parse(execFileSync(kettle, ['generate', '--model', c.id, '--prompt-ids', golden.prompt_ids.join(','),
    '--max-tokens', String(golden.greedy_new_tokens.length), '--json'], { encoding: 'utf8', env: { ...process.env, HF_HUB_CACHE: c.cache } }));
  assert.deepEqual(out.token_ids, golden.greedy_new_tokens);
  // A second get fetches nothing.
  const before = hub.log.length;
  assert.equal((await get(c.id, { cache: c.cache })).status, 0);
  assert.deepEqual(hub.log.slice(before).map((x) => x.path), [`/api/models/${c.id}/revision/main`]);
});

test('a transfer cut at 50 % resumes with a Range request', async () => {
  const c = newCase();
  const weights = c.entries.find((e) => e.name === 'model.safetensors');
  hub.faults.cut.set('model.safetensors', 0.5);
  const r = await get(c.id, { cache: c.cache });
  assert.equal(r.status, 0, r.stderr);
  const requests = fileRequests(c.id, 'model.safetensors');
  assert.equal(requests.length, 2);
  assert.equal(requests[0].range, null);
  assert.equal(requests[1].range, `bytes=${Math.floor(weights.data.length * 0.5)}-`);
  assert.match(r.stderr, /resuming/);
  assert.equal(sha256(join(c.repoDir, 'blobs', weights.sha256)), weights.sha256);
  // A file an earlier run left unfinished is picked up where it stopped.
  const d = newCase();
  const w = d.entries.find((e) => e.name === 'model.safetensors');
  mkdirSync(join(d.repoDir, 'blobs'), { recursive: true });
  writeFileSync(join(d.repoDir, 'blobs', `${w.sha256}.incomplete`), w.data.subarray(0, 1000));
  assert.equal((await get(d.id, { cache: d.cache })).status, 0);
  assert.deepEqual(fileRequests(d.id, 'model.safetensors').map((x) => x.range), ['bytes=1000-']);
  assert.equal(sha256(join(d.repoDir, 'blobs', w.sha256)), w.sha256);
  assert.ok(!existsSync(join(d.repoDir, 'blobs', `${w.sha256}.incomplete`)));
});

test('a blob with the wrong SHA-256 is fetched again; one that stays wrong is refused and not kept', async () => {
  const c = newCase();
  const w = c.entries.find((e) => e.name === 'model.safetensors');
  hub.faults.corruptOnce.add('model.safetensors');
  const r = await get(c.id, { cache: c.cache });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(fileRequests(c.id, 'model.safetensors').length, 2);
  assert.match(r.stderr, /SHA-256 .* the Hub says .*fetching it again/);
  assert.equal(sha256(join(c.repoDir, 'blobs', w.sha256)), w.sha256);

  const d = newCase();
  hub.faults.corruptAlways.add('model.safetensors');
  try {
    const bad = await get(d.id, { cache: d.cache });
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /model\.safetensors has SHA-256 \w+ twice, the Hub says \w+; not kept/);
    const blobs = readdirSync(join(d.repoDir, 'blobs'));
    assert.ok(!blobs.some((b) => b.startsWith(d.entries.find((e) => e.lfs).sha256)), blobs.join());
  } finally {
    hub.faults.corruptAlways.delete('model.safetensors');
  }
});

test('a private repo needs HF_TOKEN; a wrong token and an unknown repo are refused by name', async () => {
  const c = newCase('hf_secret_token_1234');
  const none = await get(c.id, { cache: c.cache });
  assert.notEqual(none.status, 0);
  assert.match(none.stderr, /401 .*set HF_TOKEN/);
  const wrong = await get(c.id, { cache: c.cache, token: 'hf_wrong' });
  assert.notEqual(wrong.status, 0);
  assert.match(wrong.stderr, /HF_TOKEN was refused/);
  const right = await get(c.id, { cache: c.cache, token: 'hf_secret_token_1234' });
  assert.equal(right.status, 0, right.stderr);
  assert.ok(hub.log.filter((x) => x.path.startsWith(`/${c.id}/resolve/`)).every((x) => x.auth === 'Bearer hf_secret_token_1234'));
  const unknown = await get('Org/No-Such-Model', { cache: c.cache });
  assert.equal(unknown.status, 3);
  assert.match(unknown.stderr, /Org\/No-Such-Model at revision main: not found/);
  const revision = await get(c.id, { cache: c.cache, token: 'hf_secret_token_1234', args: ['--revision', 'v9'] });
  assert.notEqual(revision.status, 0);
  assert.match(revision.stderr, /at revision v9: not found/);
  const badId = await get('not-a-repo-id', { cache: c.cache });
  assert.notEqual(badId.status, 0);
  assert.match(badId.stderr, /'not-a-repo-id' is not a repo id/);
});

test('a disk without room is refused before anything is fetched', async (t) => {
  const c = newCase();
  const small = join(root, 'small-disk');
  mkdirSync(small);
  if (spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', small]).status !== 0)
    return t.skip('mounting a small tmpfs needs root (CAP_SYS_ADMIN); not available here');
  mounts.push(small);
  const before = hub.log.length;
  const r = await get(c.id, { cache: small });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, new RegExp(`${c.id} needs [\\d.]+ MB more, and .*small-disk has [\\d.]+ MB free`));
  assert.deepEqual(hub.log.slice(before).filter((x) => x.path.includes('/resolve/')), []);
});
