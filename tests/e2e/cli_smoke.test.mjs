// The kettle binary as a user meets it from a script: help lists every
// command, and a generation on a bundled golden checkpoint returns the
// reference tokens (transformers' greedy continuation) as JSON.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

// Benches record into the eval history: a test's go to a file of its own, not the user's.
process.env.KETTLE_EVALS_DB ??= `${process.env.TMPDIR ?? '/tmp'}/kettle-test-evals-${process.pid}.sqlite`;

const here = path.dirname(fileURLToPath(import.meta.url));
const kettle = process.env.KETTLE_BIN ?? path.join(here, '..', '..', 'build', 'kettle');
const goldens = path.join(here, '..', 'data', 'goldens');

test('help lists the commands', () => {
  const help = execFileSync(kettle, ['--help'], { encoding: 'utf8' });
  for (const command of ['generate', 'bench', 'tokenize', 'render']) assert.match(help, new RegExp(command));
});

test('generate --json reproduces the golden greedy tokens, whole and split over two ranks', () => {
  const golden = JSON.parse(readFileSync(path.join(goldens, 'qwen3', 'golden.json'), 'utf8'));
  for (const ranks of ['1', '2']) {
    const out = execFileSync(kettle, ['generate', '--model', path.join(goldens, 'qwen3', 'model'), '--prompt-ids',
      golden.prompt_ids.join(','), '--max-tokens', String(golden.greedy_new_tokens.length), '--tp', ranks, '--json'], { encoding: 'utf8' });
    const result = JSON.parse(out);
    assert.deepEqual(result.token_ids, golden.greedy_new_tokens, `--tp ${ranks}`);
    assert.equal(result.prompt_tokens, golden.prompt_ids.length);
  }
});

test('with no --model, generate answers with the bundled demo model, on topic', () => {
  for (const word of ['water', 'garden', 'music']) {
    const out = execFileSync(kettle, ['generate', '--chat', `What does ${word} mean?`, '--max-tokens', '48',
      '--seed', '1', '--json'], { encoding: 'utf8' });
    const result = JSON.parse(out);
    assert.ok(result.text.trim().length > 0, 'empty answer');
    assert.match(result.text.toLowerCase(), new RegExp(word), `answer not about ${word}: ${result.text}`);
  }
});

// `kettle fit` on the CPU: the weights it plans are the tensor bytes the checkpoint's
// safetensors headers list (read here independently), and a split it cannot make is an
// error naming the flag.
test('fit plans the bytes the checkpoint holds, and refuses a split the model cannot take', () => {
  const demo = path.join(here, '..', '..', 'models', 'kettle-demo');
  const index = JSON.parse(readFileSync(path.join(demo, 'model.safetensors.index.json'), 'utf8'));
  let stored = 0;
  for (const file of new Set(Object.values(index.weight_map))) {
    const bytes = readFileSync(path.join(demo, file));
    const headerLength = Number(bytes.readBigUInt64LE(0));
    const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8'));
    for (const [name, t] of Object.entries(header)) if (name !== '__metadata__') stored += t.data_offsets[1] - t.data_offsets[0];
  }
  const plan = JSON.parse(execFileSync(kettle, ['fit', demo, '--device', 'cpu', '--memory', '4', '--ctx', '1024', '--batch', '2', '--json'], { encoding: 'utf8' }));
  assert.equal(plan.weight_bytes_per_rank, stored);
  const config = JSON.parse(readFileSync(path.join(demo, 'config.json'), 'utf8'));
  const headDim = config.head_dim ?? config.hidden_size / config.num_attention_heads;
  assert.equal(plan.kv_bytes_per_token_per_rank, config.num_hidden_layers * 2 * config.num_key_value_heads * headDim * 4);
  assert.equal(plan.kv_bytes_per_rank, 2 * 1024 * plan.kv_bytes_per_token_per_rank);
  assert.equal(plan.fits, true);
  assert.equal(plan.max_context, config.max_position_embeddings);
  let failed;
  try { execFileSync(kettle, ['fit', demo, '--tp', '4'], { encoding: 'utf8', stdio: 'pipe' }); } catch (e) { failed = e; }
  assert.ok(failed && failed.status !== 0, 'fit --tp 4 should fail');
  assert.match(failed.stderr, /--tensor-parallel 4/);
});

// `bench --depth D` (llama-bench -d): the tests start with D positions in the KV cache. The
// cache it reports reading per decode step is D times the KV bytes a token adds, as `fit`
// counts them from the config; a depth past the model's positions, or with --parallel
// (which it does not apply to), is refused by name.
test('bench --depth runs pp and tg at depth, and refuses what it cannot apply', () => {
  const bench = JSON.parse(execFileSync(kettle, ['bench', '--synthetic', 'tiny', '--device', 'cpu', '-p', '8', '-g', '4',
    '-r', '1', '--depth', '100', '--json'], { encoding: 'utf8' }));
  const fit = JSON.parse(execFileSync(kettle, ['fit', '--synthetic', 'tiny', '--device', 'cpu', '--json'], { encoding: 'utf8' }));
  assert.equal(bench.depth, 100);
  assert.equal(bench.kv_bytes_at_depth, 100 * fit.kv_bytes_per_token_per_rank);
  assert.ok(bench.decode_tokens_per_second > 0 && bench.prefill_tokens_per_second > 0);
  const refused = (args) => {
    try { execFileSync(kettle, ['bench', '--synthetic', 'tiny', '--device', 'cpu', ...args], { encoding: 'utf8', stdio: 'pipe' }); }
    catch (e) { return e; }
    return null;
  };
  const past = refused(['--depth', '5000', '-p', '4', '-g', '4']);
  assert.ok(past && past.status !== 0);
  assert.match(past.stderr, /--depth 5000/);
  const parallel = refused(['--depth', '10', '--parallel', '2']);
  assert.ok(parallel && parallel.status !== 0);
  assert.match(parallel.stderr, /--depth/);
});
