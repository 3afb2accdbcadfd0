// OpenAI Responses through the official client: bodies, the ResponseStream helper (which throws on
// out-of-order items), function tools and function_call / function_call_output input items.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, modelName } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv.stop(); });

const tools = [{ type: 'function', name: 'run_python', description: 'Runs Python code',
  parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] } }];

test('responses: non-streaming', async () => {
  const r = await srv.openai.responses.create({ model: modelName, instructions: 'You write Python.',
    input: 'Write a function that adds two numbers.', max_output_tokens: 24, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  const msg = r.output.find((o) => o.type === 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'output_text');
  assert.equal(r.output_text, msg.content[0].text);  // the SDK's convenience field
  assert.ok(r.usage.input_tokens > 5);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.instructions, 'You write Python.');
  assert.equal(r.max_output_tokens, 24);
});

test('responses: streaming equals non-streaming (greedy)', async () => {
  const body = { model: modelName, input: 'def is_prime(n):', max_output_tokens: 32, temperature: 0 };
  const whole = await srv.openai.responses.create(body);
  const stream = srv.openai.responses.stream(body);
  const types = [];
  let deltas = '';
  stream.on('event', (e) => types.push(e.type));
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const final = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  assert.equal(final.output_text, whole.output_text);
  assert.equal(deltas, whole.output_text);
  assert.equal(final.status, whole.status);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
});

test('responses: function tools and a tool round trip are accepted and well-formed', async () => {
  // The demo model is not trained to call tools, so this proves acceptance and shape; the mapping of
  // real function_call events is covered in tests/unit/protocol.
  const input = [
    { role: 'user', content: 'Compute 2**10 with Python.' },
    { type: 'function_call', call_id: 'call_1', name: 'run_python', arguments: '{"code":"print(2**10)"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '1024' },
  ];
  const r = await srv.openai.responses.create({ model: modelName, input, tools, max_output_tokens: 16, temperature: 0 });
  assert.ok(r.output.length >= 1);
  for (const item of r.output) {
    assert.ok(['message', 'function_call', 'reasoning'].includes(item.type));
    if (item.type === 'function_call') JSON.parse(item.arguments);
  }
  const streamed = await srv.openai.responses.stream({ model: modelName, input, tools, max_output_tokens: 16,
    temperature: 0, reasoning: { effort: 'low' } }).finalResponse();
  assert.ok(['completed', 'incomplete'].includes(streamed.status));
});
