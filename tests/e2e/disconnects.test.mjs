// 200 clients vanish mid-request (streaming and not, before and after the first token); every one is
// aborted in the engine and all KV blocks come back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, modelName, metrics, waitFor } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(['--max-running', '64']); });
after(async () => { await srv.stop(); });

// Sends a raw HTTP request and destroys the socket (RST-like close) at the chosen moment.
function abruptClient(port, body, when) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1', () => {
      const payload = JSON.stringify(body);
      sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`);
      if (when === 'after-send') setTimeout(() => sock.destroy(), 5);
      if (when === 'timer') setTimeout(() => sock.destroy(), 150);
    });
    let got = 0;
    sock.on('data', (d) => {
      got += d.length;
      if (when === 'first-chunk' && d.includes('data: ')) sock.destroy();
    });
    sock.on('close', () => resolve(got));
    sock.on('error', () => {});
  });
}

test('200 abrupt disconnects free every KV block', async () => {
  const base = await metrics(srv.baseURL);
  const body = (stream) => ({ model: modelName, max_tokens: 2000, ignore_eos: true, temperature: 0, stream,
    messages: [{ role: 'user', content: 'Write a very long Python module.' }] });
  const clients = [];
  for (let i = 0; i < 200; i++) {
    const when = ['first-chunk', 'after-send', 'timer', 'first-chunk'][i % 4];
    clients.push(abruptClient(srv.port, body(when !== 'timer' || i % 8 === 2), when));
  }
  await Promise.all(clients);
  // 200 requests × 2000 tokens would take many minutes on the CPU; finishing quickly means they were
  // aborted. Wait for the engine to drain and check that nothing is left behind.
  const m = await waitFor(async () => {
    const x = await metrics(srv.baseURL);
    return x.deepinfer_requests_in_flight === 0 && x.deepinfer_num_requests_running === 0 &&
      x.deepinfer_num_requests_waiting === 0 && x.deepinfer_kv_blocks_used === 0 ? x : null;
  }, { timeoutMs: 60000, what: 'KV usage back to zero' });
  assert.equal(m.deepinfer_kv_cache_usage_ratio, 0);
  const health = await fetch(`${srv.baseURL}/health?integrity=1`);
  assert.equal(health.status, 200, await health.clone().text());
  const disconnects = m.deepinfer_client_disconnects_total - base.deepinfer_client_disconnects_total;
  const aborted = m.deepinfer_engine_requests_aborted_total - base.deepinfer_engine_requests_aborted_total;
  assert.equal(disconnects, 200, `server noticed ${disconnects} of 200 disconnects`);
  assert.ok(aborted >= 190, `engine aborted ${aborted}`);  // a few may not have reached the engine yet
  const generated = m.deepinfer_engine_generation_tokens_total - base.deepinfer_engine_generation_tokens_total;
  assert.ok(generated < 200 * 2000 / 4, `aborted requests kept generating: ${generated} tokens`);

  // And the server still answers.
  const r = await srv.openai.chat.completions.create({ model: modelName, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.choices.length, 1);
});
