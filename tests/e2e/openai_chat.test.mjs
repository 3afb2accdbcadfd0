// OpenAI Chat Completions and Completions through the official `openai` npm client against the real
// server and the demo model (greedy decoding, so runs are reproducible).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, modelName } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv.stop(); });

const messages = [
  { role: 'system', content: 'You write Python.' },
  { role: 'user', content: 'Write a function that reverses a string.' },
];

test('chat: non-streaming body', async () => {
  const r = await srv.openai.chat.completions.create({ model: modelName, messages, max_tokens: 24, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, modelName);
  assert.ok(Number.isInteger(r.created));
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 10);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat: streaming equals non-streaming (greedy), usage chunk with include_usage', async () => {
  const body = { model: modelName, messages, max_tokens: 32, temperature: 0 };
  const whole = await srv.openai.chat.completions.create(body);
  const stream = await srv.openai.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (first) {
      assert.equal(chunk.choices[0].delta.role, 'assistant');
      first = false;
    }
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.usage, null);
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('chat: the stream helper assembles the same message', async () => {
  const body = { model: modelName, messages, max_tokens: 20, temperature: 0 };
  const whole = await srv.openai.chat.completions.create(body);
  const final = await srv.openai.chat.completions.stream(body).finalChatCompletion();
  assert.equal(final.choices[0].message.content, whole.choices[0].message.content);
});

test('chat: stop strings cut the text and end with finish_reason stop', async () => {
  const body = { model: modelName, messages, max_tokens: 40, temperature: 0 };
  const whole = (await srv.openai.chat.completions.create(body)).choices[0].message.content;
  assert.ok(whole.length >= 6, `need some text to cut: ${JSON.stringify(whole)}`);
  // Stop at the 2nd-6th characters of the greedy output: the reply must be exactly what preceded them.
  const stop = whole.slice(2, 6);
  const expected = whole.slice(0, whole.indexOf(stop));
  const r = await srv.openai.chat.completions.create({ ...body, stop: [stop] });
  assert.equal(r.choices[0].message.content, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let streamed = '';
  for await (const c of await srv.openai.chat.completions.create({ ...body, stop, stream: true })) {
    streamed += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(streamed, expected);
});

test('chat: tools and thinking are accepted and the answer is well-formed', async () => {
  // A tiny code model does not reliably call tools or think; this proves the request shapes are
  // accepted and the response is a valid completion. The mapping of real tool-call / reasoning events
  // is covered by tests/unit/protocol with parser events.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await srv.openai.chat.completions.create({
    model: modelName, max_tokens: 16, temperature: 0, tools, tool_choice: 'auto', reasoning_effort: 'high',
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '18C and sunny' },
    ],
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  for (const tc of r.choices[0].message.tool_calls ?? []) {
    assert.equal(tc.type, 'function');
    JSON.parse(tc.function.arguments);
  }
  const s = srv.openai.chat.completions.stream({ model: modelName, max_tokens: 16, temperature: 0, tools,
    messages: [{ role: 'user', content: 'Weather in Paris?' }] });
  const final = await s.finalChatCompletion();
  assert.equal(final.choices.length, 1);
});

test('completions: text prompt, streaming equals non-streaming', async () => {
  const body = { model: modelName, prompt: 'def fibonacci(n):\n', max_tokens: 24, temperature: 0 };
  const whole = await srv.openai.completions.create(body);
  assert.equal(whole.object, 'text_completion');
  assert.match(whole.id, /^cmpl-/);
  assert.ok(whole.choices[0].text.length > 0);
  let text = '';
  let usage = null;
  for await (const c of await srv.openai.completions.create({ ...body, stream: true, stream_options: { include_usage: true } })) {
    if (c.choices.length) text += c.choices[0].text;
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  // Token-id prompts work too.
  const ids = await srv.openai.completions.create({ model: modelName, prompt: [0, 1000, 2000], max_tokens: 4, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
});

test('models and health', async () => {
  const list = await srv.openai.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [modelName]);
  assert.equal((await fetch(`${srv.baseURL}/health`)).status, 200);
});
