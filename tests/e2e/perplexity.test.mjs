// `kettle perplexity` against transformers' perplexity of the same model on the
// same text (tools/demo-model/reference_perplexity.py on the GPU box, kept in
// tests/data/goldens-demo/perplexity): equal to 3 significant digits (in
// practice to ~1e-6), for several context/stride settings; bad input refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
const model = resolve(testsDir, '../models/kettle-demo');
const text = join(testsDir, 'data', 'heldout-sample.txt');
const reference = JSON.parse(readFileSync(join(testsDir, 'data', 'goldens-demo', 'perplexity', 'heldout-sample.json'), 'utf8'));

const threeDigits = (x) => Number(x.toPrecision(3));

for (const ref of reference.runs.filter((r) => r.load === 'cast_bf16_then_float')) {
  test(`context ${ref.context} stride ${ref.stride}: transformers ${ref.perplexity.toFixed(4)}`, () => {
    const out = JSON.parse(execFileSync(kettle, ['perplexity', '--model', model, '--file', text, '--context',
      String(ref.context), '--stride', String(ref.stride), '--json'], { encoding: 'utf8' }));
    assert.equal(out.tokens, reference.tokens);
    assert.equal(out.scored_tokens, ref.scored_tokens);
    assert.equal(threeDigits(out.perplexity), threeDigits(ref.perplexity));
    assert.ok(Math.abs(out.perplexity - ref.perplexity) / ref.perplexity < 1e-4, `${out.perplexity} vs ${ref.perplexity}`);
  });
}

test('bad input is refused with the flag or file named', () => {
  const run = (args) => {
    try {
      execFileSync(kettle, ['perplexity', '--model', model, ...args], { encoding: 'utf8', stdio: 'pipe' });
      return { status: 0, stderr: '' };
    } catch (e) {
      return { status: e.status, stderr: e.stderr };
    }
  };
  let r = run(['--file', '/nonexistent/text.txt']);
  assert.equal(r.status, 3);
  assert.match(r.stderr, /\/nonexistent\/text.txt/);
  r = run(['--file', text, '--context', '64', '--stride', '65']);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--stride/);
});
