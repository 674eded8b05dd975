// The shared suite in Node, plus what only Node can check: Buffer and
// cross-realm bodies, the package's own exports map, the RangeError paths
// for inputs that cannot fit in wasm memory, and the TypeScript types.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { webcrypto } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import vm from 'node:vm';

import * as api from '../index.js';
import { makeCases } from './suite.js';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const vectors = JSON.parse(readFileSync(here('./vectors.json'), 'utf8'));
const { verifyWebhookSignature: verify, signWebhookPayload: sign } = api;

for (const { name, run } of makeCases({ api, subtle: webcrypto.subtle, vectors })) {
  test(name, run);
}

test('the package resolves by its name through its exports map', async () => {
  const self = await import('@tfa/webhook-verify');
  assert.equal(self.verifyWebhookSignature, verify);
  assert.equal(self.signWebhookPayload, sign);
  const pkg = JSON.parse(readFileSync(here('../package.json'), 'utf8'));
  assert.equal(pkg.name, '@tfa/webhook-verify');
  assert.equal(pkg.type, 'module');
});

test('Buffer and cross-realm Uint8Array / ArrayBuffer bodies', () => {
  const v = vectors.vectors[0];
  assert.ok(verify(v.secret, Buffer.from(v.body, 'utf8'), v.signature));
  const foreign = vm.runInNewContext(`new Uint8Array([${Buffer.from(v.body, 'utf8').join(',')}])`);
  assert.ok(!(foreign instanceof Uint8Array), 'really from another realm');
  assert.ok(verify(v.secret, foreign, v.signature));
  assert.ok(verify(v.secret, foreign.buffer, v.signature));
  const foreignObject = vm.runInNewContext('({ length: 0 })');
  assert.throws(() => sign('k', foreignObject), TypeError);
});

test('agrees with node:crypto createHmac on a delivery', async () => {
  const { createHmac } = await import('node:crypto');
  const secret = 'a'.repeat(64);
  const body = JSON.stringify({ id: 'e1', event: 'user.login', timestamp: 't', data: {} });
  const want = `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;
  assert.equal(sign(secret, body), want);
  assert.equal(verify(secret, body, want), true);
});

test('inputs that cannot fit in wasm memory are a RangeError, not a trap', () => {
  // Zero-filled buffers are mapped lazily: these cost no real memory.
  const over4GiB = new Uint8Array(2 ** 32 - 1);
  assert.throws(() => sign('0123456789', over4GiB), RangeError);
  assert.throws(() => verify('0123456789', over4GiB, 'sha256=00'), RangeError);
  const nearly4GiB = new Uint8Array(2 ** 32 - 200);
  assert.throws(() => sign('k', nearly4GiB), RangeError);
  assert.throws(() => verify('k', nearly4GiB, ''), RangeError);
  // The module keeps working.
  const v = vectors.vectors[0];
  assert.equal(sign(v.secret, v.body), v.signature);
  assert.ok(verify(v.secret, v.body, v.signature));
});

test('index.d.ts type-checks against typical use (tsc --strict)', () => {
  const tsc = here('../node_modules/typescript/bin/tsc');
  const args = ['--noEmit', '--strict', '--skipLibCheck', '--target', 'es2022'];
  args.push('--module', 'nodenext', '--moduleResolution', 'nodenext');
  try {
    execFileSync(process.execPath, [tsc, ...args, here('./types_check.ts')], {
      stdio: 'pipe',
      timeout: 120_000,
    });
  } catch (error) {
    assert.fail(`tsc failed:\n${error.stdout ?? ''}${error.stderr ?? ''}${error.message}`);
  }
});
