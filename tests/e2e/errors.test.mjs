// Bad inputs get 4xx in each protocol's own error shape, limits answer 413/429, and the server keeps
// serving afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, modelName, postJSON, metrics, waitFor } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(['--max-request-mb', '1', '--max-concurrent-requests', '2']); });
after(async () => { await srv.stop(); });

const chat = (patch) => ({ model: modelName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...patch });
const msgs = (patch) => ({ model: modelName, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], ...patch });
const longPrompt = 'x = 1\n'.repeat(3000);  // far more than the demo model's 4096-token context

function assertOpenAIError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.equal(typeof r.json.error.message, 'string');
  assert.ok(r.json.error.message.length > 0);
  assert.equal(typeof r.json.error.type, 'string');
  assert.ok('param' in r.json.error && 'code' in r.json.error, r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

function assertAnthropicError(r, status, type) {
  assert.equal(r.status, status, r.text);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, type, r.text);
  assert.ok(r.json.error.message.length > 0);
}

test('chat: each bad input is a 400 naming the field', async () => {
  const cases = [
    ['{"model": ', undefined],                                   // malformed JSON
    [Buffer.concat([Buffer.from('{"model":"'), Buffer.from([0xc3, 0x28]), Buffer.from('","messages":[]}')]), undefined],
    [chat({ messages: [] }), 'messages'],
    [chat({ messages: 'hi' }), 'messages'],
    [chat({ messages: [{ role: 'user', content: 42 }] }), 'messages[0].content'],
    [chat({ max_tokens: -1 }), 'max_tokens'],
    [chat({ max_tokens: 1e12 }), 'max_tokens'],
    [chat({ max_tokens: 5000 }), 'max_tokens'],                   // more than the context holds
    [chat({ temperature: -1 }), 'temperature'],
    [chat({ temperature: 'hot' }), 'temperature'],
    [chat({ top_p: 0 }), 'top_p'],
    [chat({ messages: [{ role: 'user', content: longPrompt }] }), 'messages'],  // prompt longer than the context
  ];
  for (const [body, param] of cases) {
    assertOpenAIError(await postJSON(srv.baseURL, '/v1/chat/completions', body), 400, param);
  }
});

test('unknown model is a 404 in both shapes; unknown route is a 404', async () => {
  const o = await postJSON(srv.baseURL, '/v1/chat/completions', chat({ model: 'gpt-9' }));
  assertOpenAIError(o, 404);
  assert.equal(o.json.error.code, 'model_not_found');
  assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages', msgs({ model: 'claude-9' })), 404, 'not_found_error');
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/nope', {}), 404);
});

test('the official clients raise their typed errors', async () => {
  await assert.rejects(srv.openai.chat.completions.create(chat({ temperature: -2 })),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(srv.openai.chat.completions.create(chat({ model: 'nope' })),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(srv.openai.responses.create({ model: modelName, input: 'x', max_output_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(srv.anthropic.messages.create(msgs({ temperature: 1.5 })),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
});

test('responses, completions and messages validate too', async () => {
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/responses', { model: modelName, input: [] }), 400, 'input');
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/responses', { model: modelName, input: 'x', previous_response_id: 'resp_1' }), 400, 'previous_response_id');
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/completions', { model: modelName, prompt: '' }), 400, 'prompt');
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/completions', { model: modelName, prompt: [1, 99999999] }), 400, 'prompt');
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/completions', { model: modelName, prompt: longPrompt }), 400);
  for (const body of [
    { model: modelName, messages: [{ role: 'user', content: 'hi' }] },            // no max_tokens
    msgs({ messages: [] }),
    msgs({ max_tokens: -5 }),
    msgs({ temperature: -0.1 }),
    msgs({ messages: [{ role: 'system', content: 'x' }] }),
    msgs({ messages: [{ role: 'user', content: longPrompt }] }),
  ]) {
    assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages', body), 400, 'invalid_request_error');
  }
  assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages/count_tokens', { model: modelName }), 400, 'invalid_request_error');
  assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages', '[1,2'), 400, 'invalid_request_error');
});

test('a body over --max-request-mb is a 413 in the protocol shape', async () => {
  const big = chat({ messages: [{ role: 'user', content: 'a'.repeat(1_200_000) }] });
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/chat/completions', big), 413);
  assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages', msgs({ messages: [{ role: 'user', content: 'a'.repeat(1_200_000) }] })),
    413, 'request_too_large');
});

test('requests beyond --max-concurrent-requests are 429; aborting frees the slots', async () => {
  const controllers = [new AbortController(), new AbortController()];
  const long = chat({ max_tokens: 3000, ignore_eos: true, stream: true });
  const streams = await Promise.all(controllers.map((c) => fetch(`${srv.baseURL}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(long), signal: c.signal })));
  for (const s of streams) assert.equal(s.status, 200);
  assertOpenAIError(await postJSON(srv.baseURL, '/v1/chat/completions', chat({})), 429);
  assertAnthropicError(await postJSON(srv.baseURL, '/v1/messages', msgs({})), 429, 'rate_limit_error');
  for (const c of controllers) c.abort();
  await waitFor(async () => (await metrics(srv.baseURL)).deepinfer_requests_in_flight === 0, { what: 'slots to free' });
});

test('the server is healthy after all of that', async () => {
  assert.equal((await fetch(`${srv.baseURL}/health`)).status, 200);
  const r = await srv.openai.chat.completions.create(chat({ max_tokens: 4, temperature: 0 }));
  assert.equal(r.choices.length, 1);
  const m = await metrics(srv.baseURL);
  assert.equal(m.deepinfer_kv_blocks_used, 0);
  assert.equal(m.deepinfer_num_requests_running, 0);
  assert.ok(m['deepinfer_http_responses_total{route="/v1/chat/completions",status="400"}'] >= 12);
});
