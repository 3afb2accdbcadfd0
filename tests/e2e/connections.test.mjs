// A connection that has not sent its request yet holds no HTTP worker (TCP_DEFER_ACCEPT on the
// listening socket, docs/serving.md "Limits and HTTP settings"). With one worker, an idle
// connection opened first must not delay a request on a second connection: before the fix the
// worker spun in cpp-httplib's keep-alive wait on the idle socket for 30 s, and 1,000 such waits
// at once starved the load test's client (tests/e2e/load.test.mjs) into timeouts. The idle
// connection is still served once it sends its request.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(['--http-threads', '1']); });
after(async () => { await srv.stop(); });

function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

test('an idle connection holds no worker, and is served once it sends', async () => {
  const idle = [];
  for (let i = 0; i < 4; i++) idle.push(await connect(srv.port));
  await new Promise((r) => setTimeout(r, 200));  // give the server time to accept them, if it would

  const t0 = performance.now();
  const res = await fetch(`${srv.baseURL}/health`, { signal: AbortSignal.timeout(5000) });
  assert.equal(res.status, 200);
  assert.ok(performance.now() - t0 < 5000);

  for (const s of idle) {
    // The whole response is one small write; the client closes (it says `Connection: close`).
    const reply = new Promise((resolve, reject) => {
      let text = '';
      s.on('data', (d) => {
        text += d;
        if (text.includes('\r\n\r\n') && text.endsWith('}')) resolve(text);
      });
      s.on('error', reject);
      setTimeout(() => reject(new Error(`no response in 5 s: ${text}`)), 5000).unref();
    });
    s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
    const text = await reply;
    assert.match(text, /^HTTP\/1\.1 200 /, text);
    assert.match(text, /"status":"ok"/, text);
    s.destroy();
  }
});
