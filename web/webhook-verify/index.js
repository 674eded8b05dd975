// @tfa/webhook-verify: verify (and make) the service's webhook signatures
// with the service's own code, tfa-core's `signature` module compiled to
// WebAssembly (see rust/src/lib.rs for the ABI).
//
// The wasm is embedded as base64 and instantiated once, with top-level
// await, when this module is first imported; the exported functions are
// synchronous after that. No imports are given to the wasm: it needs none.

import { wasmBase64 } from './webhook_verify_wasm.js';

const SIGNATURE_LEN = 71;
const MAX_WASM_BYTES = 0xffffffff;
const encoder = new TextEncoder();

function base64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const wasmModule = await WebAssembly.compile(base64ToBytes(wasmBase64));
let wasm = (await WebAssembly.instantiate(wasmModule, {})).exports;

// Brand checks that hold across realms (iframes, Node `vm`) and that a
// forged Symbol.toStringTag cannot fool.
const typedArrayTag = Object.getOwnPropertyDescriptor(
  Object.getPrototypeOf(Uint8Array.prototype),
  Symbol.toStringTag,
).get;
const arrayBufferByteLength = Object.getOwnPropertyDescriptor(
  ArrayBuffer.prototype,
  'byteLength',
).get;

function isUint8Array(value) {
  return typedArrayTag.call(value) === 'Uint8Array';
}

function isArrayBuffer(value) {
  try {
    arrayBufferByteLength.call(value);
    return true;
  } catch {
    return false;
  }
}

function requireString(value, name) {
  if (typeof value !== 'string') {
    throw new TypeError(`${name} must be a string, got ${describe(value)}`);
  }
  // Lone surrogates become U+FFFD (EF BF BD), as TextEncoder always does.
  return encoder.encode(value);
}

function bodyBytes(value) {
  if (typeof value === 'string') return encoder.encode(value);
  if (isUint8Array(value)) return value;
  if (isArrayBuffer(value)) return new Uint8Array(value);
  throw new TypeError(
    `rawBody must be a string, Uint8Array or ArrayBuffer, got ${describe(value)}`,
  );
}

function describe(value) {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  const tag = typedArrayTag.call(value);
  if (tag) return tag;
  return Object.prototype.toString.call(value).slice(8, -1);
}

// Copies `parts` into one fresh block of wasm memory followed by `extra`
// bytes, calls `run(exports, [ptr, len, ptr, len, ...], extraPtr)`, and
// frees the block. The block is as big as the inputs: memory grows as
// needed, and a block that cannot be had is a RangeError.
function withInputs(parts, extra, run) {
  let total = extra;
  for (const part of parts) total += part.length;
  if (total > MAX_WASM_BYTES) {
    throw new RangeError(
      `webhook-verify: inputs of ${total} bytes exceed the 4 GiB of WebAssembly memory`,
    );
  }
  const exports = wasm;
  if (!exports) {
    throw new Error('webhook-verify: the WebAssembly instance is being re-created; retry');
  }
  const base = exports.alloc(total) >>> 0;
  if (base === 0) {
    throw new RangeError(
      `webhook-verify: cannot reserve ${total} bytes of WebAssembly memory`,
    );
  }
  try {
    // Taken after `alloc`: growing memory replaces `memory.buffer`.
    const memory = new Uint8Array(exports.memory.buffer);
    const args = [];
    let at = base;
    for (const part of parts) {
      memory.set(part, at);
      args.push(at, part.length);
      at += part.length;
    }
    return run(exports, args, at);
  } catch (error) {
    if (error instanceof WebAssembly.RuntimeError) {
      // Cannot happen by design (the Rust side never panics and reserves
      // memory before calling core); if it does, the instance's state is
      // suspect, so replace it rather than reuse it.
      replaceInstance();
      throw new Error('webhook-verify: internal WebAssembly failure', { cause: error });
    }
    throw error;
  } finally {
    if (exports === wasm) exports.dealloc(base, total);
  }
}

// A fresh instance of the same module: synchronously where the engine
// allows it, else asynchronously (calls meanwhile throw a plain Error).
function replaceInstance() {
  try {
    wasm = new WebAssembly.Instance(wasmModule, {}).exports;
  } catch {
    wasm = null;
    WebAssembly.instantiate(wasmModule, {}).then((instance) => {
      wasm = instance.exports;
    });
  }
}

function outOfMemory() {
  return new RangeError('webhook-verify: out of WebAssembly memory');
}

/**
 * Whether `signatureHeader` (`sha256=<64 hex>` or the bare 64 hex digits)
 * is the HMAC-SHA-256 of `rawBody` under `secret`, compared in constant time.
 */
export function verifyWebhookSignature(secret, rawBody, signatureHeader) {
  const key = requireString(secret, 'secret');
  const body = bodyBytes(rawBody);
  const header = requireString(signatureHeader, 'signatureHeader');
  return withInputs([key, body, header], 0, (exports, args) => {
    const result = exports.verify(...args);
    if (result < 0) throw outOfMemory();
    return result === 1;
  });
}

/** `sha256=<64 lower-case hex>`: the header the service sends for `rawBody`. */
export function signWebhookPayload(secret, rawBody) {
  const key = requireString(secret, 'secret');
  const body = bodyBytes(rawBody);
  return withInputs([key, body], SIGNATURE_LEN, (exports, args, out) => {
    const written = exports.sign(...args, out);
    if (written !== SIGNATURE_LEN) throw outOfMemory();
    const bytes = new Uint8Array(exports.memory.buffer, out, SIGNATURE_LEN);
    return String.fromCharCode(...bytes);
  });
}
