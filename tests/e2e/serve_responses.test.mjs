// POST /v1/responses through the official openai client (responses.create,
// responses.stream, retrieve, delete): scripted models (tests/support/
// scripted_model.mjs) whose greedy output is a known script give reasoning
// and function_call items to check against the script; the demo model checks
// previous_response_id, instructions and function_call_output items against
// the chat route with the same conversation written out (same prompt tokens,
// same greedy text); the store's TTL and store: false; refusals by name.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';

import { sleep, startServer, stopServer } from '../support/kettle_server.mjs';
import { writeScriptedModel, THINK_AND_CALL } from '../support/scripted_model.mjs';

const demo = new URL('../../models/kettle-demo', import.meta.url).pathname;
const root = mkdtempSync(join(tmpdir(), 'kettle-responses-'));
const tools = [{
  type: 'function', name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const chatTools = tools.map(({ type, ...fn }) => ({ type, function: fn }));
const question = 'What is the weather in Paris?';
const scriptedCall = JSON.parse(THINK_AND_CALL.find((p) => p.trim().startsWith('{')));

let think, demoServer, shortLived;
const client = (server) => new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
before(async () => {
  await writeScriptedModel(join(root, 'think'), { pieces: THINK_AND_CALL, format: 'hermes' });
  think = await startServer([join(root, 'think')]);
  demoServer = await startServer([demo]);
  shortLived = await startServer([demo, '--response-ttl', '1']);
});
after(() => { for (const s of [think, demoServer, shortLived]) stopServer(s); rmSync(root, { recursive: true, force: true }); });

function checkScriptedOutput(r) {
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  assert.equal(r.output[0].content[0].text, THINK_AND_CALL[1]);
  const call = r.output[1];
  assert.equal(call.name, scriptedCall.name);
  assert.deepEqual(JSON.parse(call.arguments), scriptedCall.arguments);
  assert.match(call.call_id, /^call_/);
  assert.match(call.id, /^fc_/);
}

test('create: reasoning and function_call items from the script; a Response object', async () => {
  const r = await client(think).responses.create({ model: 'gpt-4o', input: question, tools, max_output_tokens: 20 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  checkScriptedOutput(r);
});

test('stream: the documented event sequence, accumulating to the same output', async () => {
  const stream = client(think).responses.stream({ model: 'm', input: question, tools, max_output_tokens: 20 });
  const events = [];
  for await (const e of stream) events.push(e);
  const final = await stream.finalResponse();
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  assert.equal(events.at(-1).type, 'response.completed');
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const types = events.map((e) => e.type);
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta',
    'response.reasoning_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.function_call_arguments.delta', 'response.function_call_arguments.done']) assert.ok(types.includes(t), t);
  checkScriptedOutput(final);
  checkScriptedOutput(events.at(-1).response);
});

test('previous_response_id continues the stored conversation, as the chat route with it written out', async () => {
  const c = client(demoServer);
  const first = await c.responses.create({ model: 'm', input: 'What is a kettle?', temperature: 0, max_output_tokens: 8 });
  const second = await c.responses.create({
    model: 'm', previous_response_id: first.id, input: 'And why?', temperature: 0, max_output_tokens: 8,
  });
  assert.equal(second.previous_response_id, first.id);
  const chat = await c.chat.completions.create({
    messages: [{ role: 'user', content: 'What is a kettle?' }, { role: 'assistant', content: first.output_text },
      { role: 'user', content: 'And why?' }],
    temperature: 0, max_tokens: 8,
  });
  assert.equal(second.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(second.output_text, chat.choices[0].message.content);
  // instructions: a system message for this response only.
  const told = await c.responses.create({ model: 'm', instructions: 'Be brief.', input: 'Hi', temperature: 0, max_output_tokens: 4 });
  const told_chat = await c.chat.completions.create({
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 4,
  });
  assert.equal(told.usage.input_tokens, told_chat.usage.prompt_tokens);
  assert.equal(told.output_text, told_chat.choices[0].message.content);
});

test('function_call and function_call_output items render as the chat route\'s tool call and result', async () => {
  const c = client(demoServer);
  const r = await c.responses.create({
    model: 'm', tools, temperature: 0, max_output_tokens: 4,
    input: [{ role: 'user', content: question },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '18 C, sunny' }],
  });
  const chat = await c.chat.completions.create({
    tools: chatTools, temperature: 0, max_tokens: 4,
    messages: [{ role: 'user', content: question },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18 C, sunny' }],
  });
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
});

test('retrieve and delete; store: false keeps nothing; an expired or unknown id is a 404', async () => {
  const c = client(demoServer);
  const r = await c.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2 });
  const got = await c.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.deepEqual(got.output, r.output);
  const deleted = await fetch(`${demoServer.base}/v1/responses/${r.id}`, { method: 'DELETE' });
  assert.deepEqual(await deleted.json(), { id: r.id, object: 'response.deleted', deleted: true });
  await assert.rejects(c.responses.retrieve(r.id), (e) => e.status === 404);
  const unstored = await c.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2, store: false });
  await assert.rejects(c.responses.retrieve(unstored.id), (e) => e.status === 404);
  await assert.rejects(c.responses.create({ model: 'm', input: 'Hi', previous_response_id: unstored.id }),
    (e) => e.status === 404 && /previous_response_id|no stored response/.test(e.message));
  const s = client(shortLived);
  const brief = await s.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2 });
  assert.equal((await s.responses.retrieve(brief.id)).id, brief.id);
  await sleep(1500);
  await assert.rejects(s.responses.retrieve(brief.id), (e) => e.status === 404);
});

test('what the route cannot apply is a 400 naming it', async () => {
  const c = client(demoServer);
  const refused = async (extra, param) => {
    await assert.rejects(c.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2, ...extra }), (e) => {
      assert.equal(e.status, 400, JSON.stringify(extra));
      assert.equal(e.error?.param ?? e.param, param);
      return true;
    });
  };
  await refused({ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { a: { not: {} } } } } } },
    'text.format.schema');
  await refused({ tools, tool_choice: 'required' }, 'tool_choice');
  await refused({ include: ['reasoning.encrypted_content'] }, 'include');
  await refused({ tools: [{ type: 'web_search' }] }, 'tools[0]');
  await refused({ input: [{ type: 'input_image', image_url: 'x' }] }, 'input[0]');
  await refused({ frobnicate: 1 }, 'frobnicate');
  await refused({ reasoning: { summary: 'auto' } }, 'reasoning.summary');
});
