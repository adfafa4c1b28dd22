// --kv-quant as users meet it, on the bundled demo model (CPU): held-out perplexity
// of each mode against the unquantized cache in the same run (the bars),
// `config` from a kv_config.json beside the model, bad values and files refused by
// name, and `serve` with a quantized cache: the official openai client served,
// /stats counting the stored bytes `fit` predicts, and the longest context `fit`
// predicts accepted while one block more is refused.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const model = resolve(testsDir, '../models/kettle-demo');
const text = join(testsDir, 'data', 'heldout-sample.txt');
const work = mkdtempSync(join(tmpdir(), 'kettle-kv-quant-'));
after(() => rmSync(work, { recursive: true, force: true }));

function perplexity(folder, mode) {
  return JSON.parse(execFileSync(kettle, ['perplexity', '--model', folder, '--file', text, '--context', '512', '--stride',
    '256', '--json', '--threads', '2', '--kv-quant', mode], { encoding: 'utf8' }));
}

// The demo model's files linked into a folder of its own, with `config` as its kv_config.json.
function withKvConfig(name, config) {
  const folder = join(work, name);
  rmSync(folder, { recursive: true, force: true });
  execFileSync('mkdir', ['-p', folder]);
  for (const f of readdirSync(model)) symlinkSync(join(model, f), join(folder, f));
  if (config !== undefined) writeFileSync(join(folder, 'kv_config.json'), typeof config === 'string' ? config : JSON.stringify(config));
  return folder;
}

function refused(args) {
  try {
    execFileSync(kettle, args, { encoding: 'utf8', stdio: 'pipe' });
  } catch (e) {
    return e;
  }
  assert.fail(`accepted: kettle ${args.join(' ')}`);
}

// The bars: 8-bit within 0.5 % of off, fp8 within 1 %, turbo k8v3 within 2 %, 4-bit within 5 %.
test('held-out perplexity of each --kv-quant mode against the unquantized cache', () => {
  const off = perplexity(model, 'off');
  assert.equal(off.kv_quant, 'off');
  for (const [mode, bound] of [['8', 0.005], ['fp8', 0.01], ['turbo', 0.02], ['4', 0.05]]) {
    const r = perplexity(model, mode);
    const change = (r.perplexity - off.perplexity) / off.perplexity;
    console.log(`# --kv-quant ${mode}: perplexity ${r.perplexity.toFixed(4)} vs off ${off.perplexity.toFixed(4)} (${(change * 100).toFixed(2)} %)`);
    assert.equal(r.kv_quant, mode === 'turbo' ? 'turbo:k8v3' : mode);
    assert.equal(r.scored_tokens, off.scored_tokens);
    assert.ok(Math.abs(change) < bound, `${mode}: ${r.perplexity} vs ${off.perplexity}`);
  }
});

test('--kv-quant config reads kv_config.json beside the model, and refuses what it cannot apply', () => {
  const layers = Array.from({ length: 8 }, (_, i) => ({ layer_idx: i, bits: i < 4 ? 8 : 4, group_size: 32 }));
  const good = withKvConfig('good', { layers });
  const r = perplexity(good, 'config');
  const off = perplexity(model, 'off');
  assert.ok(Math.abs(r.perplexity - off.perplexity) / off.perplexity < 0.05, `${r.perplexity} vs ${off.perplexity}`);
  // A plain list is the same file.
  assert.equal(perplexity(withKvConfig('list', layers), 'config').perplexity, r.perplexity);
  const cases = [
    [withKvConfig('none'), /kv_config\.json/],
    [withKvConfig('json', '{"layers": ['), /not valid JSON/],
    [withKvConfig('bits', [{ layer_idx: 0, bits: 5, group_size: 32 }]), /bits 5/],
    [withKvConfig('group', [{ layer_idx: 0, bits: 8, group_size: 48 }]), /group_size 48/],
    [withKvConfig('key', [{ layer_idx: 0, bits: 8, group_size: 32, axis: 1 }]), /unknown key "axis"/],
    [withKvConfig('twice', [{ layer_idx: 1, bits: 8, group_size: 32 }, { layer_idx: 1, bits: 4, group_size: 32 }]), /listed twice/],
    [withKvConfig('layer', [{ layer_idx: 8, bits: 8, group_size: 32 }]), /layer_idx 8/],
  ];
  for (const [folder, message] of cases) {
    const e = refused(['generate', '--model', folder, '--prompt', 'Hello', '--max-tokens', '2', '--kv-quant', 'config']);
    assert.notEqual(e.status, 0);
    assert.match(e.stderr, message);
  }
});

test('bad --kv-quant values are refused by name on every command that takes the flag', () => {
  const commands = [['generate', '--prompt', 'Hi', '--max-tokens', '1'], ['perplexity', '--file', text],
    ['bench', '--synthetic', 'tiny', '-p', '4', '-g', '2', '-r', '1'], ['fit'], ['serve', '--port', '1']];
  for (const args of commands) {
    for (const bad of ['5', 'turbo:k9v3', 'int8']) {
      const e = refused([...args, '--kv-quant', bad]);
      assert.notEqual(e.status, 0);
      assert.match(e.stderr, new RegExp(`--kv-quant ${bad}`), `${args[0]} --kv-quant ${bad}: ${e.stderr}`);
    }
  }
  const e = refused(['bench', '--synthetic', 'tiny', '--kv-quant', 'config']);
  assert.match(e.stderr, /--kv-quant config/);
});

test('serve with a quantized cache: the openai client, /stats bytes as fit counts them, fit\'s longest context accepted', async () => {
  const budget = '0.0004';  // GB: a few hundred tokens of 8-bit KV
  const fit = JSON.parse(execFileSync(kettle, ['fit', '--json', '--kv-budget', budget, '--kv-quant', '8'], { encoding: 'utf8' }));
  const fitOff = JSON.parse(execFileSync(kettle, ['fit', '--json', '--kv-budget', budget], { encoding: 'utf8' }));
  assert.equal(fit.kv_quant, '8');
  // The demo's heads are 64 wide: 64 codes + an f16 scale and bias per group of 64, against 4 bytes an element.
  assert.equal(fit.kv_bytes_per_token_per_rank * 4 * 64, fitOff.kv_bytes_per_token_per_rank * 68);
  assert.ok(fit.max_context > fitOff.max_context * 3, `${fit.max_context} vs ${fitOff.max_context}`);
  const server = await startServer(['--kv-budget', budget, '--kv-quant', '8', '--batch', '1', '--prompt-cache', '0']);
  try {
    const stats = await (await fetch(`${server.base}/stats`)).json();
    assert.equal(stats.kv.quant, '8');
    assert.equal(stats.kv.bytes_per_token, fit.kv_bytes_per_token_per_rank);
    assert.equal(stats.kv.budget_bytes, fit.kv_budget_bytes);
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused' });
    const chat = await client.chat.completions.create({ model: 'kettle-demo', messages: [{ role: 'user', content: 'What is a kettle?' }],
      max_tokens: 12, temperature: 0 });
    assert.ok(chat.choices[0].message.content.length > 0);
    // The longest context fit predicts: a prompt plus max_tokens of exactly that is admitted
    // (and runs), one block more is refused naming --kv-budget.
    const prompt = 'The kettle boiled.';
    const completion = await client.completions.create({ model: 'kettle-demo', prompt, max_tokens: 1, temperature: 0 });
    const promptTokens = completion.usage.prompt_tokens;
    const admitted = await client.completions.create({ model: 'kettle-demo', prompt, max_tokens: fit.max_context - promptTokens,
      temperature: 0, ignore_eos: true });
    assert.equal(admitted.usage.completion_tokens, fit.max_context - promptTokens, 'the whole context ran');
    await assert.rejects(
      client.completions.create({ model: 'kettle-demo', prompt, max_tokens: fit.max_context - promptTokens + 16, temperature: 0 }),
      (e) => e.status === 400 && /--kv-budget/.test(e.message));
  } finally {
    stopServer(server);
  }
});
