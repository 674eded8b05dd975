// The checks of @tfa/webhook-verify that run both in Node (node.test.js)
// and in headless Chromium (browser.html, driven by browser.test.js).
// No Node APIs here: only what a browser has, plus the WebCrypto `subtle`
// object handed in as the independent reference.

const HEX = '0123456789abcdef';

export function hexToBytes(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

export function bytesToHex(bytes) {
  let s = '';
  for (const b of bytes) s += HEX[b >> 4] + HEX[b & 15];
  return s;
}

/** Mulberry32: a tiny seeded generator, so failures reproduce. */
export function seeded(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const below = (n) => Math.floor(next() * n);
  const bytes = (n) => {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = below(256);
    return out;
  };
  return { next, below, bytes };
}

/**
 * HMAC-SHA-256 by WebCrypto. WebCrypto refuses an empty HMAC key; HMAC pads
 * short keys with zeros to the 64-byte block, so an empty key is the same
 * as 64 zero bytes.
 */
export async function referenceHex(subtle, keyBytes, bodyBytes) {
  const raw = keyBytes.length === 0 ? new Uint8Array(64) : keyBytes;
  const key = await subtle.importKey('raw', raw, { name: 'HMAC', hash: 'SHA-256' }, false, [
    'sign',
  ]);
  return bytesToHex(new Uint8Array(await subtle.sign('HMAC', key, bodyBytes)));
}

class CheckError extends Error {}

function ok(condition, message) {
  if (!condition) throw new CheckError(message);
}

function eq(actual, expected, message) {
  if (actual !== expected) {
    throw new CheckError(
      `${message}: got ${JSON.stringify(actual)}, want ${JSON.stringify(expected)}`,
    );
  }
}

function throwsTypeError(fn, message) {
  try {
    fn();
  } catch (error) {
    ok(
      error instanceof TypeError,
      `${message}: threw ${error && error.name} (${error && error.message}), want TypeError`,
    );
    return;
  }
  throw new CheckError(`${message}: did not throw`);
}

/** The body of a vector in each form the API accepts. */
function bodyForms(vector) {
  const bytes = hexToBytes(vector.bodyHex);
  const arrayBuffer = bytes.slice().buffer;
  // A view that does not start at offset 0 of its buffer.
  const padded = new Uint8Array(bytes.length + 7);
  padded.set(bytes, 3);
  const forms = [
    ['Uint8Array', bytes],
    ['ArrayBuffer', arrayBuffer],
    ['offset view', padded.subarray(3, 3 + bytes.length)],
  ];
  if (typeof vector.body === 'string') forms.push(['string', vector.body]);
  return forms;
}

/** `s` with the code unit at `i` changed. */
function changeUnit(s, i) {
  return s.slice(0, i) + String.fromCharCode(s.charCodeAt(i) ^ 1) + s.slice(i + 1);
}

/**
 * The shared cases: `[{ name, run }]`, `run` async and throwing on failure.
 * `api` is the package's module namespace, `vectors` the parsed
 * vectors.json, `subtle` a WebCrypto SubtleCrypto.
 */
export function makeCases({ api, subtle, vectors }) {
  const { verifyWebhookSignature: verify, signWebhookPayload: sign } = api;
  const list = vectors.vectors;
  const encoder = new TextEncoder();

  return [
    {
      name: 'signatures computed by core verify, in every body form and header spelling',
      run() {
        ok(list.length >= 30, `only ${list.length} vectors`);
        for (const v of list) {
          const hex = v.signature.slice(7);
          for (const [form, body] of bodyForms(v)) {
            const where = `${v.note} (${form})`;
            eq(sign(v.secret, body), v.signature, `sign ${where}`);
            ok(verify(v.secret, body, v.signature), `verify ${where}`);
            ok(verify(v.secret, body, hex), `verify without prefix ${where}`);
            ok(verify(v.secret, body, hex.toUpperCase()), `upper-case hex ${where}`);
            ok(verify(v.secret, body, `sha256=${hex.toUpperCase()}`), `prefix + upper ${where}`);
          }
        }
      },
    },
    {
      name: 'a changed byte of the body fails',
      run() {
        for (const v of list) {
          const body = hexToBytes(v.bodyHex);
          const step = Math.max(1, Math.floor(body.length / 64));
          for (let i = 0; i < body.length; i += step) {
            for (const flip of [0x01, 0x80]) {
              const changed = body.slice();
              changed[i] ^= flip;
              ok(!verify(v.secret, changed, v.signature), `${v.note}: byte ${i} ^ ${flip}`);
            }
          }
          const longer = new Uint8Array(body.length + 1);
          longer.set(body);
          ok(!verify(v.secret, longer, v.signature), `${v.note}: one byte appended`);
          if (body.length > 0) {
            ok(!verify(v.secret, body.subarray(1), v.signature), `${v.note}: first byte cut`);
            ok(
              !verify(v.secret, body.subarray(0, body.length - 1), v.signature),
              `${v.note}: last byte cut`,
            );
          }
          if (typeof v.body === 'string') {
            ok(!verify(v.secret, `${v.body} `, v.signature), `${v.note}: space appended`);
          }
        }
      },
    },
    {
      name: 'a changed secret fails (the key is the secret text exactly)',
      run() {
        for (const v of list) {
          const body = hexToBytes(v.bodyHex);
          for (let i = 0; i < v.secret.length; i++) {
            const changed = changeUnit(v.secret, i);
            ok(!verify(changed, body, v.signature), `${v.note}: secret unit ${i}`);
          }
          ok(!verify(`${v.secret}0`, body, v.signature), `${v.note}: secret appended`);
          if (v.secret.length > 0) {
            ok(!verify(v.secret.slice(1), body, v.signature), `${v.note}: secret cut`);
          }
          if (/^[0-9a-f]{64}$/.test(v.secret)) {
            ok(!verify(v.secret.toUpperCase(), body, v.signature), `${v.note}: upper-case secret`);
            const decoded = String.fromCharCode(...hexToBytes(v.secret));
            ok(!verify(decoded, body, v.signature), `${v.note}: hex-decoded secret`);
          }
        }
      },
    },
    {
      name: 'a changed hex digit of the signature fails',
      run() {
        for (const v of list.slice(0, 4)) {
          const body = hexToBytes(v.bodyHex);
          const hex = v.signature.slice(7);
          for (let i = 0; i < hex.length; i++) {
            for (const digit of HEX) {
              if (digit === hex[i]) continue;
              const changed = hex.slice(0, i) + digit + hex.slice(i + 1);
              ok(!verify(v.secret, body, changed), `${v.note}: digit ${i} -> ${digit}`);
              ok(!verify(v.secret, body, `sha256=${changed}`), `${v.note}: prefixed, digit ${i}`);
            }
          }
        }
      },
    },
    {
      name: 'wrong prefixes and surrounding characters fail',
      run() {
        const v = list[0];
        const body = v.body;
        const hex = v.signature.slice(7);
        const bad = [
          `sha1=${hex}`,
          `SHA256=${hex}`,
          `Sha256=${hex}`,
          `sha256:${hex}`,
          `sha256 =${hex}`,
          `sha256= ${hex}`,
          `sha512=${hex}`,
          `hmac-sha256=${hex}`,
          `sha256=sha256=${hex}`,
          `=${hex}`,
          ` ${v.signature}`,
          `${v.signature} `,
          `${v.signature}\n`,
          `\t${hex}`,
          `${hex}\r\n`,
          `"${v.signature}"`,
          `0x${hex}`,
          `${v.signature},${v.signature}`,
        ];
        for (const header of bad) ok(!verify(v.secret, body, header), JSON.stringify(header));
        ok(verify(v.secret, body, v.signature), 'the good one still verifies');
      },
    },
    {
      name: 'empty, odd-length, wrong-length and non-hex signatures fail',
      run() {
        const v = list[0];
        const body = v.body;
        const hex = v.signature.slice(7);
        const bad = [
          '',
          'sha256=',
          hex.slice(0, 63),
          `${hex}0`,
          hex.slice(0, 62),
          `${hex}00`,
          `sha256=${hex.slice(0, 63)}`,
          `sha256=${hex}0`,
          `sha256=${hex.slice(0, 62)}`,
          hex + hex,
          hex.slice(0, 32),
          `${hex.slice(0, 63)}g`,
          `${hex.slice(0, 63)}-`,
          `${hex.slice(0, 63)}\u00e9`,
          `${hex.slice(0, 62)}\u00e9`,
          `${hex.slice(0, 60)}\u{1f511}`,
          `${hex.slice(0, 63)}\ud800`,
          `${hex.slice(0, 63)}\u0000`,
          'z'.repeat(64),
          '0'.repeat(64),
          'sha256=' + '0'.repeat(64),
          'a'.repeat(1 << 20),
        ];
        for (const header of bad) {
          ok(!verify(v.secret, body, header), `accepted ${JSON.stringify(header.slice(0, 80))}`);
        }
      },
    },
    {
      name: 'agrees with WebCrypto HMAC-SHA-256 on 200 seeded random inputs',
      async run() {
        const rng = seeded(0x7fa06);
        const randomText = (n) => {
          let s = '';
          for (let i = 0; i < n; i++) {
            const kind = rng.below(10);
            if (kind < 5) s += String.fromCharCode(0x20 + rng.below(0x5f));
            else if (kind < 7) s += String.fromCharCode(0x80 + rng.below(0x780));
            else if (kind < 8) s += String.fromCodePoint(0x10000 + rng.below(0xfffff));
            else if (kind < 9) s += String.fromCharCode(0xd800 + rng.below(0x800)); // lone surrogate
            else s += String.fromCharCode(0x800 + rng.below(0xd000));
          }
          return s;
        };
        for (let i = 0; i < 200; i++) {
          const secretKind = rng.below(3);
          const secret =
            secretKind === 0
              ? bytesToHex(rng.bytes(32))
              : secretKind === 1
                ? randomText(rng.below(100))
                : randomText(rng.below(300));
          const size = rng.below(5001);
          const asText = rng.below(4) === 0;
          const body = asText ? randomText(Math.floor(size / 2)) : rng.bytes(size);
          const bodyBytes = asText ? encoder.encode(body) : body;
          const want = await referenceHex(subtle, encoder.encode(secret), bodyBytes);
          const where = `input ${i} (secret kind ${secretKind}, ${bodyBytes.length} bytes)`;
          eq(sign(secret, body), `sha256=${want}`, `sign ${where}`);
          ok(verify(secret, body, `sha256=${want}`), `verify ${where}`);
          ok(verify(secret, bodyBytes, want.toUpperCase()), `verify bytes, upper ${where}`);
          const tag = hexToBytes(want);
          tag[rng.below(32)] ^= 1 << rng.below(8);
          ok(!verify(secret, body, bytesToHex(tag)), `flipped tag bit ${where}`);
          if (bodyBytes.length > 0) {
            const changed = bodyBytes.slice();
            changed[rng.below(changed.length)] ^= 1 << rng.below(8);
            ok(!verify(secret, changed, want), `flipped body bit ${where}`);
          }
        }
      },
    },
    {
      name: 'lone surrogates in strings are encoded as U+FFFD, as TextEncoder does',
      async run() {
        const body = 'a\ud800b\udc00c';
        eq(sign('k', body), sign('k', 'a\ufffdb\ufffdc'), 'body');
        eq(sign('\udfff', 'x'), sign('\ufffd', 'x'), 'secret');
        const want = await referenceHex(
          subtle,
          new Uint8Array([0xef, 0xbf, 0xbd]),
          new Uint8Array([0x61, 0xef, 0xbf, 0xbd, 0x62, 0xef, 0xbf, 0xbd, 0x63]),
        );
        eq(sign('\ud800', body), `sha256=${want}`, 'against WebCrypto on the replaced bytes');
        // A surrogate pair is one character, not two replacements.
        ok(sign('k', '\ud83d\udd11') !== sign('k', '\ufffd\ufffd'), 'pair kept');
      },
    },
    {
      name: 'bad argument types are TypeError',
      run() {
        const good = sign('k', 'b');
        const notStrings = [undefined, null, 1, 1n, true, {}, [], new Uint8Array(1), () => 'k'];
        const notBodies = [
          undefined,
          null,
          0,
          1n,
          false,
          {},
          [1, 2, 3],
          new Uint16Array(2),
          new Int8Array(2),
          new Uint8ClampedArray(2),
          new DataView(new ArrayBuffer(2)),
          { length: 2, 0: 1, 1: 2 },
          Symbol('b'),
        ];
        for (const s of notStrings) {
          throwsTypeError(() => verify(s, 'b', good), `verify secret ${typeof s}`);
          throwsTypeError(() => sign(s, 'b'), `sign secret ${typeof s}`);
          throwsTypeError(() => verify('k', 'b', s), `verify header ${typeof s}`);
        }
        for (const b of notBodies) {
          throwsTypeError(() => verify('k', b, good), `verify body ${String(b?.constructor?.name ?? typeof b)}`);
          throwsTypeError(() => sign('k', b), `sign body ${String(b?.constructor?.name ?? typeof b)}`);
        }
        throwsTypeError(() => verify(), 'verify with no arguments');
        throwsTypeError(() => sign('k'), 'sign without a body');
        // A forged tag does not make a Uint8Array.
        const fake = { [Symbol.toStringTag]: 'Uint8Array', length: 1, 0: 1 };
        throwsTypeError(() => sign('k', fake), 'forged Uint8Array');
        ok(verify('k', 'b', good), 'still works after the errors');
      },
    },
    {
      name: 'large bodies grow the memory and agree with WebCrypto; small calls work after',
      async run() {
        const rng = seeded(0xb16);
        for (const size of [70_000, 1 << 20, 8 << 20]) {
          const body = rng.bytes(size);
          const secret = bytesToHex(rng.bytes(32));
          const want = await referenceHex(subtle, encoder.encode(secret), body);
          eq(sign(secret, body), `sha256=${want}`, `sign ${size} bytes`);
          ok(verify(secret, body, want), `verify ${size} bytes`);
          ok(verify(secret, 'x'.repeat(size), sign(secret, 'x'.repeat(size))), `text ${size}`);
        }
        const v = list[0];
        ok(verify(v.secret, v.body, v.signature), 'small call after large ones');
      },
    },
  ];
}

/** Runs the cases one by one: `[{ name, ok, error }]`, never throws. */
export async function runCases(cases) {
  const results = [];
  for (const { name, run } of cases) {
    const start = Date.now();
    try {
      await run();
      results.push({ name, ok: true, ms: Date.now() - start });
    } catch (error) {
      const ms = Date.now() - start;
      results.push({ name, ok: false, ms, error: String((error && error.stack) || error) });
    }
  }
  return results;
}
