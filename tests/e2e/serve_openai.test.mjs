// `kettle serve` end to end with the official `openai` client: the real binary
// on a free loopback port with the bundled demo model. Greedy output must equal
// `kettle generate --json` for the same prompt; streaming, stop strings, limits,
// errors, client cancellation and SIGTERM draining are checked over the wire.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';

import { kettle, sleep, startServer, stopServer } from '../support/kettle_server.mjs';


let server;
let client;
before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
});
after(() => stopServer(server));

const question = 'What is a kettle?';
const demoModel = new URL('../../models/kettle-demo', import.meta.url).pathname;

function generateJson(args) {
  return JSON.parse(execFileSync(kettle, ['generate', ...args, '--temp', '0', '--json'], { encoding: 'utf8' }));
}

test('health and the model list', async () => {
  assert.deepEqual(await (await fetch(`${server.base}/health`)).json(), { status: 'ok' });
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['kettle-demo']);
});

test('/v1/models/{id}: any id names the served model, with its context window, capabilities and defaults', async () => {
  const config = JSON.parse(readFileSync(join(demoModel, 'config.json'), 'utf8'));
  const generation = JSON.parse(readFileSync(join(demoModel, 'generation_config.json'), 'utf8'));
  for (const id of ['kettle-demo', 'gpt-4o']) {
    const m = await client.models.retrieve(id);
    assert.equal(m.id, 'kettle-demo');
    assert.equal(m.object, 'model');
    assert.equal(m.context_window, config.max_position_embeddings);
    assert.ok(m.capabilities.includes('chat') && m.capabilities.includes('completion'), m.capabilities.join());
    assert.ok(Math.abs(m.defaults.temperature - generation.temperature) < 1e-6);
    assert.equal(m.defaults.top_k, generation.top_k);
    assert.ok(Math.abs(m.defaults.top_p - generation.top_p) < 1e-6);
  }
  const list = await client.models.list();
  assert.equal(list.data[0].context_window, config.max_position_embeddings);
});

test('greedy chat equals `kettle generate --chat`, with matching usage', async () => {
  const reference = generateJson(['--chat', question, '--max-tokens', '24']);
  const r = await client.chat.completions.create({
    model: 'kettle-demo', messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 24, seed: 1,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].message.content, reference.text);
  assert.equal(r.choices[0].finish_reason, reference.finish_reason);
  assert.equal(r.usage.prompt_tokens, reference.prompt_tokens);
  assert.equal(r.usage.completion_tokens, reference.completion_tokens);
  assert.equal(r.usage.total_tokens, reference.prompt_tokens + reference.completion_tokens);
});

test('streamed chat concatenates to the non-streamed text; include_usage adds a usage chunk', async () => {
  const body = { messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 24 };
  const full = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, full.choices[0].message.content);
  const withChoice = chunks.filter((c) => c.choices.length > 0);
  assert.equal(withChoice.at(-1).choices[0].finish_reason, full.choices[0].finish_reason);
  assert.ok(withChoice.slice(0, -1).every((c) => c.choices[0].finish_reason === null));
  assert.equal(chunks.at(-1).choices.length, 0);
  assert.deepEqual(chunks.at(-1).usage, full.usage);
});

test('completions encode the prompt with special tokens, like `kettle generate --prompt`', async () => {
  const prompt = 'Once upon a time';
  const reference = generateJson(['--prompt', prompt, '--max-tokens', '16']);
  const r = await client.completions.create({ model: 'default', prompt, temperature: 0, max_tokens: 16 });
  assert.equal(r.choices[0].text, reference.text);
  assert.equal(r.usage.prompt_tokens, reference.prompt_tokens);
  assert.equal(r.usage.completion_tokens, reference.completion_tokens);
  const stream = await client.completions.create({ prompt, temperature: 0, max_tokens: 16, stream: true });
  let text = '';
  let finish = null;
  for await (const c of stream) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
  assert.equal(text, reference.text);
  assert.equal(finish, r.choices[0].finish_reason);
});

test('max_tokens ends with finish_reason length; a stop string ends before it with stop', async () => {
  const prompt = 'Once upon a time';
  const long = await client.completions.create({ prompt, temperature: 0, max_tokens: 40, ignore_eos: true });
  assert.equal(long.choices[0].finish_reason, 'length');
  assert.equal(long.usage.completion_tokens, 40);
  const text = long.choices[0].text;
  assert.ok(text.length > 8, text);
  const stopAt = text.slice(4, 7);  // a substring the greedy continuation is known to contain
  const first = text.indexOf(stopAt);
  const r = await client.completions.create({ prompt, temperature: 0, max_tokens: 40, ignore_eos: true, stop: [stopAt, 'zzzzqq'] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].text, text.slice(0, first));
  const chat = await client.chat.completions.create({
    messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 3, ignore_eos: true,
  });
  assert.equal(chat.choices[0].finish_reason, 'length');
  assert.equal(chat.usage.completion_tokens, 3);
});

test('errors: malformed JSON 400, wrong field type 400 naming it, missing messages 400, too long 400', async () => {
  const post = (path, body) => fetch(`${server.base}/v1/${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  let res = await post('chat/completions', '{"messages": [');
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.type, 'invalid_request_error');
  res = await post('chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' }));
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, 'temperature');
  res = await post('chat/completions', JSON.stringify({ model: 'kettle-demo' }));
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, 'messages');
  res = await post('completions', JSON.stringify({ prompt: 'hi', max_tokens: 100000 }));
  assert.equal(res.status, 400);
  res = await post('chat/completions', JSON.stringify({ model: 4, messages: [{ role: 'user', content: 'hi' }] }));
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, 'model');
  res = await post('completions', 'x'.repeat(9 << 20));
  assert.equal(res.status, 413);
  assert.equal((await (await fetch(`${server.base}/health`)).json()).status, 'ok');
});

test('aborting a stream cancels its generation; the server answers the next request', async () => {
  const controller = new AbortController();
  const stream = await client.completions.create(
    { prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, stream: true }, { signal: controller.signal });
  let seen = 0;
  try {
    for await (const c of stream) {
      if (c.choices[0].text && ++seen === 3) { controller.abort(); break; }
    }
  } catch { /* the client may report the abort as an error */ }
  assert.equal(seen, 3);
  for (let i = 0; i < 50 && !/generation cancelled/.test(server.stderr); i++) await sleep(100);
  assert.match(server.stderr, /generation cancelled/);
  const r = await client.completions.create({ prompt: 'Hello', max_tokens: 4, temperature: 0 });
  assert.ok(r.choices[0].text.length > 0 || r.choices[0].finish_reason === 'stop');
});

test('SIGTERM during a stream: the stream ends and the process exits 0', async () => {
  const own = await startServer();
  try {
    const c = new OpenAI({ baseURL: `${own.base}/v1`, apiKey: 'x', maxRetries: 0 });
    const stream = await c.completions.create({ prompt: 'Once upon a time', max_tokens: 600, ignore_eos: true, stream: true });
    let chunks = 0;
    let signalled = false;
    try {
      for await (const ch of stream) {
        chunks++;
        if (!signalled && ch.choices[0].text) { signalled = true; own.proc.kill('SIGTERM'); }
      }
    } catch { /* a cut stream is an ended stream too */ }
    assert.ok(signalled && chunks > 1);
    const exit = await Promise.race([own.exit, sleep(20000).then(() => 'timeout')]);
    assert.deepEqual(exit, { code: 0, signal: null });
  } finally {
    stopServer(own);
  }
});

test('logprobs: the first token\'s equals log-softmax of the prompt\'s last logits (kettle generate --dump-logits)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kettle-lp-'));
  try {
    const dump = join(dir, 'logits.f32');
    const reference = generateJson(['--chat', question, '--max-tokens', '4', '--dump-logits', dump]);
    const raw = readFileSync(dump);
    const all = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
    const vocab = all.length / reference.prompt_tokens;
    const last = Array.from(all.subarray(all.length - vocab));
    const max = Math.max(...last);
    const logZ = max + Math.log(last.reduce((s, x) => s + Math.exp(x - max), 0));
    const r = await client.chat.completions.create({
      messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 4, logprobs: true, top_logprobs: 3,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, reference.completion_tokens);
    assert.ok(Math.abs(content[0].logprob - (last[reference.token_ids[0]] - logZ)) < 1e-4);
    for (const t of content) {
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.top_logprobs[0].token, t.token);  // greedy: the most likely one
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
      assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
    }
    assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);
    const c = await client.completions.create({ prompt: 'Once upon a time', temperature: 0, max_tokens: 3, logprobs: 2 });
    const lp = c.choices[0].logprobs;
    assert.equal(lp.tokens.length, 3);
    assert.equal(lp.token_logprobs.length, 3);
    assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
    assert.deepEqual(lp.text_offset, [0, lp.tokens[0].length, lp.tokens[0].length + lp.tokens[1].length]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('logit_bias bans and forces tokens; penalties reach the sampler as in `kettle generate`', async () => {
  const base = { messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 6, ignore_eos: true };
  const plain = generateJson(['--chat', question, '--max-tokens', '6', '--ignore-eos']);
  const first = await client.chat.completions.create({ ...base, logprobs: true });
  assert.equal(first.choices[0].message.content, plain.text);
  const bannedText = first.choices[0].logprobs.content[0].token;
  const r = await client.chat.completions.create({ ...base, logprobs: true, logit_bias: { [plain.token_ids[0]]: -100 } });
  assert.notEqual(r.choices[0].logprobs.content[0].token, bannedText);
  const forcedText = JSON.parse(execFileSync(kettle, ['tokenize', '--tokenizer', demoModel, '--decode', '300', '--json'], { encoding: 'utf8' }));
  const forced = await client.chat.completions.create({ ...base, logit_bias: { 300: 100 } });
  assert.equal(forced.usage.completion_tokens, 6);
  assert.equal(forced.choices[0].message.content, forcedText.repeat(6));
  for (const [flag, field, value] of [['--repetition-penalty', 'repetition_penalty', 1.8],
    ['--frequency-penalty', 'frequency_penalty', 1.5], ['--presence-penalty', 'presence_penalty', 1.5]]) {
    const reference = generateJson(['--chat', question, '--max-tokens', '24', '--ignore-eos', flag, String(value)]);
    const got = await client.chat.completions.create({ ...base, max_tokens: 24, [field]: value });
    assert.equal(got.choices[0].message.content, reference.text, field);
  }
  const unpenalized = generateJson(['--chat', question, '--max-tokens', '24', '--ignore-eos']);
  const penalized = generateJson(['--chat', question, '--max-tokens', '24', '--ignore-eos', '--repetition-penalty', '1.8']);
  assert.notEqual(penalized.text, unpenalized.text);
});

// One model is served: a client that sends a fixed model name (an agent configured for
// gpt-4o) is served by it, and the response names the served id.
test('any model name routes to the served model; the response names it', async () => {
  const named = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 4, temperature: 0 });
  const served = await client.chat.completions.create({ model: 'kettle-demo', messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 4, temperature: 0 });
  assert.equal(named.model, 'kettle-demo');
  assert.equal(named.choices[0].message.content, served.choices[0].message.content);
  const completion = await client.completions.create({ model: 'text-davinci-003', prompt: 'Once', max_tokens: 2 });
  assert.equal(completion.model, 'kettle-demo');
});

test('a field kettle cannot apply is a 400 naming it, through the official clients', async () => {
  const base = { model: 'gpt-4o', messages: [{ role: 'user', content: question }], max_tokens: 4 };
  const tools = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: {} } } }];
  const refused = async (extra, param) => {
    await assert.rejects(client.chat.completions.create({ ...base, ...extra }), (e) => {
      assert.equal(e.status, 400, JSON.stringify(extra));
      assert.equal(e.error?.param ?? e.param, param);
      assert.match(e.message, new RegExp(param));
      return true;
    });
  };
  // Constraints kettle cannot enforce: a schema keyword it does not compile, a forced call
  // in a model whose template has no tool-call syntax, an empty choice list.
  await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { not: {} } } } } } },
    'response_format.json_schema.schema');
  await refused({ tools, tool_choice: 'required' }, 'tool_choice');
  await refused({ tools, tool_choice: { type: 'function', function: { name: 'lookup' } } }, 'tool_choice');
  await refused({ guided_choice: [] }, 'guided_choice');
  await refused({ typical_p: 0.5 }, 'typical_p');
  await refused({ frobnicate: true }, 'frobnicate');
  await refused({ store: true }, 'store');
  // What kettle does anyway is taken: text format, auto tool choice, parallel calls, no storing.
  const r = await client.chat.completions.create({ ...base, response_format: { type: 'text' }, tools, tool_choice: 'auto',
    parallel_tool_calls: true, store: false, user: 'u1', metadata: { run: '1' } });
  assert.equal(r.object, 'chat.completion');
  // The server lives on.
  assert.equal((await client.chat.completions.create(base)).object, 'chat.completion');
});

test('penalty windows (mlx_lm.server\'s *_context_size) are applied', async () => {
  const base = { messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 32, repetition_penalty: 1.5 };
  const text = async (extra) => (await client.chat.completions.create({ ...base, ...extra })).choices[0].message.content;
  const whole = await text({});
  // A window longer than prompt and output is the whole context; a one-token window is not.
  assert.equal(await text({ repetition_context_size: 100000 }), whole);
  assert.notEqual(await text({ repetition_context_size: 1 }), whole);
  await assert.rejects(client.chat.completions.create({ ...base, repetition_context_size: -1 }),
    (e) => e.status === 400 && (e.error?.param ?? e.param) === 'repetition_context_size');
});

test('XTC is applied: above 0.5 no two tokens qualify (greedy unchanged); at 0 only the least likely is left', async () => {
  const base = { messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 16 };
  const text = async (extra) => (await client.chat.completions.create({ ...base, ...extra })).choices[0].message.content;
  const greedy = await text({});
  assert.equal(await text({ xtc_probability: 1, xtc_threshold: 0.5 }), greedy);
  assert.notEqual(await text({ xtc_probability: 1, xtc_threshold: 0, ignore_eos: true }), greedy);
  await assert.rejects(client.chat.completions.create({ ...base, xtc_probability: 2 }),
    (e) => e.status === 400 && (e.error?.param ?? e.param) === 'xtc_probability');
});

test('max_tokens absent: the generation runs to the context (no fixed 512); --max-tokens N sets a default; the card says null', async () => {
  const { writeScriptedModel } = await import('../support/scripted_model.mjs');
  const dir = mkdtempSync(join(tmpdir(), 'kettle-maxtok-'));
  await writeScriptedModel(dir, { pieces: ['Hi'], context: 700 });
  const open = await startServer([dir]);
  const capped = await startServer([dir, '--max-tokens', '9']);
  try {
    const c = new OpenAI({ baseURL: `${open.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 60000 });
    // ignore_eos keeps the scripted model going past its end token: only the context stops it.
    const r = await c.completions.create({ model: 'm', prompt: 'Count on', ignore_eos: true });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, 700);
    assert.ok(r.usage.completion_tokens > 512);
    assert.equal((await c.models.retrieve('m')).defaults.max_tokens, null);
    const d = new OpenAI({ baseURL: `${capped.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 60000 });
    const s = await d.completions.create({ model: 'm', prompt: 'Count on', ignore_eos: true });
    assert.equal(s.usage.completion_tokens, 9);
    assert.equal((await d.models.retrieve('m')).defaults.max_tokens, 9);
  } finally {
    stopServer(open);
    stopServer(capped);
    rmSync(dir, { recursive: true, force: true });
  }
});
