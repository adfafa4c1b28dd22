// The tokenizer parity corpus: one case per line (bytes, so invalid UTF-8 can be
// written) plus one multi-line document. writeCorpus() regenerates the files in
// tests/data/ so the C++ side and the reference read the very same bytes.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

const nfd = (s) => s.normalize('NFD');
const bytes = (...b) => Buffer.from(b);

// Each case is a string or a Buffer; none may contain '\n'.
export const corpusCases = [
  '',
  'Hello world',
  ' leading space',
  'trailing space ',
  '  two leading and two trailing  ',
  "I'm sure you'll see it's John's DOG'S; we've, they'd, I'LL, 'S 'T 'RE it'ſ",
  'The quick brown fox jumps over the lazy dog.',
  'HTTPServerError camelCaseWord snake_case_word ALLCAPS MiXeD',
  '你好，世界！我们今天去公园散步。',
  'こんにちは、世界。カタカナとひらがな、漢字を混ぜます。',
  '안녕하세요 세계, 반갑습니다',
  'مرحبا بالعالم، كيف حالك؟ ١٢٣ ٤٥٦',
  'नमस्ते दुनिया, आप कैसे हैं? ०१२३',
  'สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ',
  'Привет, мир! Съешь же ещё этих мягких французских булок.',
  'Γειά σου Κόσμε! ΟΔΥΣΣΕΥΣ ὀδυσσεύς',
  'שלום עולם',
  '👋🌍 😀😃😄 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵🇩🇪 👍🏽 ❤️ 🧑🏿‍🚀',
  '🇺🇸🇺🇸🇺🇸🇺🇸',
  '    def foo(x):\treturn x ** 2  # comment',
  '\t\tindented\twith\ttabs\t',
  'if (a && b) { return c[i] >= 0 ? x : y; } // done',
  '    for i in range(10):        print(i)',
  ' '.repeat(50) + 'x' + ' '.repeat(33),
  '\t'.repeat(20),
  ' '.repeat(7),
  'a\r\rb\r',
  'line with carriage return\r',
  '1234567890 3.14159 1,000,000 0x1F 1e-10 ²³ ½ ⅞ Ⅻ',
  '12345678901234567890123456789012345678901234567890',
  '2024-01-15T10:30:00Z +1 (555) 123-4567',
  '<|im_start|>system\nignored', // replaced below: no newlines in line cases
  '<|im_start|>user<|im_end|>',
  '<|im_start',
  '<bos>text<eos> <pad> <unk>',
  '<|begin_of_text|>hi<|eot_id|><|start_header_id|>',
  '<start_of_turn>user hello<end_of_turn>',
  '<｜begin▁of▁sentence｜>hello<｜end▁of▁sentence｜>',
  '<|endoftext|><|endoftext|>x',
  '<|startoftext|> <|return|> <|channel|>',
  '< |im_start| > <<|im_end|>> <|im_start|<|im_end|>',
  '<think>reasoning</think> <tool_call>',
  '<unused0> <start_of_image> <table><tr><td>x</td></tr></table>',
  'café naïve résumé Ångström',
  nfd('café naïve résumé Ångström'),
  '\u212B \u00C5 A\u030A',
  'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚o̙̔ͮ̇͐̇',
  'ﬁ ﬂ ｆｕｌｌｗｉｄｔｈ ①②③ ㎏',
  '∀x∈ℝ: x²≥0 ⇒ √x ∈ ℝ, ∑ᵢ aᵢ = π',
  'https://example.com/path?q=1&b=2#frag user@example.org',
  '!!!???...---*** ((([[[{{{}}}]]]))) ...',
  '\u00A0nbsp\u2003em\u3000ideographic\u200Bzwsp\u0085nel\u2028ls end',
  '\uFEFFbom at start',
  bytes(0x61, 0xff, 0x62),
  bytes(0xe2, 0x82, 0x20, 0x61),
  bytes(0xc0, 0xaf, 0x78),
  bytes(0xed, 0xa0, 0x80, 0x79),
  bytes(0xf4, 0x90, 0x80, 0x80, 0x7a),
  bytes(0x80, 0x80, 0x80),
  Buffer.concat([Buffer.from('prefix '), bytes(0xf0, 0x9f, 0x98), Buffer.from(' suffix')]),
  'a'.repeat(3000),
  'supercalifragilisticexpialidocious'.repeat(40),
  'ab'.repeat(1500),
  '的'.repeat(600),
  'Donaudampfschifffahrtsgesellschaftskapitänswitwe',
  'x'.repeat(10) + ' ' + '9'.repeat(100),
  '\u0000 null \u0001 control \u001f',
];
// Line cases cannot hold '\n'; keep the look-alike case without it.
corpusCases[corpusCases.indexOf('<|im_start|>system\nignored')] = '<|im_start|>system ignored';

export const multilineDocument = [
  '<|im_start|>system',
  'You are a helpful assistant.<|im_end|>',
  '',
  '',
  'def fib(n):',
  '    """Return the n-th Fibonacci number."""',
  '    if n < 2:',
  '        return n',
  '\treturn fib(n - 1) + fib(n - 2)   ',
  '\r',
  '\n\n\n',
  'Windows line\r',
  'trailing spaces   ',
  '   ',
  '中文段落。\n\n\nEnd.',
].join('\n') + '\n\n';

export function corpusBuffer() {
  const parts = [];
  for (const c of corpusCases) {
    const b = Buffer.isBuffer(c) ? c : Buffer.from(c, 'utf8');
    if (b.includes(0x0a)) throw new Error(`corpus case has a newline: ${JSON.stringify(c)}`);
    parts.push(b, Buffer.from('\n'));
  }
  return Buffer.concat(parts);
}

// Writes the corpus files and returns their paths.
export function writeCorpus(dataDir) {
  const corpus = `${dataDir}/tokenizer_corpus.txt`;
  const multiline = `${dataDir}/tokenizer_multiline.txt`;
  mkdirSync(dirname(corpus), { recursive: true });
  writeFileSync(corpus, corpusBuffer());
  writeFileSync(multiline, multilineDocument);
  return { corpus, multiline };
}

// The lines of a file as the CLI's --lines reads them: split on '\n', a final
// newline starts no line; each decoded as UTF-8 with U+FFFD for invalid bytes.
export function fileLines(buf) {
  const lines = [];
  let start = 0;
  while (start < buf.length) {
    let nl = buf.indexOf(0x0a, start);
    if (nl < 0) nl = buf.length;
    lines.push(buf.subarray(start, nl).toString('utf8'));
    start = nl + 1;
  }
  return lines;
}
