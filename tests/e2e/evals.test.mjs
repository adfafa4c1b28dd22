// The eval history: every `kettle bench` and `kettle bench serve` run lands in
// a SQLite database that `kettle evals` shows — the numbers each run printed,
// its command line and the binary's commit; --limit, --json, --clear; a file
// that is not a database is refused by name while the bench's own results
// still print.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const dir = mkdtempSync(join(tmpdir(), 'kettle-evals-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const demo = resolve(dirname(fileURLToPath(import.meta.url)), '../../models/kettle-demo');
const run = (args) => execFileSync(kettle, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const evals = (db, ...args) => JSON.parse(run(['evals', '--evals-db', db, '--json', ...args]));

test('two bench runs appear in evals with the numbers they printed, newest first', () => {
  const db = join(dir, 'runs.sqlite');
  const benchArgs = ['bench', demo, '-p', '16', '-g', '8', '-r', '1', '-t', '1', '--json', '--evals-db', db];
  const single = JSON.parse(run(benchArgs));
  const batched = JSON.parse(run([...benchArgs, '--parallel', '1,2']));
  const runs = evals(db);
  assert.equal(runs.length, 2);
  assert.deepEqual(runs.map((r) => r.id), [2, 1]);
  assert.deepEqual(runs[1].results, single);
  assert.deepEqual(runs[0].results, batched);
  assert.deepEqual(runs[1].flags, benchArgs);
  const commit = run(['--version']).match(/commit (\S+),/)[1];
  for (const r of runs) {
    assert.equal(r.kind, 'bench');
    assert.equal(r.model, demo);
    assert.equal(r.commit, commit);
    assert.match(r.device, /^cpu, 1 threads$/);
    assert.match(r.recorded_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.ok(r.machine.length > 0);
  }
  // The table shows both, with their headline numbers.
  const table = run(['evals', '--evals-db', db]);
  assert.match(table, new RegExp(`\\| 1 \\| .* \\| pp16 ${Math.round(single.prefill_tokens_per_second)} tok/s`));
  assert.match(table, new RegExp(`\\| 2 \\| .* \\| B1 ${Math.round(batched.batched[0].decode_tokens_per_second)} tok/s`));
  assert.deepEqual(evals(db, '--limit', '1').map((r) => r.id), [2]);
  // --no-record leaves the history as it was.
  run([...benchArgs, '--no-record']);
  assert.equal(evals(db).length, 2);
  assert.match(run(['evals', '--evals-db', db, '--clear']), /removed 2 run/);
  assert.deepEqual(evals(db), []);
  assert.match(run(['evals', '--evals-db', db]), /no runs recorded/);
});

test('bench serve: a load test against a running server, recorded as its own kind', async () => {
  const db = join(dir, 'serve.sqlite');
  const key = 'bench-secret-key-123';
  const server = await startServer(['--batch', '4', '--api-key', key]);
  const auth = { headers: { authorization: `Bearer ${key}` } };
  try {
    const before = await (await fetch(`${server.base}/stats`, auth)).json();
    const out = JSON.parse(run(['bench', 'serve', '--url', server.base, '-c', '2', '-n', '4', '-p', '20', '-g', '8',
      '--api-key', key, '--json', '--evals-db', db]));
    const afterStats = await (await fetch(`${server.base}/stats`, auth)).json();
    assert.equal(out.model, 'kettle-demo');
    assert.equal(out.succeeded, 4);
    assert.equal(out.failed, 0);
    assert.equal(out.output_tokens, 32);  // 4 requests × 8 tokens, end of sequence ignored
    assert.equal(afterStats.requests.total - before.requests.total, 4);  // what the server itself counted
    assert.ok(out.ttft_seconds.p50 > 0 && out.ttft_seconds.p50 <= out.latency_seconds.p50);
    assert.ok(out.output_tokens_per_second > 0);
    const [recorded] = evals(db);
    assert.equal(recorded.kind, 'bench serve');
    assert.equal(recorded.device, server.base);
    assert.deepEqual(recorded.results, out);
    assert.ok(!JSON.stringify(recorded).includes(key), 'the API key was recorded');
    assert.deepEqual(recorded.flags.slice(recorded.flags.indexOf('--api-key'), recorded.flags.indexOf('--api-key') + 2),
      ['--api-key', '(redacted)']);
    // A server that is not there: a clear error, non-zero exit.
    const refused = spawnSync(kettle, ['bench', 'serve', '--url', 'http://127.0.0.1:1', '--no-record'], { encoding: 'utf8' });
    assert.notEqual(refused.status, 0);
    assert.match(refused.stderr, /cannot connect to http:\/\/127\.0\.0\.1:1/);
    const https = spawnSync(kettle, ['bench', 'serve', '--url', 'https://example.com'], { encoding: 'utf8' });
    assert.notEqual(https.status, 0);
    assert.match(https.stderr, /--url https:\/\/example\.com: only http/);
  } finally {
    stopServer(server);
  }
});

test('a file that is not an eval database is refused by name; the bench still prints its results', () => {
  const bad = join(dir, 'not-a-db.sqlite');
  writeFileSync(bad, 'this is not a SQLite database, just text that is long enough to have a header '.repeat(20));
  const shown = spawnSync(kettle, ['evals', '--evals-db', bad], { encoding: 'utf8' });
  assert.notEqual(shown.status, 0);
  assert.match(shown.stderr, /not-a-db\.sqlite/);
  const bench = spawnSync(kettle, ['bench', demo, '-p', '8', '-g', '4', '-r', '1', '-t', '1', '--json', '--evals-db', bad],
    { encoding: 'utf8' });
  assert.equal(bench.status, 0);
  assert.ok(JSON.parse(bench.stdout).decode_tokens_per_second > 0);
  assert.match(bench.stderr, /this run was not recorded: .*not-a-db\.sqlite/);
});
