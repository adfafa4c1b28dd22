// The kettle binary as a user meets it from a script: help lists every
// command, and a generation on a bundled golden checkpoint returns the
// reference tokens (transformers' greedy continuation) as JSON.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const kettle = process.env.KETTLE_BIN ?? path.join(here, '..', '..', 'build', 'kettle');
const goldens = path.join(here, '..', 'data', 'goldens');

test('help lists the commands', () => {
  const help = execFileSync(kettle, ['--help'], { encoding: 'utf8' });
  for (const command of ['generate', 'bench', 'tokenize', 'render']) assert.match(help, new RegExp(command));
});

test('generate --json reproduces the golden greedy tokens', () => {
  const golden = JSON.parse(readFileSync(path.join(goldens, 'qwen3', 'golden.json'), 'utf8'));
  const out = execFileSync(kettle, ['generate', '--model', path.join(goldens, 'qwen3', 'model'), '--prompt-ids',
    golden.prompt_ids.join(','), '--max-tokens', String(golden.greedy_new_tokens.length), '--json'], { encoding: 'utf8' });
  const result = JSON.parse(out);
  assert.deepEqual(result.token_ids, golden.greedy_new_tokens);
  assert.equal(result.prompt_tokens, golden.prompt_ids.length);
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
