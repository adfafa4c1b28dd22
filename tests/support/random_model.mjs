// Test support: a model folder whose weights are random (the tiny qwen3 golden
// checkpoint, vocabulary 512) under a real byte-level BPE tokenizer (the demo
// model's, cut to its first 512 ids and the merges that make them) and a chat
// template. Its output is noise: only a token mask can make it follow a grammar,
// which is what the constrained-decoding tests need.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const testsDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const golden = join(testsDir, 'data/goldens/qwen3/model');
const demo = join(testsDir, '../models/kettle-demo');

// The demo tokenizer with ids < vocab only: BPE merges apply in order, so the first
// merges make exactly the tokens kept.
function truncatedTokenizer(vocab) {
  const t = JSON.parse(readFileSync(join(demo, 'tokenizer.json'), 'utf8'));
  t.model.vocab = Object.fromEntries(Object.entries(t.model.vocab).filter(([, id]) => id < vocab));
  t.model.merges = t.model.merges.filter((m) => {
    const [a, b] = Array.isArray(m) ? m : m.split(' ');
    const id = t.model.vocab[a + b];
    return id !== undefined;
  });
  t.added_tokens = t.added_tokens.filter((a) => a.id < vocab);
  return t;
}

// weights: another checkpoint of the golden's shape (a quantized layout of it, say) whose
// config.json and model.safetensors are used instead.
export function writeRandomModel(dir, { template, weights = golden } = {}) {
  mkdirSync(dir, { recursive: true });
  const config = JSON.parse(readFileSync(join(weights, 'config.json'), 'utf8'));
  copyFileSync(join(weights, 'model.safetensors'), join(dir, 'model.safetensors'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, eos_token_id: 2, bos_token_id: null }));
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [2, 0], pad_token_id: 0 }));
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(truncatedTokenizer(config.vocab_size)));
  const tokenizerConfig = JSON.parse(readFileSync(join(demo, 'tokenizer_config.json'), 'utf8'));
  const chatTemplate = template ?? readFileSync(join(demo, 'chat_template.jinja'), 'utf8');
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...tokenizerConfig, chat_template: chatTemplate }));
}
