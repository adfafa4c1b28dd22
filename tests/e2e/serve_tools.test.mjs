// Tool calls and reasoning over HTTP, through the official clients, on
// scripted models (tests/support/scripted_model.mjs): real checkpoints whose
// greedy output is a known script — thinking, then Hermes <tool_call>s, or a
// Llama 3 JSON call — so the parse into OpenAI tool_calls / reasoning_content
// and Anthropic tool_use / thinking blocks, streamed and whole, is checked
// against the script itself.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { startServer, stopServer } from '../support/kettle_server.mjs';
import {
  writeScriptedModel, THINK_AND_CALL, PARALLEL_CALLS, LLAMA3_CALL, THINK_AND_ANSWER,
} from '../support/scripted_model.mjs';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] },
  },
}];
const anthropicTools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: tools[0].function.parameters }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

const root = mkdtempSync(join(tmpdir(), 'kettle-tools-'));
const servers = {};
async function serve(name, pieces, format) {
  const dir = join(root, name);
  await writeScriptedModel(dir, { pieces, format });
  servers[name] = await startServer([dir]);
  return {
    openai: new OpenAI({ baseURL: `${servers[name].base}/v1`, apiKey: 'x', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: servers[name].base, apiKey: 'x', maxRetries: 0 }),
  };
}
let think, parallel, llama, answer;
before(async () => {
  think = await serve('think', THINK_AND_CALL, 'hermes');
  parallel = await serve('parallel', PARALLEL_CALLS, 'hermes');
  llama = await serve('llama', LLAMA3_CALL, 'llama3');
  answer = await serve('answer', THINK_AND_ANSWER, 'hermes');
});
after(() => { for (const s of Object.values(servers)) stopServer(s); rmSync(root, { recursive: true, force: true }); });

// The script's JSON call(s), as the parser must report them.
const scriptedCalls = (pieces) => pieces.filter((p) => p.trim().startsWith('{')).map((p) => JSON.parse(p));

test('OpenAI chat: reasoning_content and tool_calls, finish_reason tool_calls', async () => {
  const r = await think.openai.chat.completions.create({ model: 'default', messages, tools, max_tokens: 20 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.reasoning_content, THINK_AND_CALL[1]);
  assert.equal(m.content, null);
  const [expected] = scriptedCalls(THINK_AND_CALL);
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.match(m.tool_calls[0].id, /^call_/);
  assert.equal(m.tool_calls[0].function.name, expected.name);
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), expected.arguments);
});

test('OpenAI chat streaming: reasoning deltas, then tool_call deltas with index and id', async () => {
  const stream = await parallel.openai.chat.completions.create({ messages, tools, max_tokens: 20, stream: true });
  const calls = [];
  let finish = null;
  for await (const c of stream) {
    const d = c.choices[0]?.delta ?? {};
    for (const tc of d.tool_calls ?? []) {
      calls[tc.index] ??= { id: '', name: '', arguments: '' };
      calls[tc.index].id += tc.id ?? '';
      calls[tc.index].name += tc.function?.name ?? '';
      calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
    assert.ok(!d.content, `no content expected, got ${JSON.stringify(d.content)}`);
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  const expected = scriptedCalls(PARALLEL_CALLS);
  assert.equal(calls.length, expected.length);
  calls.forEach((call, i) => {
    assert.match(call.id, /^call_/);
    assert.equal(call.name, expected[i].name);
    assert.deepEqual(JSON.parse(call.arguments), expected[i].arguments);
  });
  assert.notEqual(calls[0].id, calls[1].id);
});

test('OpenAI chat: a Llama 3 JSON call (after <|python_tag|>) becomes tool_calls', async () => {
  const r = await llama.openai.chat.completions.create({ messages, tools, max_tokens: 20 });
  const [expected] = scriptedCalls(LLAMA3_CALL);
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.function.name, expected.name);
  assert.deepEqual(JSON.parse(call.function.arguments), expected.parameters);
});

test('without tools in the request, tool markup stays content; reasoning is still split', async () => {
  const r = await think.openai.chat.completions.create({ messages, max_tokens: 20 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.reasoning_content, THINK_AND_CALL[1]);
  assert.equal(r.choices[0].message.content, THINK_AND_CALL.slice(3).join(''));
  assert.equal(r.choices[0].message.tool_calls, undefined);
});

test('tool results in the conversation render and the next turn runs', async () => {
  const r = await think.openai.chat.completions.create({
    tools, max_tokens: 20,
    messages: [...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18 C, sunny' }],
  });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');  // the scripted model calls again, whatever it is told
});

test('OpenAI chat: thinking then an answer', async () => {
  const r = await answer.openai.chat.completions.create({ messages, max_tokens: 20 });
  assert.equal(r.choices[0].message.reasoning_content, THINK_AND_ANSWER[1]);
  assert.equal(r.choices[0].message.content, THINK_AND_ANSWER[3]);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const stream = await answer.openai.chat.completions.create({ messages, max_tokens: 20, stream: true });
  let reasoning = '', content = '';
  for await (const c of stream) {
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    content += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, THINK_AND_ANSWER[1]);
  assert.equal(content, THINK_AND_ANSWER[3]);
});

test('Anthropic: thinking and tool_use blocks, stop_reason tool_use', async () => {
  const m = await think.anthropic.messages.create({ model: 'default', max_tokens: 20, messages, tools: anthropicTools });
  const [expected] = scriptedCalls(THINK_AND_CALL);
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(m.content[0].thinking, THINK_AND_CALL[1]);
  assert.match(m.content[1].id, /^toolu_/);
  assert.equal(m.content[1].name, expected.name);
  assert.deepEqual(m.content[1].input, expected.arguments);
});

test('Anthropic streaming: block per kind, indices in order, accumulating to the whole message', async () => {
  const body = { model: 'default', max_tokens: 20, messages, tools: anthropicTools };
  const whole = await parallel.anthropic.messages.create(body);
  const events = [];
  const stream = parallel.anthropic.messages.stream(body);
  stream.on('streamEvent', (e) => events.push(e));
  const final = await stream.finalMessage();
  const starts = events.filter((e) => e.type === 'content_block_start');
  assert.deepEqual(starts.map((e) => e.content_block.type), ['tool_use', 'tool_use']);
  assert.deepEqual(starts.map((e) => e.index), [0, 1]);
  assert.deepEqual(events.filter((e) => e.type === 'content_block_stop').map((e) => e.index), [0, 1]);
  assert.equal(final.stop_reason, 'tool_use');
  assert.deepEqual(final.content.map((b) => ({ ...b, id: '' })), whole.content.map((b) => ({ ...b, id: '' })));
  assert.deepEqual(final.content.map((b) => b.input), scriptedCalls(PARALLEL_CALLS).map((c) => c.arguments));
});

test('Anthropic: tool_use and tool_result in history render; thinking streamed as thinking_delta', async () => {
  const events = [];
  const stream = answer.anthropic.messages.stream({
    model: 'default', max_tokens: 20, tools: anthropicTools,
    messages: [...messages,
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '18 C' }] }],
  });
  stream.on('streamEvent', (e) => events.push(e));
  const final = await stream.finalMessage();
  assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(final.content[0].thinking, THINK_AND_ANSWER[1]);
  assert.equal(final.content[1].text, THINK_AND_ANSWER[3]);
  assert.ok(events.some((e) => e.delta?.type === 'thinking_delta'));
  assert.equal(final.stop_reason, 'end_turn');
});
