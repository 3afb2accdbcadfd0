// A second request sharing a ~1,000-token prefix reports the cached tokens in usage (all three
// APIs' spellings) and in /metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, modelName, metrics } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv.stop(); });

let code = '';
for (let i = 0; i < 60; i++) code += `def helper_${i}(values):\n    return [v * ${i} + 1 for v in values if v > ${i}]\n\n`;
const system = `You are reviewing this module:\n${code}`;

test('shared prefix: cached tokens in usage and in /metrics', async () => {
  const counted = (await srv.anthropic.messages.countTokens({ model: modelName, system,
    messages: [{ role: 'user', content: 'Summarise helper_3.' }] })).input_tokens;
  assert.ok(counted >= 1000, `prefix should be ~1,000+ tokens, got ${counted}`);
  const before = await metrics(srv.baseURL);

  const first = await srv.openai.chat.completions.create({ model: modelName, max_tokens: 4, temperature: 0,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'Summarise helper_3.' }] });
  const second = await srv.openai.chat.completions.create({ model: modelName, max_tokens: 4, temperature: 0,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'Now explain helper_41 please.' }] });
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  // Only full KV blocks are shared: everything but the last partial block of the common prefix.
  assert.ok(cached >= counted - 128, `cached ${cached} of a ${counted}-token shared prefix`);
  assert.ok(cached < second.usage.prompt_tokens);
  assert.equal(second.usage.prompt_cache_hit_tokens, cached);

  const viaResponses = await srv.openai.responses.create({ model: modelName, instructions: system,
    input: 'Which helper multiplies by 7?', max_output_tokens: 4, temperature: 0 });
  assert.ok(viaResponses.usage.input_tokens_details.cached_tokens >= counted - 128);

  const viaMessages = await srv.anthropic.messages.create({ model: modelName, max_tokens: 4, system,
    messages: [{ role: 'user', content: 'Which helper is the shortest?' }] });
  assert.ok(viaMessages.usage.cache_read_input_tokens >= counted - 128);
  assert.equal(viaMessages.usage.input_tokens + viaMessages.usage.cache_read_input_tokens,
    (await srv.anthropic.messages.countTokens({ model: modelName, system,
      messages: [{ role: 'user', content: 'Which helper is the shortest?' }] })).input_tokens);

  const after = await metrics(srv.baseURL);
  const hits = after.deepinfer_prefix_cache_hit_tokens_total - before.deepinfer_prefix_cache_hit_tokens_total;
  assert.ok(hits >= cached + viaMessages.usage.cache_read_input_tokens, `metrics hit tokens ${hits}`);
  assert.ok(after.deepinfer_prefix_cache_hit_rate > 0);
  assert.ok(first.usage.prompt_tokens_details.cached_tokens < cached);
});
