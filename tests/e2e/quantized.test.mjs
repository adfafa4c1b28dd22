// Quantized weights as users meet them: `kettle convert -q` on the bundled demo
// model, its held-out perplexity against transformers' perplexity of the bf16
// model (tests/data/goldens-demo/perplexity, made on the GPU box), and the
// converted model served to the official openai client, /v1/models reporting
// its quantization and bytes.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';
import { writeRandomModel } from '../support/random_model.mjs';

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const model = resolve(testsDir, '../models/kettle-demo');
const text = join(testsDir, 'data', 'heldout-sample.txt');
const calibration = resolve(testsDir, '../docs/architecture.md');
const reference = JSON.parse(readFileSync(join(testsDir, 'data', 'goldens-demo', 'perplexity', 'heldout-sample.json'), 'utf8'));
const bf16 = reference.runs.find((r) => r.load === 'cast_bf16_then_float' && r.context === 512 && r.stride === 256);

const work = mkdtempSync(join(tmpdir(), 'kettle-quantized-'));
after(() => rmSync(work, { recursive: true, force: true }));

const converted = new Map();  // flags → { folder, report }
function convertWith(name, flags) {
  if (!converted.has(name)) {
    const folder = join(work, name);
    const report = JSON.parse(execFileSync(kettle, ['convert', model, folder, ...flags, '--json'], { encoding: 'utf8' }));
    converted.set(name, { folder, report });
  }
  return converted.get(name);
}

function convert(bits, group) {
  const converted = convertWith(`q${bits}g${group}`, ['-q', '--q-bits', String(bits), '--q-group-size', String(group)]);
  assert.ok(converted.report.quantized > 0);
  return converted;
}

function perplexity(folder) {
  return JSON.parse(execFileSync(kettle, ['perplexity', '--model', folder, '--file', text, '--context', '512', '--stride',
    '256', '--json', '--threads', '2'], { encoding: 'utf8' })).perplexity;
}

// The quality bars: 8-bit within 0.5 % of bf16, 4-bit (groups of 64) within 4 %.
for (const [bits, group, bound] of [[8, 64, 0.005], [4, 64, 0.04]]) {
  test(`${bits}-bit, groups of ${group}: held-out perplexity within ${bound * 100} % of transformers' bf16`, () => {
    const ppl = perplexity(convert(bits, group).folder);
    const change = (ppl - bf16.perplexity) / bf16.perplexity;
    console.log(`# ${bits}-bit g${group}: perplexity ${ppl.toFixed(4)} vs bf16 ${bf16.perplexity.toFixed(4)} (${(change * 100).toFixed(2)} %)`);
    assert.ok(Math.abs(change) < bound, `${ppl} vs ${bf16.perplexity}`);
  });
}

// Mixed precision: calibrated on text other than the held-out sample (the project's own
// architecture notes), at the size of uniform 4-bit, it must score better than uniform 4-bit.
test('mixed precision (--target-bpw) at the size of uniform 4-bit: lower held-out perplexity', () => {
  const uniform = convert(4, 64);
  const target = uniform.report.bits_per_weight;
  const mixed = convertWith('mixed', ['-q', '--q-group-size', '64', '--target-bpw', String(target), '--candidate-bits',
    '3,4,6,8', '--calibration', calibration, '--n-calibration', '512', '--threads', '2']);
  const widths = Object.keys(mixed.report.weights_at_bits);
  assert.ok(widths.length >= 2, `one width only: ${JSON.stringify(mixed.report.weights_at_bits)}`);
  assert.ok(mixed.report.bits_per_weight <= target + 1e-9, `${mixed.report.bits_per_weight} > ${target}`);
  // config.json names the default width and each other module's own, as mlx-lm reads them.
  const q = JSON.parse(readFileSync(join(mixed.folder, 'config.json'), 'utf8')).quantization;
  const index = JSON.parse(readFileSync(join(mixed.folder, 'model.safetensors.index.json'), 'utf8')).weight_map;
  const overrides = Object.entries(q).filter(([, v]) => typeof v === 'object');
  assert.ok(overrides.length > 0);
  for (const [module, params] of overrides) {
    assert.ok(`${module}.scales` in index, module);
    assert.notEqual(params.bits, q.bits);
    assert.equal(params.group_size, 64);
  }
  const mixedPpl = perplexity(mixed.folder), uniformPpl = perplexity(uniform.folder);
  console.log(`# mixed ${JSON.stringify(mixed.report.weights_at_bits)} at ${mixed.report.bits_per_weight.toFixed(4)} bpw: ` +
    `perplexity ${mixedPpl.toFixed(4)}; uniform 4-bit at ${target.toFixed(4)} bpw: ${uniformPpl.toFixed(4)}`);
  assert.ok(mixedPpl < uniformPpl, `${mixedPpl} vs ${uniformPpl}`);
});

// --rotate-weights: the rotated float model scores as the source does (its function kept);
// rotated 4-bit stays within the 4-bit bar. How rotation moves 4- and 3-bit is printed.
test('rotated weights: the float model unchanged, 4-bit within 4 % of bf16', () => {
  const source = perplexity(model);
  const rotatedFloat = convertWith('rotated', ['--rotate-weights', '--rotation-seed', '5']);
  assert.equal(rotatedFloat.report.quantized, 0);
  const rotated = perplexity(rotatedFloat.folder);
  assert.ok(Math.abs(rotated - source) / source < 1e-5, `${rotated} vs ${source}`);
  for (const bits of [4, 3]) {
    const plain = perplexity(convert(bits, 64).folder);
    const withRotation = perplexity(convertWith(`rq${bits}`, ['-q', '--q-bits', String(bits), '--q-group-size', '64',
      '--rotate-weights', '--rotation-seed', '5']).folder);
    console.log(`# ${bits}-bit g64: perplexity ${plain.toFixed(4)}, rotated ${withRotation.toFixed(4)} (float ${source.toFixed(4)})`);
    if (bits === 4) assert.ok(Math.abs(withRotation - bf16.perplexity) / bf16.perplexity < 0.04, `${withRotation}`);
  }
});

// Both: bits chosen on the rotated model (its weights as convert quantizes them), within the
// budget of uniform rotated 4-bit, scoring better than it.
test('mixed precision on rotated weights: within the rotated 4-bit budget, lower held-out perplexity', () => {
  const uniform = convertWith('rq4', ['-q', '--q-bits', '4', '--q-group-size', '64', '--rotate-weights', '--rotation-seed', '5']);
  const target = uniform.report.bits_per_weight;
  const mixed = convertWith('rmixed', ['-q', '--q-group-size', '64', '--target-bpw', String(target), '--candidate-bits',
    '3,4,6,8', '--calibration', calibration, '--n-calibration', '512', '--threads', '2', '--rotate-weights',
    '--rotation-seed', '5']);
  assert.ok(Object.keys(mixed.report.weights_at_bits).length >= 2, JSON.stringify(mixed.report.weights_at_bits));
  assert.ok(mixed.report.bits_per_weight <= target + 1e-9, `${mixed.report.bits_per_weight} > ${target}`);
  const mixedPpl = perplexity(mixed.folder), uniformPpl = perplexity(uniform.folder);
  console.log(`# rotated + mixed ${JSON.stringify(mixed.report.weights_at_bits)} at ${mixed.report.bits_per_weight.toFixed(4)} ` +
    `bpw: perplexity ${mixedPpl.toFixed(4)}; rotated uniform 4-bit at ${target.toFixed(4)} bpw: ${uniformPpl.toFixed(4)}`);
  assert.ok(mixedPpl < uniformPpl, `${mixedPpl} vs ${uniformPpl}`);
});

test('a 4-bit model served: /v1/models reports it, the openai client chats with it', async () => {
  const folder = join(work, 'served');
  execFileSync(kettle, ['convert', model, folder, '-q', '--q-bits', '4', '--q-group-size', '32'], { encoding: 'utf8' });
  const dense = await startServer([model]);
  let denseBytes;
  try {
    denseBytes = (await (await fetch(`${dense.base}/v1/models`)).json()).data[0].weight_bytes;
  } finally {
    stopServer(dense);
  }
  const server = await startServer([folder]);
  try {
    const card = (await (await fetch(`${server.base}/v1/models`)).json()).data[0];
    assert.deepEqual(card.quantization, { mode: 'affine', bits: 4, group_size: 32 });
    assert.ok(card.weight_bytes < denseBytes * 0.4, `${card.weight_bytes} vs ${denseBytes}`);
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
    const r = await client.chat.completions.create({
      model: 'whatever', messages: [{ role: 'user', content: 'What does a kettle do?' }], max_tokens: 16, temperature: 0,
    });
    assert.ok(r.choices[0].message.content.length > 0);
    assert.equal(r.usage.completion_tokens > 0, true);
  } finally {
    stopServer(server);
  }
});

// Bytes of the tensors a .safetensors file holds, from its header.
function safetensorsBytes(file) {
  const bytes = readFileSync(file);
  const header = JSON.parse(bytes.subarray(8, 8 + Number(bytes.readBigUInt64LE(0))).toString('utf8'));
  delete header.__metadata__;
  return Object.values(header).reduce((sum, t) => sum + t.data_offsets[1] - t.data_offsets[0], 0);
}

// An FP8 checkpoint (compressed-tensors, a scale per output row: the qwen3 golden's FP8
// layout from tools/quantized-goldens) under a real tokenizer: /v1/models names its mode
// and the bytes it holds (its file's tensors: codes, scales and the bf16 rest), and the
// openai client gets tokens from it (the CPU widens FP8 to bf16 as it loads).
test('an FP8 model served: /v1/models reports it, the openai client gets an answer', async () => {
  const dense = join(work, 'fp8-dense'), fp8 = join(work, 'fp8');
  writeRandomModel(dense);
  writeRandomModel(fp8, { weights: join(testsDir, 'data', 'goldens-quantized', 'qwen3-fp8-channel', 'model') });
  const cards = [];
  for (const folder of [dense, fp8]) {
    const server = await startServer([folder]);
    try {
      cards.push((await (await fetch(`${server.base}/v1/models`)).json()).data[0]);
      if (folder !== fp8) continue;
      const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
      const r = await client.completions.create({ model: 'whatever', prompt: 'a kettle', max_tokens: 8, temperature: 0 });
      assert.ok(r.usage.completion_tokens > 0);
    } finally {
      stopServer(server);
    }
  }
  assert.equal(cards[0].quantization, null);
  assert.deepEqual(cards[1].quantization, { mode: 'fp8', bits: 8, block_size: null });
  assert.equal(cards[0].weight_bytes, safetensorsBytes(join(dense, 'model.safetensors')));
  assert.equal(cards[1].weight_bytes, safetensorsBytes(join(fp8, 'model.safetensors')));
  assert.ok(cards[1].weight_bytes < cards[0].weight_bytes);
});
