// Constrained decoding through the official clients: 40 JSON schemas of function-
// calling shape (structured_schemas.mjs), each answered by the demo model and by a
// random-weight model (whose output is noise unless the mask holds it), at
// temperature 0 and 1, whole and streamed — every output parses and ajv (an
// independent validator, JSON Schema 2020-12 with formats) accepts it. Then
// json_object, zod through chat.completions.parse, the Responses API's text.format,
// vLLM's guided_regex / guided_choice / guided_grammar and llama-server's fields,
// forced tool calls (OpenAI required / named, Anthropic any / tool) whose arguments
// ajv checks against the tool's schema, and the 400s that name what cannot be
// enforced.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

import { startServer, stopServer } from '../support/kettle_server.mjs';
import { writeRandomModel } from '../support/random_model.mjs';
import { CHAT_TEMPLATES } from '../support/scripted_model.mjs';
import { SCHEMAS } from './structured_schemas.mjs';

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const root = mkdtempSync(join(tmpdir(), 'kettle-structured-'));
const servers = [];
async function serve(args) {
  const s = await startServer(args);
  servers.push(s);
  return {
    server: s,
    openai: new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'x', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: s.base, apiKey: 'x', maxRetries: 0 }),
  };
}
let demo, noise, hermes, llama3;
before(async () => {
  writeRandomModel(join(root, 'noise'));
  writeRandomModel(join(root, 'hermes'), { template: CHAT_TEMPLATES.hermes });
  writeRandomModel(join(root, 'llama3'), { template: CHAT_TEMPLATES.llama3 });
  [demo, noise, hermes, llama3] = await Promise.all([
    serve(['--batch', '8']),
    serve([join(root, 'noise'), '--batch', '8']),
    serve([join(root, 'hermes'), '--batch', '8']),
    serve([join(root, 'llama3'), '--batch', '8']),
  ]);
});
after(() => { for (const s of servers) stopServer(s); rmSync(root, { recursive: true, force: true }); });

const ask = (name) => [{ role: 'user', content: `Call ${name}: answer with its arguments as JSON.` }];

// One request's text and finish reason, whole or streamed through the client.
async function complete(client, body, stream) {
  if (!stream) {
    const r = await client.chat.completions.create(body);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }
  let text = '', finish = null;
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const c = chunk.choices[0];
    if (c?.delta?.content) text += c.delta.content;
    if (c?.finish_reason) finish = c.finish_reason;
  }
  return { text, finish };
}

function assertValid(schema, text, where) {
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(text); }, `${where}: not JSON: ${text}`);
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${where}: ${ajv.errorsText(validate.errors)} in ${text}`);
}

// Every schema, both temperatures, whole and streamed, 8 requests in flight.
async function allSchemas(model, label) {
  const jobs = [];
  for (const { name, schema } of SCHEMAS)
    for (const temperature of [0, 1])
      for (const stream of [false, true])
        jobs.push({ name, schema, temperature, stream });
  let valid = 0;
  for (let i = 0; i < jobs.length; i += 8) {
    await Promise.all(jobs.slice(i, i + 8).map(async ({ name, schema, temperature, stream }) => {
      const where = `${label} ${name} T=${temperature}${stream ? ' stream' : ''}`;
      const { text, finish } = await complete(model.openai, {
        model: 'any', messages: ask(name), temperature, seed: 7, max_tokens: 400,
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
      }, stream);
      assert.equal(finish, 'stop', `${where}: finished by ${finish}: ${text}`);
      assertValid(schema, text, where);
      valid++;
    }));
  }
  assert.equal(valid, SCHEMAS.length * 4);
}

test('40 schemas on a random-weight model: every output valid (T 0 and 1, whole and streamed)', async () => {
  await allSchemas(noise, 'random');
});

test('40 schemas on the demo model: every output valid (T 0 and 1, whole and streamed)', async () => {
  await allSchemas(demo, 'demo');
});

test('json_object: an object, whatever the model', async () => {
  for (const model of [demo, noise]) {
    for (const temperature of [0, 1]) {
      const { text, finish } = await complete(model.openai, {
        model: 'x', messages: ask('anything'), temperature, seed: 3, max_tokens: 600, response_format: { type: 'json_object' },
      }, false);
      assert.equal(finish, 'stop', text);
      const value = JSON.parse(text);
      assert.equal(typeof value, 'object');
      assert.ok(value !== null && !Array.isArray(value));
    }
  }
});

test('openai chat.completions.parse with a zod schema', async () => {
  const Event = z.object({ name: z.string().max(30), day: z.enum(['mon', 'tue', 'wed']), attendees: z.array(z.string().max(10)).max(3) });
  for (const model of [demo, noise]) {
    const r = await model.openai.chat.completions.parse({
      model: 'x', messages: ask('create_event'), temperature: 1, seed: 11, max_tokens: 300,
      response_format: zodResponseFormat(Event, 'event'),
    });
    const parsed = r.choices[0].message.parsed;
    assert.ok(parsed, r.choices[0].message.content);
    assert.deepEqual(Event.parse(parsed), parsed);
  }
});

test('Responses API: text.format json_schema', async () => {
  const { schema } = SCHEMAS.find((s) => s.name === 'order_pizza');
  for (const model of [demo, noise]) {
    const r = await model.openai.responses.create({
      model: 'x', input: 'Order a pizza.', temperature: 1, max_output_tokens: 400,
      text: { format: { type: 'json_schema', name: 'order', schema, strict: true } },
    });
    assert.equal(r.status, 'completed');
    assertValid(schema, r.output_text, 'responses');
  }
});

test('guided_regex, guided_choice, guided_grammar, and llama-server json_schema / grammar', async () => {
  const post = async (model, route, body) => {
    const res = await fetch(`${model.server.base}${route}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(res.status, 200, await res.clone().text());
    const j = await res.json();
    return j.choices[0].message?.content ?? j.choices[0].text;
  };
  for (const model of [demo, noise]) {
    for (const temperature of [0, 1]) {
      const base = { messages: ask('x'), temperature, seed: 5, max_tokens: 200 };
      const phone = await post(model, '/v1/chat/completions', { ...base, guided_regex: '\\(\\d{3}\\) \\d{3}-\\d{4}' });
      assert.match(phone, /^\(\d{3}\) \d{3}-\d{4}$/);
      const color = await post(model, '/v1/chat/completions', { ...base, guided_choice: ['red', 'green', 'light blue'] });
      assert.ok(['red', 'green', 'light blue'].includes(color), color);
      const sum = await post(model, '/v1/chat/completions', {
        ...base, guided_grammar: 'root ::= num ( [+*] num ){1,3}\nnum ::= [1-9] [0-9]?\n',
      });
      assert.match(sum, /^[1-9][0-9]?([+*][1-9][0-9]?){1,3}$/);
      const flag = await post(model, '/v1/completions', { prompt: 'Answer: ', temperature, seed: 5, max_tokens: 20, grammar: 'root ::= "yes" | "no"' });
      assert.ok(flag === 'yes' || flag === 'no', flag);
      const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] };
      const ok = await post(model, '/v1/completions', { prompt: 'JSON: ', temperature, seed: 5, max_tokens: 50, json_schema: schema });
      assertValid(schema, ok, 'completions json_schema');
      const fmt = await post(model, '/v1/completions', {
        prompt: 'JSON: ', temperature, seed: 5, max_tokens: 50, response_format: { type: 'json_schema', json_schema: { name: 's', schema } },
      });
      assertValid(schema, fmt, 'completions response_format');
    }
  }
});

const weatherTool = {
  type: 'function',
  function: { name: 'get_weather', parameters: SCHEMAS[0].schema },
};
const timerTool = { type: 'function', function: { name: 'set_timer', parameters: SCHEMAS[5].schema } };

test('OpenAI tool_choice required and named: a call in the model\'s syntax, arguments valid', async () => {
  for (const model of [hermes, llama3]) {
    for (const [choice, names] of [['required', ['get_weather', 'set_timer']], [{ type: 'function', function: { name: 'set_timer' } }, ['set_timer']]]) {
      for (const temperature of [0, 1]) {
        for (const stream of [false, true]) {
          const body = {
            model: 'x', messages: ask('a tool'), tools: [weatherTool, timerTool], tool_choice: choice, temperature, seed: 9,
            max_tokens: 1500, reasoning_effort: 'none',  // thinking off: the call comes first
          };
          let calls, finish;
          if (!stream) {
            const r = await model.openai.chat.completions.create(body);
            calls = r.choices[0].message.tool_calls;
            finish = r.choices[0].finish_reason;
          } else {
            const acc = [];
            for await (const chunk of await model.openai.chat.completions.create({ ...body, stream: true })) {
              const c = chunk.choices[0];
              for (const d of c?.delta?.tool_calls ?? []) {
                acc[d.index] ??= { function: { name: '', arguments: '' } };
                if (d.function?.name) acc[d.index].function.name += d.function.name;
                if (d.function?.arguments) acc[d.index].function.arguments += d.function.arguments;
              }
              if (c?.finish_reason) finish = c.finish_reason;
            }
            calls = acc;
          }
          const where = `${JSON.stringify(choice)} T=${temperature}${stream ? ' stream' : ''}`;
          assert.equal(finish, 'tool_calls', where);
          assert.ok(calls?.length >= 1, where);
          for (const call of calls) {
            assert.ok(names.includes(call.function.name), `${where}: ${call.function.name}`);
            const tool = [weatherTool, timerTool].find((t) => t.function.name === call.function.name);
            assertValid(tool.function.parameters, call.function.arguments, where);
          }
        }
      }
    }
  }
});

test('Anthropic tool_choice any and tool: tool_use blocks with valid input', async () => {
  const tools = [weatherTool, timerTool].map((t) => ({ name: t.function.name, input_schema: t.function.parameters }));
  for (const choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
    for (const temperature of [0, 1]) {
      const r = await hermes.anthropic.messages.create({
        model: 'x', max_tokens: 1500, messages: [{ role: 'user', content: 'weather?' }], tools, tool_choice: choice, temperature,
        thinking: { type: 'disabled' },
      });
      assert.equal(r.stop_reason, 'tool_use');
      const uses = r.content.filter((b) => b.type === 'tool_use');
      assert.ok(uses.length >= 1);
      for (const u of uses) {
        if (choice.type === 'tool') assert.equal(u.name, 'get_weather');
        const tool = tools.find((t) => t.name === u.name);
        assert.ok(ajv.validate(tool.input_schema, u.input), ajv.errorsText());
      }
    }
  }
});

test('what cannot be enforced is a 400 naming it', async () => {
  const post = async (model, body, route = '/v1/chat/completions') => {
    const res = await fetch(`${model.server.base}${route}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages: ask('x'), max_tokens: 5, ...body }),
    });
    return { status: res.status, error: (await res.json()).error };
  };
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', properties: { a: { not: { type: 'string' } } } } } } },
      'response_format.json_schema.schema.properties.a'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'string', format: 'hostname' } } } }, 'format'],
    [{ guided_regex: '(a)\\1' }, 'guided_regex'],
    [{ guided_grammar: 'root ::= missing' }, 'guided_grammar'],
    [{ guided_choice: [] }, 'guided_choice'],
    [{ guided_regex: 'a', guided_choice: ['a'] }, 'guided_choice'],
    [{ tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
  ];
  for (const [body, param] of cases) {
    const { status, error } = await post(demo, body);
    assert.equal(status, 400, JSON.stringify(body));
    assert.ok(`${error.param} ${error.message}`.includes(param), `${JSON.stringify(body)}: ${error.param} ${error.message}`);
  }
  // The demo model's template has no tool-call syntax: a forced call cannot be written.
  const forced = await post(demo, { tools: [weatherTool], tool_choice: 'required' });
  assert.equal(forced.status, 400);
  assert.match(forced.error.message, /no tool-call syntax/);
});
