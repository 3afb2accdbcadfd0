// Starts the real `deepinfer serve` on a free port for one test file and stops it after.
//
//   const srv = await startServer(['--max-concurrent-requests', '4']);
//   ... srv.baseURL (http://127.0.0.1:PORT), srv.openai, srv.anthropic ...
//   await srv.stop();   // SIGTERM; asserts a graceful exit (code 0)
import { spawn } from 'node:child_process';
import path from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const sourceDir = process.env.DI_SOURCE_DIR ?? path.resolve(import.meta.dirname, '../..');
export const binary = process.env.DEEPINFER_BIN ?? path.join(sourceDir, 'build/bin/deepinfer');
export const modelDir = process.env.DI_E2E_MODEL ?? path.join(sourceDir, 'models/deepinfer-demo-code');
export const modelName = path.basename(modelDir);

export async function startServer(extraArgs = []) {
  const args = ['serve', '--model', modelDir, '--port', '0', ...extraArgs];
  const proc = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s:\n${stdout}\n${stderr}`)), 60000);
    proc.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code}) before listening:\n${stdout}\n${stderr}`));
    });
  });
  const baseURL = `http://127.0.0.1:${port}`;
  const health = await fetch(`${baseURL}/health`);
  assert.equal(health.status, 200);
  return {
    port,
    baseURL,
    proc,
    stderr: () => stderr,
    openai: new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 }),
    anthropic: new Anthropic({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 }),
    async stop() {
      if (proc.exitCode !== null) return;
      proc.kill('SIGTERM');
      const { code, signal } = await exited;
      assert.equal(signal, null, `server killed by ${signal}; stderr:\n${stderr}`);
      assert.equal(code, 0, `server exit code ${code}; stderr:\n${stderr}`);
    },
  };
}

// Prometheus text → {name or name{labels}: value}
export async function metrics(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

export async function waitFor(pred, { timeoutMs = 30000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await pred();
    if (last) return last;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out waiting for ${what}`);
}

export async function postJSON(baseURL, route, body, headers = {}) {
  const res = await fetch(`${baseURL}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}
