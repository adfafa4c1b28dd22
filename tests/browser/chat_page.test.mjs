// The built-in chat page (web/index.html, served at GET /) in Debian's headless
// Chromium, driven by playwright-core, against the real `kettle serve` with the
// bundled demo model on a free loopback port: a streamed answer, the speed and
// model shown, the conversation restored after a reload, and Stop mid-stream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

import { sleep, startServer, stopServer } from '../support/kettle_server.mjs';
import { writeScriptedModel, THINK_AND_ANSWER } from '../support/scripted_model.mjs';

const chromiumPath = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium';

let server;
let browser;
let page;
before(async () => {
  server = await startServer();
  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    timeout: 30000,
  });
  page = await browser.newPage();
  page.setDefaultTimeout(30000);
});
after(async () => {
  await browser?.close().catch(() => {});
  stopServer(server);
});

const idle = () => page.waitForSelector('body[data-state="idle"]', { state: 'attached', timeout: 60000 });
const assistantTexts = () => page.locator('.msg.assistant .answer').allInnerTexts();

test('GET / serves the page as HTML', async () => {
  const res = await fetch(`${server.base}/`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/html; charset=utf-8');
  const html = await res.text();
  assert.match(html, /^<!doctype html>/i);
  assert.doesNotMatch(html, /<(script|link)[^>]+(src|href)=["']?https?:/i);  // self-contained
});

test('a question streams an answer; model id and tok/s are shown', async () => {
  await page.goto(`${server.base}/`);
  await page.evaluate(() => localStorage.clear());
  await page.reload();
  await page.locator('#model').filter({ hasText: 'kettle-demo' }).waitFor();
  assert.ok(await page.locator('#stop').isDisabled());
  await page.fill('#temperature', '0');
  await page.fill('#input', 'What does water mean?');
  await page.click('#send');
  await page.waitForSelector('body[data-state="streaming"]', { state: 'attached', timeout: 10000 }).catch(() => {});  // may be done
  await idle();
  assert.ok(await page.locator('#stop').isDisabled());
  const [answer] = await assistantTexts();
  assert.ok(answer.trim().length > 0, 'the assistant message is empty');
  assert.match(answer, /water/i);
  assert.equal(await page.locator('.msg.user').innerText(), 'What does water mean?');
  const speed = await page.locator('#speed').innerText();
  assert.match(speed, /^\d+(\.\d+)? tok\/s$/);
  assert.ok(parseFloat(speed) > 0, speed);
  await page.screenshot({ path: join(tmpdir(), 'kettle-chat-page.png'), fullPage: true });
});

test('reloading restores the conversation from localStorage', async () => {
  const before = await assistantTexts();
  await page.reload();
  await page.locator('.msg.user').first().waitFor();
  assert.equal(await page.locator('.msg.user').innerText(), 'What does water mean?');
  assert.deepEqual(await assistantTexts(), before);
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('kettle.chat.v1')));
  assert.deepEqual(stored.map((m) => m.role), ['user', 'assistant']);
});

test('Stop ends a long stream and disables itself', async () => {
  // Make this one generation long: no end of sequence (max_tokens: the server's default, what the context leaves).
  await page.route('**/v1/chat/completions', (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
  await page.fill('#input', 'Tell me a very long story about water.');
  await page.click('#send');
  await page.waitForSelector('body[data-state="streaming"]', { state: 'attached', timeout: 10000 });
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2
    && document.querySelectorAll('.msg.assistant')[1].textContent.length > 20, null, { timeout: 30000 });
  assert.ok(await page.locator('#stop').isEnabled());
  await page.click('#stop');
  await idle();
  assert.ok(await page.locator('#stop').isDisabled());
  assert.ok(await page.locator('#send').isEnabled());
  const last = page.locator('.msg.assistant').last();
  assert.match(await last.innerText(), /\(stopped\)/);
  // The abort reaches the server: it cancels the generation.
  for (let i = 0; i < 50 && !/generation cancelled/.test(server.stderr); i++) await sleep(100);
  assert.match(server.stderr, /generation cancelled/);
  await page.unroute('**/v1/chat/completions');
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('kettle.chat.v1')));
  assert.equal(stored.length, 4);
  assert.equal(stored[3].stopped, true);
});

test('New chat clears the conversation and its storage', async () => {
  await page.click('#new-chat');
  assert.equal(await page.locator('.msg').count(), 0);
  assert.equal(await page.evaluate(() => localStorage.getItem('kettle.chat.v1')), null);
  await page.reload();
  assert.equal(await page.locator('.msg').count(), 0);
});

test('markdown is rendered from escaped text; <think> goes in a collapsed <details>', async () => {
  const content = '<think>plan **it**</think>Hi <img src=x onerror="window.pwned=1"> **bold** *it* `a<b`\n\n'
    + '- one\n- [two](http://x.test)\n\n```\n<script>window.pwned=1</script>\n```';
  await page.evaluate((c) => localStorage.setItem('kettle.chat.v1',
    JSON.stringify([{ role: 'user', content: 'x' }, { role: 'assistant', content: c }])), content);
  await page.reload();
  const msg = page.locator('.msg.assistant');
  await msg.waitFor();
  assert.equal(await msg.locator('img, script').count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  assert.equal(await msg.locator('.answer strong').innerText(), 'bold');
  assert.equal(await msg.locator('.answer em').innerText(), 'it');
  assert.equal(await msg.locator('.answer p code').innerText(), 'a<b');
  assert.deepEqual(await msg.locator('li').allInnerTexts(), ['one', 'two (http://x.test)']);
  assert.equal(await msg.locator('pre code').innerText(), '<script>window.pwned=1</script>');
  assert.equal(await msg.locator('details.think').getAttribute('open'), null);
  assert.match(await msg.locator('details.think').textContent(), /plan it/);
  await page.click('#new-chat');
});

test('a reasoning model\'s reasoning_content streams into the collapsed Thoughts, the answer beside it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kettle-think-'));
  const own = await (async () => {
    await writeScriptedModel(dir, { pieces: THINK_AND_ANSWER, format: 'hermes' });
    return startServer([dir]);
  })();
  try {
    await page.goto(`${own.base}/`);
    await page.evaluate(() => localStorage.clear());
    await page.reload();
    await page.fill('#input', 'Hi');
    await page.click('#send');
    await idle();
    const msg = page.locator('.msg.assistant');
    assert.equal(await msg.locator('details.think').getAttribute('open'), null);
    assert.equal((await msg.locator('details.think').textContent()).replace(/^Thoughts/, '').trim(), THINK_AND_ANSWER[1]);
    assert.equal((await msg.locator('.answer').innerText()).trim(), THINK_AND_ANSWER[3]);
    await page.reload();  // kept in the conversation, reasoning included
    await page.locator('.msg.assistant details.think').waitFor();
    assert.equal((await page.locator('.msg.assistant .answer').innerText()).trim(), THINK_AND_ANSWER[3]);
  } finally {
    stopServer(own);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a server with --api-key: the page asks for the key once, then chats with it', async () => {
  const key = 'sk-page-test-42';
  const keyed = await startServer(['--api-key', key]);
  const own = await browser.newPage();
  own.setDefaultTimeout(30000);
  const asked = [];
  own.on('dialog', async (dialog) => { asked.push(dialog.message()); await dialog.accept(key); });
  try {
    await own.goto(`${keyed.base}/`);
    await own.locator('#model').filter({ hasText: 'kettle-demo' }).waitFor();
    assert.equal(asked.length, 1);
    assert.match(asked[0], /API key/);
    await own.fill('#temperature', '0');
    await own.fill('#input', 'What does water mean?');
    await own.click('#send');
    await own.waitForSelector('body[data-state="idle"]', { state: 'attached', timeout: 60000 });
    const answers = await own.locator('.msg.assistant .answer').allInnerTexts();
    assert.ok(answers.at(-1).trim().length > 0);
    assert.doesNotMatch(answers.at(-1), /Error/);
    await own.reload();  // the key is kept: no second question
    await own.locator('#model').filter({ hasText: 'kettle-demo' }).waitFor();
    assert.equal(asked.length, 1);
  } finally {
    await own.close().catch(() => {});
    stopServer(keyed);
  }
});
