// `deepinfer bench` against the real `deepinfer serve` (demo model, CPU, free port):
//   1. `bench sweep` over concurrency 1,2,4 on the multiturn dataset → sweep.json + PNG plots;
//      sane numbers, valid PNGs, and prefix-cache hits (> 0) seen both in usage and in /metrics.
//   2. `bench serve` on /v1/chat/completions with the random dataset: prompts of exactly the
//      asked-for length, outputs of exactly max_tokens (ignore_eos), goodput reported.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, binary, modelDir, modelName } from './harness.mjs';

let srv;
let outDir;
before(async () => {
  srv = await startServer();
  outDir = fs.mkdtempSync(path.join(os.tmpdir(), 'di-bench-e2e-'));
});
after(async () => {
  await srv?.stop();
  if (outDir) fs.rmSync(outDir, { recursive: true, force: true });
});

function run(args) {
  return new Promise((resolve) => {
    const p = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

function isPng(file) {
  const b = fs.readFileSync(file);
  return b.length > 2000 && b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
}

test('bench sweep: multiturn over concurrency 1,2,4 gives JSON, PNGs and prefix-cache hits', async () => {
  const dir = path.join(outDir, 'sweep');
  const numPrompts = 8;  // 2 sessions of 4 turns per concurrency level
  const outputLen = 12;
  const { code, stdout, stderr } = await run([
    'bench', 'sweep', '--base-url', srv.baseURL, '--model', modelName, '--tokenizer', modelDir,
    '--endpoint', '/v1/completions', '--dataset', 'multiturn', '--num-prompts', String(numPrompts),
    '--turns', '4', '--context-len', '160', '--turn-len', '48', '--output-len', String(outputLen),
    '--concurrency', '1,2,4', '--output-dir', dir, '--no-progress', '--num-warmups', '1',
  ]);
  assert.equal(code, 0, `bench sweep failed:\n${stdout}\n${stderr}`);
  const sweep = JSON.parse(fs.readFileSync(path.join(dir, 'sweep.json'), 'utf8'));
  assert.deepEqual(sweep.concurrencies, [1, 2, 4]);
  assert.equal(sweep.runs.length, 3);
  assert.ok(sweep.pareto_front_concurrencies.length >= 1);
  for (const [i, run] of sweep.runs.entries()) {
    const c = [1, 2, 4][i];
    const m = run.result.metrics;
    const where = `concurrency ${c}: ${JSON.stringify(m)}`;
    assert.equal(run.point.concurrency, c);
    assert.equal(m.completed, numPrompts, where);
    assert.equal(m.failed, 0, where);
    // ignore_eos: every request generated exactly max_tokens, as the server's usage reports.
    assert.equal(m.total_output_tokens, numPrompts * outputLen, where);
    assert.equal(m.output_tokens_from_usage, numPrompts, where);
    assert.ok(m.duration_s > 0 && m.duration_s < 60, where);
    assert.ok(m.ttft_ms.p50 > 0 && m.ttft_ms.p99 >= m.ttft_ms.p50, where);
    assert.ok(m.tpot_ms.mean > 0 && m.tpot_ms.count === numPrompts, where);
    assert.ok(m.itl_ms.count > 0, where);
    assert.ok(m.e2el_ms.min >= m.ttft_ms.min, where);
    assert.ok(m.output_token_throughput > 0 && m.request_throughput > 0, where);
    assert.ok(m.output_tokens_per_user_s.mean > 0, where);
    // At most c requests in flight (Little's law over the run, with a little timer slack).
    assert.ok(m.mean_concurrency <= c + 0.05, where);
    // Multiturn: later turns extend earlier ones, so the server's prefix cache must hit.
    assert.ok(m.prefix_cache_usage.hit_rate > 0, where);
    const server = run.result.prefix_cache_server_metrics;
    assert.ok(server.hit_rate > 0, `${where}\n/metrics: ${JSON.stringify(server)}`);
    assert.equal(server.hit_metric, 'deepinfer_prefix_cache_hit_tokens_total');
    // The dataset's prompt lengths (by the tokenizer) are reported and grow with the turns.
    assert.ok(run.result.dataset.prompt_tokens.max > run.result.dataset.prompt_tokens.min);
    assert.ok(fs.existsSync(path.join(dir, `run_c${c}.json`)));
  }
  for (const png of ['pareto.png', 'ttft_vs_throughput.png']) {
    assert.ok(isPng(path.join(dir, png)), `${png} is not a valid PNG`);
  }
  assert.deepEqual(sweep.plots.map((p) => path.basename(p)), ['pareto.png', 'ttft_vs_throughput.png']);
  assert.match(stdout, /Serving benchmark/);
});

test('bench serve: chat endpoint, exact prompt lengths and output lengths, goodput', async () => {
  const json = path.join(outDir, 'serve.json');
  const { code, stdout, stderr } = await run([
    'bench', 'serve', '--base-url', srv.baseURL, '--tokenizer', modelDir,
    '--endpoint', '/v1/chat/completions', '--dataset', 'random', '--num-prompts', '6',
    '--input-len', '100', '--output-len', '10', '--concurrency', '3', '--request-rate', '50',
    '--goodput', 'ttft:60000', 'tpot:60000', '--result-json', json, '--save-detailed', '--no-progress',
  ]);
  assert.equal(code, 0, `bench serve failed:\n${stdout}\n${stderr}`);
  const r = JSON.parse(fs.readFileSync(json, 'utf8'));
  assert.equal(r.model, modelName);  // found through /v1/models
  assert.equal(r.dataset.exact_length_prompts, 6);
  assert.equal(r.dataset.prompt_tokens.min, 100);
  assert.equal(r.dataset.prompt_tokens.max, 100);
  const m = r.metrics;
  assert.equal(m.completed, 6, JSON.stringify(m));
  assert.equal(m.total_output_tokens, 60);
  // The chat template adds tokens around the 100 of the message: the server counts more.
  assert.ok(m.input_tokens_per_request.min > 100, JSON.stringify(m.input_tokens_per_request));
  assert.equal(m.goodput.good_requests, 6);
  assert.equal(r.requests.length, 6);
  for (const q of r.requests) {
    assert.equal(q.output_tokens, 10);
    assert.equal(q.finish_reason, 'length');
    assert.ok(q.chunk_times.length >= 1 && q.end_s >= q.chunk_times.at(-1));
  }
});
