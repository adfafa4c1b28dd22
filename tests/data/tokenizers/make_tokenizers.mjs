// Writes the small hand-made tokenizer.json files the C++ unit tests load, one
// per component family, and expected.json: the ids and decodes that the native
// Hugging Face tokenizers produce for each case (the independent reference).
// Run from tests/: node data/tokenizers/make_tokenizers.mjs
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('@anush008/tokenizers');
const here = dirname(fileURLToPath(import.meta.url));

// GPT-2's byte → char table.
function byteChars() {
  const out = [];
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out.push(String.fromCodePoint(printable ? b : next++));
  }
  return out;
}

function bpe(vocabList, merges, extra = {}) {
  const vocab = {};
  for (const t of vocabList) if (!(t in vocab)) vocab[t] = Object.keys(vocab).length;
  for (const [a, b] of merges) {
    const m = a + b.replace(/^##/, '');
    if (!(m in vocab)) vocab[m] = Object.keys(vocab).length;
  }
  return { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges, ...extra };
}

const added = (id, content, o = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
                                          normalized: false, special: true, ...o });

function file(model, { normalizer = null, pre_tokenizer = null, post_processor = null, decoder = null, added_tokens = [] }) {
  return { version: '1.0', truncation: null, padding: null, added_tokens, normalizer, pre_tokenizer, post_processor,
           decoder, model };
}

function addedIds(model, tokens) {
  let next = Object.keys(model.vocab).length;
  return tokens.map(([content, o]) => added(next++, content, o));
}

// --- byte-level (GPT-2 / Llama 3 style) --------------------------------------
const chars = byteChars();
const blMerges = [['Ġ', 'w'], ['o', 'r'], ['Ġw', 'or'], ['l', 'd'], ['Ġwor', 'ld'], ['h', 'e'], ['l', 'l'],
                  ['he', 'll'], ['hell', 'o'], ['Ġ', 'Ġ'], ['ĠĠ', 'ĠĠ'], ['1', '2'], ['12', '3']];
const blModel = bpe(chars, blMerges);
const blAdded = addedIds(blModel, [['<s>', {}], ['</s>', {}], ['<mask>', { lstrip: true, rstrip: true }],
                                   ['word', { special: false, normalized: true, single_word: true }],
                                   ['<tool>', { special: false }]]);
const files = {
  byte_level: file(blModel, {
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' }] },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } },
                      { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
                      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
                      special_tokens: { '<s>': { id: '<s>', ids: [blAdded[0].id], tokens: ['<s>'] },
                                        '</s>': { id: '</s>', ids: [blAdded[1].id], tokens: ['</s>'] } } },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    added_tokens: blAdded,
  }),
};

// --- SentencePiece-style (Llama 2 / Gemma style): byte fallback, unk ---------
const spBytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
const spModel = bpe(['<unk>', '<s>', '</s>', ...spBytes, '▁', 'a', 'b', 'c', 'h', 'e', 'l', 'o', 'é'],
                    [['▁', 'h'], ['e', 'l'], ['▁h', 'el'], ['l', 'o'], ['▁hel', 'lo'], ['a', 'b'], ['▁', '▁']],
                    { unk_token: '<unk>', byte_fallback: true, fuse_unk: true });
files.sentencepiece = file(spModel, {
  normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' },
                                               { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
  post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } },
                    { Sequence: { id: 'A', type_id: 0 } }], pair: [{ Sequence: { id: 'A', type_id: 0 } }],
                    special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
  decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
                                          { type: 'ByteFallback' }, { type: 'Fuse' },
                                          { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
  added_tokens: [added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')],
});

// --- unk without byte fallback, fused and not -------------------------------
const unkModel = (fuse) => bpe(['<unk>', '▁', 'a', 'b', '1', '2'], [['▁', 'a'], ['a', 'b']],
                               { unk_token: '<unk>', fuse_unk: fuse });
for (const [name, fuse] of [['unk_fused', true], ['unk_unfused', false]]) {
  files[name] = file(unkModel(fuse), {
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true },
      { type: 'Digits', individual_digits: true }] },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true },
    added_tokens: [added(0, '<unk>'), { ...added(6, '<sep>'), id: Object.keys(unkModel(fuse).vocab).length }],
  });
}

// --- Split behaviours and the simple pre-tokenizers over a char-level model --
const letters = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.!?-_\'"éü';
const charVocab = [...letters];
const charModel = bpe(['[UNK]', ...charVocab], [['a', 'b'], ['ab', 'c'], ['1', '2']], { unk_token: '[UNK]' });
const behaviors = ['Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous'];
for (const behavior of behaviors) {
  for (const invert of [false, true]) {
    files[`split_${behavior.toLowerCase()}${invert ? '_invert' : ''}`] = file(charModel, {
      pre_tokenizer: { type: 'Split', pattern: { Regex: '[,!?]+| ' }, behavior, invert },
      added_tokens: [added(0, '[UNK]')],
    });
  }
}
files.whitespace = file(charModel, { pre_tokenizer: { type: 'Whitespace' }, added_tokens: [added(0, '[UNK]')] });
files.whitespace_split = file(charModel, { pre_tokenizer: { type: 'WhitespaceSplit' }, added_tokens: [added(0, '[UNK]')] });
files.punctuation = file(charModel, { pre_tokenizer: { type: 'Punctuation', behavior: 'Contiguous' },
                                      added_tokens: [added(0, '[UNK]')] });
files.digits_contiguous = file(charModel, { pre_tokenizer: { type: 'Digits', individual_digits: false },
                                            added_tokens: [added(0, '[UNK]')] });
files.normalizers = file(charModel, {
  normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'StripAccents' }, { type: 'Strip', strip_left: true, strip_right: true },
                                               { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }, { type: 'NFC' }] },
  pre_tokenizer: { type: 'WhitespaceSplit' },
  added_tokens: [added(0, '[UNK]')],
});
// Word-piece-like decorations on a BPE model.
const subModel = bpe(['[UNK]', ...charVocab, ...charVocab.map((c) => '##' + c), 'c</w>', '##c</w>', 'b</w>', '##b</w>'],
                     [['a', '##b'], ['ab', '##c</w>']],
                     { unk_token: '[UNK]', continuing_subword_prefix: '##', end_of_word_suffix: '</w>' });
files.subword_affixes = file(subModel, { pre_tokenizer: { type: 'Whitespace' }, added_tokens: [added(0, '[UNK]')] });

const cases = {
  byte_level: ['Hello world', 'hello  world 123', 'HELLO <mask>  world', 'a<mask>b', 'word words sword word.',
               'Ｈｅｌｌｏ ＷＯＲＬＤ', 'x<s>y</s>', '<tool>hello', 'ΣΑΣ', 'caf\u00e9 e\u0301 😀', '   ', ''],
  sentencepiece: ['hello', 'hello hello', 'abc', 'é', 'ü😀 x', '  hello', 'zzz', '<s>hello</s>', ''],
  unk_fused: ['ab zz 12', 'xyz', 'a b', 'zz<sep>zz', ''],
  unk_unfused: ['ab zz 12', 'xyz', 'a b', 'zz<sep>zz', ''],
  whitespace: ["hello, world! it's_ok ", 'a  b\tc'],
  whitespace_split: ['hello, world!  ok\t\tfine '],
  punctuation: ['hello,, world!? "ok"'],
  digits_contiguous: ['abc123def4 5'],
  normalizers: ['  Caf\u00e9   na\u00efve  ', '\u00fc\u00e9'],
  subword_affixes: ['abc abd c ab', 'bc'],
};
for (const behavior of behaviors)
  for (const invert of [false, true])
    cases[`split_${behavior.toLowerCase()}${invert ? '_invert' : ''}`] = ['hello, world!? ok,,x', ',,a b!', 'abc'];

const expected = [];
for (const [name, json] of Object.entries(files)) {
  const path = `${here}/${name}.json`;
  writeFileSync(path, JSON.stringify(json, null, 1) + '\n');
  const tok = Tokenizer.fromFile(path);
  for (const text of cases[name]) {
    const withSpecial = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
    const without = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    expected.push({ file: `${name}.json`, text, ids: withSpecial, ids_no_special: without,
                    decoded: await tok.decode(withSpecial, false), decoded_skip_special: await tok.decode(withSpecial, true) });
  }
}
writeFileSync(`${here}/expected.json`, JSON.stringify(expected, null, 1) + '\n');
console.log(`${Object.keys(files).length} tokenizers, ${expected.length} cases`);
