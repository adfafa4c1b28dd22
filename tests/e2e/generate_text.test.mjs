// `kettle generate --prompt` and `--chat` end to end: the prompt ids must be
// what the native Hugging Face tokenizer makes of the text (and of the chat
// prompt @huggingface/jinja renders), and the printed text must be what the
// reference decode makes of the generated ids. The model is a golden
// checkpoint; the tokenizer a small byte-level BPE whose vocabulary fits it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Template } from '@huggingface/jinja';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('@anush008/tokenizers');

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
const model = join(testsDir, 'data', 'goldens', 'llama', 'model');

const chatTemplate =
  "{{ bos_token }}{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] | trim + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}";
const tokenizerDir = mkdtempSync(join(tmpdir(), 'kettle-gen-'));
copyFileSync(join(testsDir, 'data', 'tokenizers', 'byte_level.json'), join(tokenizerDir, 'tokenizer.json'));
writeFileSync(join(tokenizerDir, 'tokenizer_config.json'),
  JSON.stringify({ chat_template: chatTemplate, bos_token: '<s>', eos_token: '</s>' }));
const reference = Tokenizer.fromFile(join(tokenizerDir, 'tokenizer.json'));

function generate(args) {
  const out = execFileSync(kettle, ['generate', '--model', model, '--tokenizer', tokenizerDir, '--max-tokens', '12',
    '--ignore-eos', ...args], { encoding: 'utf8' });
  return out;
}

async function referenceIds(text, addSpecialTokens) {
  return (await reference.encode(text, null, { addSpecialTokens })).getIds();
}

test('--prompt encodes like Hugging Face tokenizers and prints the decoded continuation', async () => {
  const text = 'hello world, hello 123';
  const result = JSON.parse(generate(['--prompt', text, '--json']));
  assert.deepEqual(result.prompt_token_ids, await referenceIds(text, true));
  assert.equal(result.completion_tokens, 12);
  assert.equal(result.text, await reference.decode(result.token_ids, false));
  const plain = generate(['--prompt', text]);
  assert.equal(plain.replace(/\n$/, ''), result.text);
});

test('--chat renders the model template like @huggingface/jinja, then encodes without added specials', async () => {
  const rendered = new Template(chatTemplate).render({
    messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello world' }],
    add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>',
  });
  const result = JSON.parse(generate(['--system', 'be brief', '--chat', 'hello world', '--json']));
  assert.deepEqual(result.prompt_token_ids, await referenceIds(rendered, false));
});

test('a prompt that is not one of the three kinds is refused', () => {
  assert.throws(() => generate(['--prompt', 'a', '--chat', 'b']), (e) => e.status === 2 && /exactly one of/.test(e.stderr));
});
