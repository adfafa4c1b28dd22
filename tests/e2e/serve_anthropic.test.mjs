// `kettle serve` through the official @anthropic-ai/sdk: /v1/messages with
// the bundled demo model. Greedy text must equal `kettle generate --chat`
// (with --system for system prompts); streaming must follow the Messages
// API's event sequence exactly and accumulate (SDK's finalMessage) to the
// non-streamed message; stop sequences and errors in Anthropic's shapes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import Anthropic from '@anthropic-ai/sdk';

import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0, timeout: 30000 });
});
after(() => stopServer(server));

const question = 'What is a kettle?';
const generate = (args) =>
  JSON.parse(execFileSync(kettle, ['generate', ...args, '--temp', '0', '--json'], { encoding: 'utf8' }));

test('a message equals `kettle generate --chat`, with usage and stop_reason', async () => {
  const reference = generate(['--chat', question, '--max-tokens', '20']);
  const m = await client.messages.create({
    model: 'kettle-demo', max_tokens: 20, temperature: 0, messages: [{ role: 'user', content: question }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, 'kettle-demo');
  assert.deepEqual(m.content, [{ type: 'text', text: reference.text }]);
  assert.equal(m.stop_reason, reference.finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, reference.prompt_tokens);
  assert.equal(m.usage.output_tokens, reference.completion_tokens);
});

test('a system prompt (string or text blocks) is the template\'s system message', async () => {
  const system = 'Answer in one word.';
  const reference = generate(['--chat', question, '--system', system, '--max-tokens', '12']);
  for (const s of [system, [{ type: 'text', text: 'Answer in one ' }, { type: 'text', text: 'word.' }]]) {
    const m = await client.messages.create({
      model: 'kettle-demo', max_tokens: 12, temperature: 0, system: s, messages: [{ role: 'user', content: question }],
    });
    assert.equal(m.content[0].text, reference.text);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, reference.prompt_tokens);
  }
});

test('streaming: the exact event sequence, accumulating to the non-streamed message', async () => {
  const body = { model: 'kettle-demo', max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: question }] };
  const whole = await client.messages.create(body);
  const events = [];
  const stream = client.messages.stream(body);
  stream.on('streamEvent', (e) => events.push(e));
  const final = await stream.finalMessage();
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.ok(types.slice(2, -3).every((t) => t === 'content_block_delta'), types.join(','));
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(events[0].message.usage.input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
  assert.deepEqual(events[1].content_block, { type: 'text', text: '' });
  assert.ok(events.filter((e) => e.type.startsWith('content_block')).every((e) => e.index === 0));
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  // The raw wire: every event is `event: NAME` + `data: {"type": NAME, ...}`, and a ping after message_start.
  const raw = await (await fetch(`${server.base}/v1/messages`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
  })).text();
  const blocks = raw.trim().split('\n\n').map((b) => {
    const [ev, data] = b.split('\n');
    return { name: ev.replace('event: ', ''), data: JSON.parse(data.replace('data: ', '')) };
  });
  assert.ok(blocks.every((b) => b.name === b.data.type));
  assert.deepEqual(blocks.slice(0, 3).map((b) => b.name), ['message_start', 'ping', 'content_block_start']);
  assert.deepEqual(blocks[0].data.message.content, []);
  assert.equal(blocks[0].data.message.stop_reason, null);
  assert.deepEqual(Object.keys(blocks[0].data), ['type', 'message']);
});

test('stop_sequences end the message with stop_reason stop_sequence naming it', async () => {
  const long = await client.messages.create({
    model: 'kettle-demo', max_tokens: 40, temperature: 0, messages: [{ role: 'user', content: question }],
  });
  const text = long.content[0].text;
  assert.ok(text.length > 10, text);
  const stop = text.slice(5, 8);
  const m = await client.messages.create({
    model: 'kettle-demo', max_tokens: 40, temperature: 0, stop_sequences: ['qqzzqq', stop],
    messages: [{ role: 'user', content: question }],
  });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, text.slice(0, text.indexOf(stop)));
  const streamed = await client.messages.stream({
    model: 'kettle-demo', max_tokens: 40, temperature: 0, stop_sequences: [stop],
    messages: [{ role: 'user', content: question }],
  }).finalMessage();
  assert.equal(streamed.stop_reason, 'stop_sequence');
  assert.equal(streamed.stop_sequence, stop);
  assert.deepEqual(streamed.content, m.content);
});

test('an assistant message last is continued (prefill)', async () => {
  const whole = await client.messages.create({
    model: 'kettle-demo', max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: question }],
  });
  const text = whole.content[0].text;
  const prefix = text.split(' ').slice(0, 2).join(' ');  // whole words: tokenized as the model wrote them
  const m = await client.messages.create({
    model: 'kettle-demo', max_tokens: 8, temperature: 0,
    messages: [{ role: 'user', content: question }, { role: 'assistant', content: prefix }],
  });
  assert.ok(prefix.length > 3 && prefix.length + 4 < text.length, text);
  assert.ok((prefix + m.content[0].text).startsWith(text.slice(0, prefix.length + 4)), m.content[0].text);
});

test('errors in Anthropic\'s shape: missing max_tokens, bad block, missing model, malformed JSON', async () => {
  await assert.rejects(client.messages.create({ model: 'kettle-demo', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error.error.type === 'invalid_request_error' &&
      /max_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({
    model: 'kettle-demo', max_tokens: 5,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
  }), (e) => e.status === 400 && /messages\[0\]\.content\[0\]/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && /model/.test(e.error.error.message));
  const res = await fetch(`${server.base}/v1/messages`, { method: 'POST', body: '{"model": ' });
  assert.equal(res.status, 400);
  assert.deepEqual(Object.keys(await res.json()), ['type', 'error']);
});

test('any model name routes to the served model; the response names it', async () => {
  const m = await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(m.model, 'kettle-demo');
  assert.ok(m.content.length >= 0 && m.usage.output_tokens > 0);
});

test('tool_choice any / tool on a model with no tool-call syntax, and unknown fields, are 400s naming them; auto and none are applied', async () => {
  const tools = [{ name: 'lookup', description: 'Look up a word', input_schema: { type: 'object', properties: {} } }];
  const base = { model: 'kettle-demo', max_tokens: 4, messages: [{ role: 'user', content: question }], tools };
  for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'lookup' }]) {
    await assert.rejects(client.messages.create({ ...base, tool_choice }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.error?.type, 'error');
      assert.equal(e.error?.error?.type, 'invalid_request_error');
      assert.match(e.error?.error?.message, /tool_choice/);
      return true;
    });
  }
  await assert.rejects(client.messages.create({ ...base, frobnicate: 1 }), (e) => e.status === 400 && /frobnicate/.test(e.message));
  for (const tool_choice of [{ type: 'auto' }, { type: 'none' }])
    assert.equal((await client.messages.create({ ...base, tool_choice })).type, 'message');
});
