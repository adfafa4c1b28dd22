// Speculative decoding as clients meet it (--draft-kind ngram | model): the official
// clients get the same text as from a server without drafts, greedy and seeded,
// alone and concurrently; usage carries speculation {drafted, accepted} in the
// OpenAI and Anthropic APIs; /stats and /metrics report acceptance; bad flags are
// refused by name at start.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { freePort, kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const draftModel = new URL('../../models/kettle-demo-draft', import.meta.url).pathname;
const otherVocabulary = new URL('../data/goldens/llama/model', import.meta.url).pathname;
let plain, ngram, drafted;
before(async () => {
  [plain, ngram, drafted] = await Promise.all([
    startServer(['--batch', '4']),
    startServer(['--batch', '4', '--draft-kind', 'ngram']),
    startServer(['--batch', '4', '--draft-kind', 'model', '--draft-model', draftModel, '--num-draft-tokens', '4']),
  ]);
});
after(() => { stopServer(plain); stopServer(ngram); stopServer(drafted); });

const openai = (s) => new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'x', maxRetries: 0 });
// Repetitive text: prompt lookup finds its n-grams.
const prompts = [
  'In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. In the beginning God created',
  'The kettle is a vessel for boiling water. The kettle is a vessel for',
  'Once upon a time there was a little cat. Once upon a time',
];

test('greedy and seeded completions equal those of a server without drafts; usage reports the drafts', async () => {
  for (const temperature of [0, 0.8]) {
    for (const prompt of prompts) {
      const body = { model: 'kettle-demo', prompt, max_tokens: 48, temperature, seed: 11 };
      const want = await openai(plain).completions.create(body);
      assert.equal(want.usage.speculation, undefined, 'a server without drafts reports none');
      for (const server of [ngram, drafted]) {
        const got = await openai(server).completions.create(body);
        assert.equal(got.choices[0].text, want.choices[0].text, `${prompt.slice(0, 30)} at ${temperature}`);
        const s = got.usage.speculation;
        assert.ok(Number.isInteger(s.drafted) && Number.isInteger(s.accepted) && s.accepted <= s.drafted, JSON.stringify(s));
      }
    }
  }
});

test('concurrent streams under speculation each get the text they get alone', async () => {
  const ask = (s, prompt) => openai(s).chat.completions.create({
    model: 'kettle-demo', messages: [{ role: 'user', content: prompt }], max_tokens: 40, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  const collect = async (stream) => {
    let text = '', usage = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    return { text, usage };
  };
  const alone = [];
  for (const p of prompts) alone.push((await collect(await ask(plain, p))).text);
  for (const server of [ngram, drafted]) {
    const together = await Promise.all(prompts.map(async (p) => collect(await ask(server, p))));
    together.forEach((r, i) => {
      assert.equal(r.text, alone[i], `stream ${i}`);
      assert.ok(r.usage.speculation && r.usage.speculation.drafted >= 0, JSON.stringify(r.usage));
    });
  }
});

test('the Anthropic API carries usage.speculation too; /stats and /metrics count drafts and acceptance', async () => {
  const anthropic = new Anthropic({ baseURL: ngram.base, apiKey: 'x', maxRetries: 0 });
  const message = await anthropic.messages.create({
    model: 'kettle-demo', max_tokens: 32, messages: [{ role: 'user', content: prompts[1] }], temperature: 0,
  });
  assert.ok(message.usage.speculation && message.usage.speculation.accepted <= message.usage.speculation.drafted);
  const stats = (await (await fetch(`${ngram.base}/stats`)).json()).speculation;
  assert.equal(stats.kind, 'ngram');
  assert.equal(stats.max_drafts, 10);
  assert.ok(stats.drafted > 0 && stats.accepted > 0 && stats.accepted <= stats.drafted, JSON.stringify(stats));
  assert.ok(stats.tokens_per_verify >= 1, JSON.stringify(stats));
  const metrics = await (await fetch(`${ngram.base}/metrics`)).text();
  const value = (name) => Number(metrics.match(new RegExp(`^${name}\\{[^}]*\\} (\\d+)`, 'm'))?.[1]);
  assert.equal(value('kettle_speculation_drafted_tokens_total'), stats.drafted);
  assert.equal(value('kettle_speculation_accepted_tokens_total'), stats.accepted);
  assert.equal((await (await fetch(`${plain.base}/stats`)).json()).speculation.kind, 'none');
});

test('speculation flags are refused by name where they do not apply', async () => {
  const port = String(await freePort());
  const refuse = (args, pattern) => {
    const r = spawnSync(kettle, ['serve', '--port', port, '--no-open', ...args], { encoding: 'utf8', timeout: 30000 });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, pattern);
  };
  refuse(['--draft-kind', 'eagle'], /--draft-kind 'eagle'/);
  refuse(['--draft-kind', 'model'], /--draft-kind model needs --draft-model/);
  refuse(['--draft-model', draftModel], /--draft-model is used by --draft-kind model only/);
  refuse(['--ngram-max', '4'], /--ngram-max goes with --draft-kind ngram/);
  refuse(['--num-draft-tokens', '4'], /--num-draft-tokens goes with --draft-kind/);
  refuse(['--draft-kind', 'ngram', '--ngram-min', '3', '--ngram-max', '2'], /--ngram-min 3/);
  refuse(['--draft-kind', 'model', '--draft-model', otherVocabulary], /a vocabulary of 512 ids, the model's has 4096/);
  const gen = spawnSync(kettle, ['generate', '-p', 'The kettle is a vessel. The kettle is', '-n', '24', '--seed', '5', '--draft-kind', 'ngram', '--json'],
    { encoding: 'utf8', timeout: 60000 });
  assert.equal(gen.status, 0, gen.stderr);
  const j = JSON.parse(gen.stdout);
  const base = JSON.parse(spawnSync(kettle, ['generate', '-p', 'The kettle is a vessel. The kettle is', '-n', '24', '--seed', '5', '--json'],
    { encoding: 'utf8', timeout: 60000 }).stdout);
  assert.equal(j.text, base.text);
  assert.ok(j.speculation.drafted >= j.speculation.accepted);
  assert.equal(base.speculation, null);
});
