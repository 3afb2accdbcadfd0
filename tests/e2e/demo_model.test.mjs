// Issue #9's end-to-end claim: `deepinfer serve` on the shipped demo model answers a /v1/completions
// request for "def fibonacci(n):" with the same code-like text that HF transformers produced from
// the exported checkpoint (tests/fixtures/golden/demo_code/golden.json, prompt 0, greedy).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { startServer, modelName, binary, modelDir } from './harness.mjs';

const sourceDir = process.env.DI_SOURCE_DIR ?? path.resolve(import.meta.dirname, '../..');
const golden = JSON.parse(fs.readFileSync(path.join(sourceDir, 'tests/fixtures/golden/demo_code/golden.json')));

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv.stop(); });

test('completions: def fibonacci(n): continues with the HF greedy tokens', async () => {
  assert.equal(golden.texts[0], 'def fibonacci(n):');
  const r = await srv.openai.completions.create({
    model: modelName, prompt: golden.texts[0], max_tokens: golden.greedy[0].length, temperature: 0,
  });
  const text = r.choices[0].text;
  assert.equal(r.usage.prompt_tokens, golden.prompts[0].length, 'BOS + the prompt tokens HF saw');
  assert.equal(r.usage.completion_tokens, golden.greedy[0].length);
  // Code-like: a Python statement and a new definition.
  assert.match(text, /return/);
  assert.match(text, /\ndef /);
  // And exactly HF's continuation: HF's greedy ids decoded by our tokenizer CLI.
  const decoded = execFileSync(binary, ['tokenize', '--tokenizer', path.join(modelDir, 'tokenizer.json'), '--decode'],
    { input: JSON.stringify(golden.greedy[0]) }).toString();
  assert.equal(text, decoded);
});
