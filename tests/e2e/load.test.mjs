// Many concurrent streaming clients (official openai client) against one server: every stream must
// complete with exactly max_tokens tokens and a well-formed usage chunk, and afterwards no KV block
// is in use and every scheduler / KV invariant holds (/health?integrity=1). DI_E2E_LOAD_CLIENTS
// sets how many (default 1,000, the issue's number: ~25 s on 2 cores).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, modelName, metrics } from './harness.mjs';

const numClients = Number(process.env.DI_E2E_LOAD_CLIENTS ?? 1000);
const maxTokens = 16;

// Like the official client's default (maxRetries 2), a request whose connection fails before any
// response byte is retried: the server never accepted it, so nothing it accepted is lost. Such
// transport failures are counted, printed and bounded (<= 1% of the clients); every stream must
// still complete in full.
let transportErrors = 0;
const transportSamples = [];
async function countingFetch(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    transportErrors++;
    if (transportSamples.length < 5) transportSamples.push(`${e} / ${e?.cause ?? ''}`);
    throw e;
  }
}

let srv;
let client;
before(async () => {
  srv = await startServer(['--max-concurrent-requests', String(numClients + 8), '--max-running', '256']);
  client = new OpenAI({ baseURL: `${srv.baseURL}/v1`, apiKey: 'unused', maxRetries: 2, timeout: 120000,
    fetch: countingFetch });
});
after(async () => { await srv.stop(); });

function percentile(values, p) {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

test(`${numClients} concurrent streaming clients all complete`, async () => {
  const t0 = performance.now();
  const ttfts = [];
  const settled = await Promise.allSettled(Array.from({ length: numClients }, async (_, i) => {
    const start = performance.now();
    try {
      return await oneStream(i, start);
    } catch (e) {
      e.at = performance.now() - t0;
      throw e;
    }
  }));
  async function oneStream(i, start) {
    const stream = await client.chat.completions.create({
      model: modelName, max_tokens: maxTokens, ignore_eos: true, temperature: 0.8, seed: i, stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: `Client ${i}: write a Python function number ${i}.` }],
    });
    let text = '';
    let usage = null;
    let finish = null;
    let first = true;
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
      const d = chunk.choices[0].delta.content ?? '';
      if (first && d) { ttfts.push(performance.now() - start); first = false; }
      text += d;
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    return { text, usage, finish };
  }
  const wall = (performance.now() - t0) / 1000;
  // Every failure, not just the first, with the server's state and log: a lost stream must be
  // explainable from the test output alone.
  const failed = settled.map((r, i) => [i, r]).filter(([, r]) => r.status === 'rejected');
  if (failed.length > 0) {
    const alive = srv.proc.exitCode === null && srv.proc.signalCode === null;
    const detail = failed.slice(0, 5).map(([i, r]) =>
      `client ${i} at ${r.reason?.at?.toFixed?.(0)} ms: ${r.reason} / ${r.reason?.cause ?? ''} / ${r.reason?.cause?.cause ?? ''}`);
    assert.fail(`${failed.length} of ${numClients} streams failed; server ` +
      `${alive ? 'alive' : `exited (code ${srv.proc.exitCode}, signal ${srv.proc.signalCode})`}\n` +
      `${detail.join('\n')}\nserver stderr (tail):\n${srv.stderr().slice(-4000)}`);
  }
  const results = settled.map((r) => r.value);
  assert.ok(transportErrors <= numClients / 100,
    `${transportErrors} connections failed before a response (retried): ${transportSamples.join('\n')}\n` +
    `server stderr (tail):\n${srv.stderr().slice(-4000)}`);
  for (const r of results) {
    assert.equal(r.finish, 'length');
    assert.equal(r.usage.completion_tokens, maxTokens);
  }
  const m = await metrics(srv.baseURL);
  assert.equal(m.deepinfer_kv_blocks_used, 0);
  assert.equal(m.deepinfer_requests_in_flight, 0);
  const health = await fetch(`${srv.baseURL}/health?integrity=1`);
  assert.equal(health.status, 200, await health.clone().text());
  assert.equal((await health.json()).integrity, 'ok');
  const total = numClients * maxTokens;
  console.log(`load: ${transportErrors} connection failures retried` +
    (transportSamples.length ? ` (${transportSamples[0]})` : ''));
  console.log(`load: ${numClients} streams × ${maxTokens} tokens in ${wall.toFixed(2)} s: ` +
    `${(total / wall).toFixed(0)} tok/s; client TTFT p50 ${percentile(ttfts, 50).toFixed(0)} ms, ` +
    `p99 ${percentile(ttfts, 99).toFixed(0)} ms`);
});
