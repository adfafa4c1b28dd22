// The prefix cache (--prompt-cache, on by default): a request that shares a
// long prefix with an earlier one (the next turn of a chat, a shared system
// prompt) reports prompt_tokens_details.cached_tokens (OpenAI) or
// cache_read_input_tokens (Anthropic), and its tokens equal those of a server
// with the cache off (--prompt-cache 0).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { startServer, stopServer } from '../support/kettle_server.mjs';

let cached, plain;
before(async () => { cached = await startServer(); plain = await startServer(['--prompt-cache', '0']); });
after(() => { stopServer(cached); stopServer(plain); });

const openai = (s) => new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'x', maxRetries: 0 });
const system = 'You are a careful assistant for a dictionary project. ' +
  'Answer with the definition as the dictionary gives it, then one example sentence. '.repeat(4);
const ask = (s, messages, extra = {}) => openai(s).chat.completions.create({ messages, max_tokens: 16, temperature: 0, ...extra });

test('a multi-turn chat reuses the previous turn; tokens equal the uncached server\'s', async () => {
  const turn1 = [{ role: 'system', content: system }, { role: 'user', content: 'What is a kettle?' }];
  const a1 = await ask(cached, turn1);
  const b1 = await ask(plain, turn1);
  assert.equal(a1.choices[0].message.content, b1.choices[0].message.content);
  assert.equal(b1.usage.prompt_tokens_details.cached_tokens, 0);
  const turn2 = [...turn1, { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'And a teapot?' }];
  const a2 = await ask(cached, turn2);
  const b2 = await ask(plain, turn2);
  assert.equal(a2.choices[0].message.content, b2.choices[0].message.content);
  assert.equal(a2.usage.prompt_tokens, b2.usage.prompt_tokens);
  const hit = a2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(hit >= a1.usage.prompt_tokens - 16 && hit < a2.usage.prompt_tokens, `cached ${hit} of ${a2.usage.prompt_tokens}`);
  assert.equal(hit % 16, 0);
  assert.equal(b2.usage.prompt_tokens_details.cached_tokens, 0);
});

test('a shared system prompt is reused across conversations, streamed usage too; /stats counts hits', async () => {
  const before = (await (await fetch(`${cached.base}/stats`)).json()).prefix_cache;
  for (const question of ['What is a spoon?', 'What is a fork?']) {
    const messages = [{ role: 'system', content: system }, { role: 'user', content: question }];
    const stream = await openai(cached).chat.completions.create(
      { messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = '', usage = null;
    for await (const c of stream) { text += c.choices[0]?.delta?.content ?? ''; usage = c.usage ?? usage; }
    const reference = await ask(plain, messages, { max_tokens: 8 });
    assert.equal(text, reference.choices[0].message.content);
    assert.ok(usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(usage));
  }
  const after = (await (await fetch(`${cached.base}/stats`)).json()).prefix_cache;
  assert.equal(after.hits - before.hits, 2);
  assert.ok(after.entries >= 1 && after.bytes > 0 && after.bytes <= after.capacity_bytes);
  assert.equal((await (await fetch(`${plain.base}/stats`)).json()).prefix_cache.capacity_bytes, 0);
});

test('Anthropic usage splits input_tokens and cache_read_input_tokens', async () => {
  const client = new Anthropic({ baseURL: cached.base, apiKey: 'x', maxRetries: 0 });
  const body = { model: 'default', max_tokens: 4, temperature: 0, system: `(Anthropic) ${system}`, messages: [{ role: 'user', content: 'What is a cup?' }] };
  const first = await client.messages.create(body);
  const second = await client.messages.create(body);
  assert.deepEqual(second.content, first.content);
  assert.equal(second.usage.input_tokens + second.usage.cache_read_input_tokens,
    first.usage.input_tokens + first.usage.cache_read_input_tokens);
  assert.equal(first.usage.cache_read_input_tokens, 0);
  assert.ok(second.usage.cache_read_input_tokens >= 64, JSON.stringify(second.usage));
  assert.ok(second.usage.input_tokens >= 1);
});

test('POST /admin/cache/clear empties the cache: the next shared prompt is a miss', async () => {
  const messages = [{ role: 'system', content: system }, { role: 'user', content: 'What is a plate?' }];
  await ask(cached, messages, { max_tokens: 2 });
  // Without a disk tier (--ssd-cache) nothing cached is durable: the barrier says so.
  const barrier = await fetch(`${cached.base}/admin/cache/flush`, { method: 'POST' });
  assert.equal(barrier.status, 503);
  const report = await barrier.json();
  assert.equal(report.durable, false);
  assert.ok(report.not_on_disk >= 1, JSON.stringify(report));
  const flush = await (await fetch(`${cached.base}/admin/cache/clear`, { method: 'POST' })).json();
  assert.ok(flush.cleared_entries >= 1, JSON.stringify(flush));
  assert.equal((await (await fetch(`${cached.base}/stats`)).json()).prefix_cache.entries, 0);
  const r = await ask(cached, messages, { max_tokens: 2 });
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

test('a running request lends its prompt blocks: a concurrent one shares them (fan-out); /stats shows KV blocks', async () => {
  const messages = (q) => [{ role: 'system', content: `(fan-out) ${system}` }, { role: 'user', content: q }];
  // The first request streams long; once its first token arrives its prompt is prefilled and lent.
  const first = await openai(cached).chat.completions.create(
    { messages: messages('What is a kettle?'), max_tokens: 200, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } });
  const it = first[Symbol.asyncIterator]();
  while (!(await it.next()).value.choices[0]?.delta?.content) { /* the role chunk comes before the prefill */ }
  const during = (await (await fetch(`${cached.base}/stats`)).json());
  assert.equal(during.requests.running, 1);
  assert.ok(during.kv.blocks_used > 0 && during.kv.block_size === 16, JSON.stringify(during.kv));
  const second = await ask(cached, messages('What is a pan?'));
  const still = (await (await fetch(`${cached.base}/stats`)).json()).requests.running;
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(second.usage));
  const reference = await ask(plain, messages('What is a pan?'));
  assert.equal(second.choices[0].message.content, reference.choices[0].message.content);
  let n = 0;
  for (let r = await it.next(); !r.done; r = await it.next()) n += r.value.choices[0]?.delta?.content ? 1 : 0;
  assert.ok(still >= 1 || n > 0, 'the first request was still running when the second was served');
});
