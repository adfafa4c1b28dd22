// Test support: writes a real Hugging Face llama model folder whose greedy
// output after the chat template's generation prompt is a fixed script, so the
// server's tool-call and <think> handling can be driven through the normal
// loading path (config.json, tokenizer.json, tokenizer_config.json,
// generation_config.json, model.safetensors).
//
// The model is a bigram machine: the next token depends only on the current one.
//   embed_tokens[t] = e_t (one-hot, hidden >= vocab), every layer's o_proj and
//   down_proj are zero, so the residual stream leaves the layers as exactly e_t;
//   lm_head[next(t)][t] = C, every other entry 0.
// Chain: "\n" (the byte token that ends "<|im_start|>assistant\n") -> pieces[0]
//   -> pieces[1] -> ... -> <|im_end|> (eos). Every other token -> <|im_end|>.
//
// Margin, as kettle computes it (f32, RMSNorm with eps from config.json):
//   final norm (weight 1): y = e_t / sqrt(mean(e_t^2) + eps) = e_t / sqrt(1/H + eps)
//   logits: z[next(t)] = C / sqrt(1/H + eps), z[j] = 0 for every other j.
//   With H >= 320, eps = 1e-5 and C = 8: z[next(t)] >= 8 * sqrt(320 / 1.0032) ~= 142.9,
//   so greedy picks next(t), and even sampling at temperature T picks anything else with
//   probability <= (V - 1) * exp(-142.9 / T) (< 1e-28 at T = 2). Every weight (0, 1, 8)
//   is exact in bf16, and the attention output is 0 whatever RoPE does (v and o are zero).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

// ---- presets ----------------------------------------------------------------

// Hermes format (Qwen-style): reasoning, then one tool call.
export const THINK_AND_CALL = [
  '<think>\n',
  'The user wants the weather in Paris.',
  '\n</think>\n\n',
  '<tool_call>\n',
  '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
  '\n</tool_call>',
];

// Hermes format: two tool calls in one turn, no reasoning.
export const PARALLEL_CALLS = [
  '<tool_call>\n',
  '{"name": "get_weather", "arguments": {"city": "Paris"}}',
  '\n</tool_call>\n<tool_call>\n',
  '{"name": "get_weather", "arguments": {"city": "London"}}',
  '\n</tool_call>',
];

// Llama 3 format: <|python_tag|> and a JSON call with "parameters".
export const LLAMA3_CALL = ['<|python_tag|>', '{"name": "get_weather", "parameters": {"city": "Paris"}}'];

// Plain answer after reasoning (either format).
export const THINK_AND_ANSWER = [
  '<think>\n',
  'The user says hi. I should greet them back.',
  '\n</think>\n\n',
  'Hello! How can I help you today?',
];

// ---- vocabulary ---------------------------------------------------------------

const ENDOFTEXT = '<|endoftext|>';
const IM_START = '<|im_start|>';
const IM_END = '<|im_end|>';
const MARKERS = [ENDOFTEXT, IM_START, IM_END];  // ids 256, 257, 258; pieces follow
const GENERATION_PROMPT_TAIL = 'assistant\n';    // after <|im_start|>; ends in the byte token "\n"

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest
// are shifted to U+0100 and up, so every byte is one visible character.
function byteToUnicode() {
  const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const map = [];
  let shifted = 0;
  for (let b = 0; b < 256; b++) map.push(String.fromCodePoint(printable(b) ? b : 256 + shifted++));
  return map;
}

function tokenizerJson(pieces) {
  const bytes = byteToUnicode();
  const vocab = Object.fromEntries(bytes.map((ch, id) => [ch, id]));
  const added = (id, content, special) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special,
  });
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      ...MARKERS.map((m, i) => added(256 + i, m, true)),
      ...pieces.map((p, i) => added(256 + MARKERS.length + i, p, false)),
    ],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [],
    },
  };
}

// ---- chat templates (ours; ChatML turns) -------------------------------------------

// Shared pieces of both flavours. `text` renders string content or OpenAI content parts.
const TEXT_MACRO = String.raw`{%- macro text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}`;

const PLAIN_SYSTEM = String.raw`{%- elif messages and messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' -}}{{- text(messages[0].content) -}}{{- '<|im_end|>\n' -}}
{%- endif -%}`;

const TURN_START = String.raw`{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if m.reasoning_content -%}{{- '<think>\n' + m.reasoning_content + '\n</think>\n\n' -}}{%- endif -%}
{{- text(m.content) -}}`;

const TURN_END = String.raw`{%- else -%}
{{- '<|im_start|>' + m.role + '\n' -}}{{- text(m.content) -}}{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}`;

const HERMES_TEMPLATE = [
  TEXT_MACRO,
  String.raw`{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) -}}{{- '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nThese functions can be called. Their signatures, one JSON object a line, are between <tools> and </tools>:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nTo call one, write its name and arguments as a JSON object between <tool_call> and </tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call><|im_end|>\n' -}}`,
  PLAIN_SYSTEM,
  TURN_START,
  String.raw`{%- for call in m.tool_calls or [] -%}
{%- if call.function -%}{%- set call = call.function -%}{%- endif -%}
{%- if m.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>tool\n<tool_response>\n' -}}{{- text(m.content) -}}{{- '\n</tool_response><|im_end|>\n' -}}`,
  TURN_END,
].join('\n');

const LLAMA3_TEMPLATE = [
  TEXT_MACRO,
  String.raw`{%- if tools -%}
{{- '<|im_start|>system\nEnvironment: ipython\n' -}}
{%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) -}}{{- '\n\n' -}}{%- endif -%}
{{- 'You have access to these functions (JSON definitions):\n' -}}
{%- for tool in tools -%}{{- tool | tojson(indent=4) -}}{{- '\n\n' -}}{%- endfor -%}
{{- 'To call one, answer with <|python_tag|> and then a JSON object {"name": function name, "parameters": object of argument values}.<|im_end|>\n' -}}`,
  PLAIN_SYSTEM,
  TURN_START,
  String.raw`{%- for call in m.tool_calls or [] -%}
{%- if call.function -%}{%- set call = call.function -%}{%- endif -%}
{%- if m.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<|python_tag|>{"name": "' + call.name + '", "parameters": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' or m.role == 'ipython' -%}
{{- '<|im_start|>ipython\n' -}}{{- text(m.content) -}}{{- '<|im_end|>\n' -}}`,
  TURN_END,
].join('\n');

export const CHAT_TEMPLATES = { hermes: HERMES_TEMPLATE, llama3: LLAMA3_TEMPLATE };

// ---- safetensors ---------------------------------------------------------------

// f32 -> bf16 bits, round to nearest even (the values used here are exact anyway).
function bf16Bits(x) {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0];
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

// tensors: [{ name, shape, values: Float32Array }] -> safetensors bytes (bf16):
// 8-byte little-endian header length, the JSON header (space-padded to 8 bytes), the data.
function safetensorsBytes(tensors) {
  const header = { __metadata__: { format: 'pt' } };
  let offset = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (t.values.length !== n) throw new Error(`${t.name}: ${t.values.length} values for shape ${t.shape}`);
    header[t.name] = { dtype: 'BF16', shape: t.shape, data_offsets: [offset, offset + 2 * n] };
    offset += 2 * n;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const headerBytes = Buffer.from(json, 'utf8');
  const out = Buffer.alloc(8 + headerBytes.length + offset);
  out.writeBigUInt64LE(BigInt(headerBytes.length), 0);
  headerBytes.copy(out, 8);
  let at = 8 + headerBytes.length;
  for (const t of tensors) {
    for (const v of t.values) { out.writeUInt16LE(bf16Bits(v), at); at += 2; }
  }
  return out;
}

// ---- the model folder ---------------------------------------------------------------

const LM_HEAD_SCALE = 8;  // C in the margin note above
const RMS_EPS = 1e-5;
const HEAD_DIM = 64;
const INTERMEDIATE = 64;

function checkPieces(pieces) {
  if (!Array.isArray(pieces) || pieces.length === 0) throw new Error('pieces: expected a non-empty array of strings');
  const seen = new Set();
  for (const p of pieces) {
    if (typeof p !== 'string' || p === '') throw new Error(`pieces: ${JSON.stringify(p)} is not a non-empty string`);
    if (seen.has(p)) throw new Error(`pieces: ${JSON.stringify(p)} appears twice; a bigram model needs distinct pieces`);
    seen.add(p);
    if (MARKERS.some((m) => p.includes(m))) throw new Error(`pieces: ${JSON.stringify(p)} contains a chat marker`);
    // A piece inside "assistant\n" would be split out of the generation prompt and
    // change its last token, which starts the chain.
    if (GENERATION_PROMPT_TAIL.includes(p))
      throw new Error(`pieces: ${JSON.stringify(p)} occurs in the generation prompt ${JSON.stringify(GENERATION_PROMPT_TAIL)}`);
  }
}

// Writes the model folder; returns what tests need to know about it.
export async function writeScriptedModel(dir, { pieces, format = 'hermes', context = 4096 } = {}) {
  checkPieces(pieces);
  const template = CHAT_TEMPLATES[format];
  if (!template) throw new Error(`format: expected one of ${Object.keys(CHAT_TEMPLATES).join(', ')}, got ${format}`);

  const ids = {
    endoftext: 256, imStart: 257, imEnd: 258, newline: 10,
    pieces: pieces.map((_, i) => 256 + MARKERS.length + i),
  };
  const vocab = 256 + MARKERS.length + pieces.length;
  const hidden = Math.max(320, Math.ceil(vocab / 64) * 64);  // >= vocab: one-hot embeddings fit

  const next = new Array(vocab).fill(ids.imEnd);
  next[ids.newline] = ids.pieces[0];
  for (let i = 0; i + 1 < pieces.length; i++) next[ids.pieces[i]] = ids.pieces[i + 1];

  const zeros = (...shape) => ({ shape, values: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
  const ones = (n) => ({ shape: [n], values: new Float32Array(n).fill(1) });
  const embed = zeros(vocab, hidden);    // [vocab, hidden]: row t = e_t
  const lmHead = zeros(vocab, hidden);   // [vocab, hidden]: row next(t) has C at column t
  for (let t = 0; t < vocab; t++) {
    embed.values[t * hidden + t] = 1;
    lmHead.values[next[t] * hidden + t] = LM_HEAD_SCALE;
  }
  const L = 'model.layers.0.';
  const tensors = [
    { name: 'lm_head.weight', ...lmHead },
    { name: 'model.embed_tokens.weight', ...embed },
    { name: `${L}input_layernorm.weight`, ...ones(hidden) },
    { name: `${L}mlp.down_proj.weight`, ...zeros(hidden, INTERMEDIATE) },
    { name: `${L}mlp.gate_proj.weight`, ...zeros(INTERMEDIATE, hidden) },
    { name: `${L}mlp.up_proj.weight`, ...zeros(INTERMEDIATE, hidden) },
    { name: `${L}post_attention_layernorm.weight`, ...ones(hidden) },
    { name: `${L}self_attn.k_proj.weight`, ...zeros(HEAD_DIM, hidden) },
    { name: `${L}self_attn.o_proj.weight`, ...zeros(hidden, HEAD_DIM) },
    { name: `${L}self_attn.q_proj.weight`, ...zeros(HEAD_DIM, hidden) },
    { name: `${L}self_attn.v_proj.weight`, ...zeros(HEAD_DIM, hidden) },
    { name: 'model.norm.weight', ...ones(hidden) },
  ];

  const config = {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    attention_bias: false,
    attention_dropout: 0.0,
    bos_token_id: ids.endoftext,
    eos_token_id: ids.imEnd,
    pad_token_id: ids.endoftext,
    dtype: 'bfloat16',
    head_dim: HEAD_DIM,
    hidden_act: 'silu',
    hidden_size: hidden,
    intermediate_size: INTERMEDIATE,
    max_position_embeddings: context,
    mlp_bias: false,
    num_attention_heads: 1,
    num_hidden_layers: 1,
    num_key_value_heads: 1,
    rms_norm_eps: RMS_EPS,
    rope_parameters: { rope_theta: 10000.0, rope_type: 'default' },
    tie_word_embeddings: false,
    vocab_size: vocab,
  };
  const generationConfig = {
    bos_token_id: ids.endoftext,
    eos_token_id: ids.imEnd,
    pad_token_id: ids.endoftext,
    do_sample: false,
  };
  const addedDecoder = {};
  tokenizerJson(pieces).added_tokens.forEach((t) => {
    addedDecoder[String(t.id)] = { content: t.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: t.special };
  });
  const tokenizerConfig = {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: addedDecoder,
    bos_token: ENDOFTEXT,
    eos_token: IM_END,
    pad_token: ENDOFTEXT,
    unk_token: null,
    clean_up_tokenization_spaces: false,
    model_max_length: 4096,
    tokenizer_class: 'PreTrainedTokenizerFast',
    chat_template: template,
  };

  mkdirSync(dir, { recursive: true });
  const write = (name, data) => writeFileSync(join(dir, name), data);
  write('config.json', JSON.stringify(config, null, 2) + '\n');
  write('generation_config.json', JSON.stringify(generationConfig, null, 2) + '\n');
  write('tokenizer.json', JSON.stringify(tokenizerJson(pieces), null, 1) + '\n');
  write('tokenizer_config.json', JSON.stringify(tokenizerConfig, null, 2) + '\n');
  write('model.safetensors', safetensorsBytes(tensors));
  return {
    dir,
    format,
    pieces: [...pieces],
    text: pieces.join(''),
    ids,
    vocabSize: vocab,
    chatTemplate: template,
    specialTokens: { bos_token: ENDOFTEXT, eos_token: IM_END, pad_token: ENDOFTEXT },
  };
}
