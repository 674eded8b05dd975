// The shared suite in Node, plus what only Node can check: Buffer and
// cross-realm bodies, the package's own exports map, the RangeError paths
// for inputs that cannot fit in wasm memory, and the TypeScript types.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { webcrypto } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { fileURLToPath, pathToFileURL } from 'node:url';
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

/**
 * A stand-in wasm with the package's exports whose `verify` and `sign` trap
 * (`unreachable`), hand-assembled: the real module never traps, so this is
 * how the glue's handling of a trap is tested.
 */
function trappingWasm() {
  const leb = (n) => {
    const out = [];
    do {
      let b = n & 0x7f;
      n >>>= 7;
      if (n) b |= 0x80;
      out.push(b);
    } while (n);
    return out;
  };
  const vec = (items) => [...leb(items.length), ...items.flat()];
  const name = (s) => vec([...Buffer.from(s)]);
  const section = (id, bytes) => [id, ...leb(bytes.length), ...bytes];
  const I32 = 0x7f;
  const type = (params, results) => [0x60, ...vec(params), ...vec(results)];
  const body = (code) => {
    const b = [0x00, ...code, 0x0b];
    return [...leb(b.length), ...b];
  };
  const UNREACHABLE = 0x00;
  return new Uint8Array([
    ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00],
    ...section(1, vec([
      type([I32], [I32]),
      type([I32, I32], []),
      type(Array(6).fill(I32), [I32]),
      type(Array(5).fill(I32), [I32]),
    ])),
    ...section(3, vec([0, 1, 2, 3])),
    ...section(5, vec([[0x00, 0x01]])),
    ...section(7, vec([
      [...name('memory'), 0x02, 0],
      [...name('alloc'), 0x00, 0],
      [...name('dealloc'), 0x00, 1],
      [...name('verify'), 0x00, 2],
      [...name('sign'), 0x00, 3],
    ])),
    ...section(10, vec([
      body([0x41, 0x80, 0x08]), // i32.const 1024
      body([]),
      body([UNREACHABLE]),
      body([UNREACHABLE]),
    ])),
  ]);
}

test('a wasm trap surfaces as a plain Error, and later calls still answer', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'webhook-verify-trap-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  copyFileSync(here('../index.js'), join(dir, 'index.js'));
  const b64 = Buffer.from(trappingWasm()).toString('base64');
  writeFileSync(join(dir, 'webhook_verify_wasm.js'), `export const wasmBase64 = "${b64}";\n`);
  const glue = await import(pathToFileURL(join(dir, 'index.js')).href);
  for (let i = 0; i < 3; i++) {
    for (const call of [
      () => glue.verifyWebhookSignature('k', 'body', 'sha256=00'),
      () => glue.signWebhookPayload('k', 'body'),
    ]) {
      assert.throws(call, (error) => {
        assert.ok(!(error instanceof WebAssembly.RuntimeError), 'not the raw trap');
        assert.match(error.message, /internal WebAssembly failure/);
        assert.ok(error.cause instanceof WebAssembly.RuntimeError);
        return true;
      });
    }
  }
  // Type errors come first, before any wasm runs.
  assert.throws(() => glue.signWebhookPayload(1, 'body'), TypeError);
});
