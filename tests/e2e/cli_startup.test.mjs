// What `deepinfer` refuses at startup, each with a message that says what to change: DEEPINFER_*
// variables (core/env.h: `deepinfer env` lists them, an invalid value stops any command before it
// loads anything, a misspelt name is a warning naming the nearest declared variable), and KV
// cache sizes out of range or larger than the memory left after the model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { binary, modelDir } from './harness.mjs';

function run(args, env) {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('DEEPINFER_')));
  const r = spawnSync(binary, args, { env: { ...clean, ...env }, encoding: 'utf8', timeout: 60000 });
  assert.equal(r.error, undefined, String(r.error));
  return r;
}

test('env lists every variable with its values, default and purpose', () => {
  const r = run(['env'], {});
  assert.equal(r.status, 0, r.stderr);
  for (const name of ['DEEPINFER_COMBINE_WARP', 'DEEPINFER_MOE_DECODE', 'DEEPINFER_LOG', 'DEEPINFER_MODEL']) {
    assert.match(r.stdout, new RegExp(`^${name}$`, 'm'), name);
  }
  assert.match(r.stdout, /values: v1\|v2\|tc {3}unset: tc/);
  assert.match(r.stdout, /set now: none/);
});

test('env --set shows what is set and checks it', () => {
  const ok = run(['env', '--set'], { DEEPINFER_COMBINE_WARP: '1' });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^ {2}DEEPINFER_COMBINE_WARP=1$/m);
  assert.doesNotMatch(ok.stdout, /^DEEPINFER_MOE_DECODE$/m, '--set leaves the table out');

  const typo = run(['env', '--set'], { DEEPINFER_COMBINE_WARPP: '1' });
  assert.equal(typo.status, 0, 'an unknown name is a warning');
  assert.match(typo.stderr, /warning: DEEPINFER_COMBINE_WARPP is not a deepinfer variable \(did you mean DEEPINFER_COMBINE_WARP\?\)/);

  const bad = run(['env', '--set'], { DEEPINFER_MOE_DECODE: 'fast' });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /error: DEEPINFER_MOE_DECODE=fast: expected v1\|v2\|tc/);
});

test('an invalid value stops serve before it loads the model; a misspelt name only warns', () => {
  const t0 = Date.now();
  const bad = run(['serve', '--model', modelDir, '--port', '0'], { DEEPINFER_PDL_DECODE: '99' });
  assert.equal(bad.status, 2, bad.stdout + bad.stderr);
  assert.match(bad.stderr, /DEEPINFER_PDL_DECODE=99: expected 0\.\.15/);
  assert.doesNotMatch(bad.stderr, /loaded|listening/i);
  assert.ok(Date.now() - t0 < 30000);

  const typo = run(['tokenize', '--tokenizer', '/nonexistent/tokenizer.json'], { DEEPINFER_THREAD: '2' });
  assert.equal(typo.status, 1, 'the command itself runs (and fails on its missing file)');
  assert.match(typo.stderr, /nonexistent/);
  assert.match(typo.stderr, /DEEPINFER_THREAD is not a deepinfer variable \(did you mean DEEPINFER_THREADS\?\)/);
});

test('serve refuses a KV pool that cannot fit, and sizes out of range', () => {
  const huge = run(['serve', '--model', modelDir, '--port', '0', '--kv-cache-mb', '100000000'], {});
  assert.notEqual(huge.status, 0);
  assert.match(huge.stderr, /the KV cache pool \(\d+ blocks of 64 tokens, [\d.]+ GB\) does not fit: [\d.]+ GB is available on the cpu backend after loading the model; lower --kv-cache-mb/);
  for (const bad of ['-5', '0', '99999999999']) {
    const r = run(['serve', '--model', modelDir, '--port', '0', '--kv-cache-mb', bad], {});
    assert.notEqual(r.status, 0, bad);
    assert.match(r.stderr, /--kv-cache-mb: Value -?\d+ not in range 1 to 1073741824/, bad);
  }
});

test('integer options out of range name the option, the bound and the value', () => {
  const cases = [
    [['serve', '--block-size', '0'], /--block-size: must be an integer >= 1, got 0/],
    [['generate', '--prefill-chunk', '-3', '--prompt-ids', '1,2'], /--prefill-chunk: must be an integer >= 0, got -3/],
    [['make-model', '--arch', 'llama', '--preset', 'tiny', '--vocab-size', 'x', '--dry-run'], /--vocab-size: must be an integer >= 1, got x/],
  ];
  for (const [args, want] of cases) {
    const r = run(args, {});
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, want, args.join(' '));
  }
});
