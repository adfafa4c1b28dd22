// The scripted test model (tests/support/scripted_model.mjs) through the real
// binary: `kettle generate --chat` must print exactly the script and stop on
// <|im_end|>, whatever the conversation; its tokenizer must behave the same
// in native Hugging Face tokenizers (each piece one id, decoded back); and
// `kettle render` must render its templates as @huggingface/jinja does.
// Run: cd tests && KETTLE_BIN=../build/kettle node --test e2e/scripted_model.test.mjs
import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Template } from '@huggingface/jinja';
import {
  writeScriptedModel, THINK_AND_CALL, PARALLEL_CALLS, LLAMA3_CALL, THINK_AND_ANSWER,
} from '../support/scripted_model.mjs';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('@anush008/tokenizers');

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
const TMP = mkdtempSync(join(tmpdir(), 'kettle-scripted-'));
after(() => rmSync(TMP, { recursive: true, force: true }));

const CASES = [
  ['think_and_call', THINK_AND_CALL, 'hermes'],
  ['parallel_calls', PARALLEL_CALLS, 'hermes'],
  ['think_and_answer', THINK_AND_ANSWER, 'hermes'],
  ['llama3_call', LLAMA3_CALL, 'llama3'],
  ['think_and_answer_llama3', THINK_AND_ANSWER, 'llama3'],
];

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
    },
  },
};
const call = (id, args) => ({ id, type: 'function', function: { name: 'get_weather', arguments: args } });
const CONVERSATIONS = {
  tools_and_history: {
    tools: [WEATHER_TOOL],
    messages: [
      { role: 'system', content: 'You can call tools.' },
      { role: 'user', content: 'Weather in Paris and Oslo?' },
      {
        role: 'assistant', reasoning_content: 'Two cities, two calls.', content: null,
        tool_calls: [call('c1', { city: 'Paris', unit: 'celsius' }), call('c2', '{"city": "Oslo"}')],
      },
      { role: 'tool', tool_call_id: 'c1', content: '21 degrees' },
      { role: 'tool', tool_call_id: 'c2', content: [{ type: 'text', text: '-3 degrees' }] },
      { role: 'assistant', content: 'Paris: 21 °C, Oslo: -3 °C.' },
      { role: 'user', content: 'Thanks!' },
    ],
  },
  tools_no_system: {
    tools: [WEATHER_TOOL],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Weather in Rome?' }] }],
  },
  call_with_content: {
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Weather?' },
      { role: 'assistant', content: 'Checking.', tool_calls: [call('c1', { city: 'Rome' })] },
      { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
    ],
  },
  plain: { messages: [{ role: 'user', content: 'hi' }] },
};

function run(args) {
  return execFileSync(kettle, args, { encoding: 'utf8' });
}

for (const [name, pieces, format] of CASES) {
  const model = await writeScriptedModel(join(TMP, name), { pieces, format });
  describe(`${name} (${format})`, () => {
    const generate = (extra) => JSON.parse(run(['generate', '--model', model.dir, '--max-tokens', '20', '--json', ...extra]));

    test('greedy generation after the chat prompt is the script, then <|im_end|>', () => {
      // The margin (see scripted_model.mjs) holds at temperature 1 too: sampling cannot leave the script.
      for (const extra of [['--chat', 'hi'], ['--system', 'You are a weather bot.', '--chat', 'What is the weather in Paris?'],
        ['--chat', 'hi', '--temperature', '1', '--top-k', '0', '--seed', '7']]) {
        const out = generate(extra);
        assert.equal(out.text, model.text);
        assert.equal(out.finish_reason, 'stop');
        assert.deepEqual(out.token_ids, [...model.ids.pieces, model.ids.imEnd]);
        assert.equal(out.prompt_token_ids.at(-1), model.ids.newline);
      }
    });

    test('a prompt that does not end the generation prompt gets <|im_end|> at once', () => {
      const out = generate(['--prompt', 'hi']);
      assert.equal(out.text, '');
      assert.deepEqual(out.token_ids, [model.ids.imEnd]);
      assert.equal(out.finish_reason, 'stop');
    });

    test('Hugging Face tokenizers: each piece is one id and decodes back', async () => {
      const reference = Tokenizer.fromFile(join(model.dir, 'tokenizer.json'));
      for (const [i, piece] of pieces.entries()) {
        const ids = (await reference.encode(piece, null, { addSpecialTokens: false })).getIds();
        assert.deepEqual(ids, [model.ids.pieces[i]], `piece ${JSON.stringify(piece)}`);
        assert.equal(await reference.decode(ids, false), piece);
      }
      assert.equal(await reference.decode(model.ids.pieces, true), model.text);
      // kettle's prompt ids for the chat prompt equal the reference encoding of the rendered template.
      const rendered = new Template(model.chatTemplate).render({
        ...model.specialTokens, messages: [{ role: 'user', content: 'hi' }], tools: null, add_generation_prompt: true,
      });
      assert.ok(rendered.endsWith('<|im_start|>assistant\n'));
      const want = (await reference.encode(rendered, null, { addSpecialTokens: false })).getIds();
      assert.deepEqual(generate(['--chat', 'hi']).prompt_token_ids, want);
    });

    test('kettle render equals @huggingface/jinja for conversations with tools', () => {
      for (const [conv, { messages, tools }] of Object.entries(CONVERSATIONS)) {
        const messagesFile = join(TMP, `${name}-${conv}-messages.json`);
        writeFileSync(messagesFile, JSON.stringify(messages));
        const args = ['render', '--tokenizer', model.dir, '--messages', messagesFile, '--add-generation-prompt'];
        if (tools) {
          const toolsFile = join(TMP, `${name}-${conv}-tools.json`);
          writeFileSync(toolsFile, JSON.stringify(tools));
          args.push('--tools', toolsFile);
        }
        const want = new Template(model.chatTemplate).render({
          ...model.specialTokens, messages: structuredClone(messages), tools: tools ? structuredClone(tools) : null,
          add_generation_prompt: true,
        });
        assert.equal(run(args), want, conv);
        if (tools) {
          assert.ok(want.includes(format === 'hermes' ? '<tools>\n{"type": "function"' : '<|python_tag|>'), conv);
        }
        assert.ok(want.endsWith('<|im_start|>assistant\n'), conv);
      }
    });
  });
}

test('pieces are checked: distinct, non-empty, no chat markers, not inside the generation prompt', async () => {
  const bad = [
    [[], /non-empty array/], [['x', 'x'], /appears twice/], [[''], /non-empty string/], [['ok', 42], /non-empty string/],
    [['x<|im_end|>'], /chat marker/], [['\n'], /generation prompt/], [['t\n'], /generation prompt/], [['sis'], /generation prompt/],
  ];
  for (const [pieces, why] of bad) {
    await assert.rejects(writeScriptedModel(join(TMP, 'bad'), { pieces }), why, JSON.stringify(pieces));
  }
  await assert.rejects(writeScriptedModel(join(TMP, 'bad'), { pieces: ['x'], format: 'nope' }), /format/);
});
