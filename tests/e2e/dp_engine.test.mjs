// `deepinfer serve --dp-size 2` (DP attention + EP, issue #8) on the CPU with the demo MoE model
// (16 routed experts, 8 per rank): concurrent streaming chat and completions requests give the
// same greedy text as the same requests against one engine, /health is ok, and /metrics sums
// the two ranks (twice the KV blocks of one engine).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, modelName, metrics } from './harness.mjs';

let single;
let group;
let groupEplb;
// EPLB over the group's 2 ranks, with tiny windows and periods so that it re-places mid-request.
const eplbFlags = ['--eplb', '--eplb-window-prefill', '2', '--eplb-period-prefill', '2',
  '--eplb-window-decode', '4', '--eplb-period-decode', '3', '--eplb-bucket-decode', '2',
  '--eplb-min-gain-prefill', '0', '--eplb-min-gain-decode', '0'];
before(async () => {
  // The smallest pool that holds the requests below keeps start-up fast.
  const common = ['--kv-cache-mb', '16', '--block-size', '16', '--max-batched-tokens', '64'];
  [single, group, groupEplb] = await Promise.all([startServer(common),
    startServer([...common, '--dp-size', '2']),
    startServer([...common, '--dp-size', '2', ...eplbFlags])]);
});
after(async () => {
  await Promise.all([single?.stop(), group?.stop(), groupEplb?.stop()]);
});

const prompts = [
  'Write a Python function that reverses a list.',
  'def fibonacci(n):',
  'Explain what a hash map is in one sentence.',
  'SELECT name FROM users WHERE',
  'Sort an array in JavaScript',
  'class Stack:',
];

async function streamChat(client, content, maxTokens) {
  const stream = await client.chat.completions.create({
    model: modelName, messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      text += c.delta?.reasoning_content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, completion_tokens: usage?.completion_tokens, finish };
}

async function streamCompletion(client, prompt, maxTokens) {
  const stream = await client.completions.create({
    model: modelName, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  return { text };
}

// Different lengths, all at once: one rank keeps decoding while the other pads or prefills.
async function runAll(srv) {
  return Promise.all(prompts.map((p, i) => (i % 2 === 0
    ? streamChat(srv.openai, p, 6 + 3 * i)
    : streamCompletion(srv.openai, p, 4 + 2 * i))));
}

test('--dp-size 2 serves concurrent streams with the output of one engine', async () => {
  const health = await fetch(`${group.baseURL}/health`);
  assert.equal(health.status, 200);
  const [expected, got] = await Promise.all([runAll(single), runAll(group)]);
  for (let i = 0; i < prompts.length; i++) {
    assert.ok(expected[i].text.length > 0, `empty output for prompt ${i}`);
    assert.deepEqual(got[i], expected[i], `prompt ${i}: ${JSON.stringify(prompts[i])}`);
  }
  // Again on the warm group (prefix cache hits on whichever rank holds them).
  assert.deepEqual(await runAll(group), expected);

  const m1 = await metrics(single.baseURL);
  const m2 = await metrics(group.baseURL);
  assert.equal(m2.deepinfer_kv_blocks_total, 2 * m1.deepinfer_kv_blocks_total);
  assert.equal(m2.deepinfer_kv_blocks_used, 0);
  assert.ok(m2.deepinfer_engine_padding_steps_total > 0, 'a rank never padded');
  assert.equal(m2.deepinfer_dp_size, 2);
  assert.equal((await fetch(`${group.baseURL}/health`)).status, 200);
});

test('--dp-size 2 --eplb re-places experts and keeps the output of one engine', async () => {
  const [expected, got] = await Promise.all([runAll(single), runAll(groupEplb)]);
  assert.deepEqual(got, expected);
  const m = await metrics(groupEplb.baseURL);
  assert.ok(m.deepinfer_eplb_rebalances_total > 0, 'no rebalance');
  assert.ok(m.deepinfer_moe_lb >= 1);
  assert.equal(m.deepinfer_dp_size, 2);
});

test('--dp-size rejects bad values with a clear message', async () => {
  await assert.rejects(startServer(['--dp-size', '0']), /--dp-size must be a number >= 1 or auto/);
  await assert.rejects(startServer(['--dp-size', 'auto']), /--dp-size auto needs --backend cuda/);
  await assert.rejects(startServer(['--dp-size', '2', '--eplb', '--ep-ranks', '3']),
    /--ep-ranks 3 with --dp-size 2/);
});
