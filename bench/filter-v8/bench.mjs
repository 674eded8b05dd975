// The edge filter's own cost in V8, outside Envoy: a minimal proxy-wasm
// host (ABI 0.2.1) in Node.js drives `edge_filter.wasm` through the calls
// Envoy makes per request (context create, request headers, done, log,
// delete) and times them. Node's V8 is the engine Envoy embeds, so the
// figure is what our wasm and its host calls cost, without Envoy's own
// work. `--cpu-prof` on this script gives a per-function profile when the
// filter is built with its name section (see scripts/bench.sh).
//
//   node bench/filter-v8/bench.mjs FILTER.wasm CONFIG_JSON TOKEN [--secs N] [--runs N]
//
// Prints one JSON line per run: {"variant":..,"ns_per_request":..}. The
// variants: "allow" (valid token, the default rule), "deny" (a bad
// signature), "none" (a path under a `none` rule: the floor of the filter
// glue without token work). Nothing is asserted; the numbers go to
// BENCHMARKS.md through bench/report.py.
import { readFileSync } from 'node:fs';
import { WASI } from 'node:wasi';

const [, , wasmPath, configJson, token, ...rest] = process.argv;
if (!wasmPath || !configJson || !token) {
  console.error('usage: bench.mjs FILTER.wasm CONFIG_JSON TOKEN [--secs N] [--runs N]');
  process.exit(2);
}
const opt = (name, dflt) => {
  const i = rest.indexOf(name);
  return i >= 0 ? Number(rest[i + 1]) : dflt;
};
const SECS = opt('--secs', 2);
const RUNS = opt('--runs', 3);

const enc = new TextEncoder();
const dec = new TextDecoder();
let instance;
let mem = () => new DataView(instance.exports.memory.buffer);
let bytes = () => new Uint8Array(instance.exports.memory.buffer);

// What the filter sees for the current request.
let requestHeaders = [];
let requestSerialised = new Uint8Array(4);
const EMPTY_MAP = new Uint8Array(4);
let replaced = 0;
let localResponses = 0;
const config = enc.encode(configJson);

function readStr(ptr, len) {
  return dec.decode(bytes().subarray(ptr, ptr + len));
}
// Copies `data` into guest memory allocated by the guest, and writes the
// pointer and length to the two out-parameters.
function give(data, retPtr, retLen) {
  const p = instance.exports.proxy_on_memory_allocate(data.length);
  bytes().set(data, p);
  mem().setUint32(retPtr, p, true);
  mem().setUint32(retLen, data.length, true);
}
// The ABI's header-map serialisation: count, (key len, value len)*, then
// each key and value followed by a NUL.
function serialise(pairs) {
  const enc_ = pairs.map(([k, v]) => [enc.encode(k), enc.encode(v)]);
  let size = 4 + enc_.length * 8;
  for (const [k, v] of enc_) size += k.length + 1 + v.length + 1;
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setUint32(0, enc_.length, true);
  let o = 4;
  for (const [k, v] of enc_) {
    dv.setUint32(o, k.length, true);
    dv.setUint32(o + 4, v.length, true);
    o += 8;
  }
  for (const [k, v] of enc_) {
    out.set(k, o);
    o += k.length + 1;
    out.set(v, o);
    o += v.length + 1;
  }
  return out;
}

const OK = 0;
const NOT_FOUND = 1;
const env = {
  proxy_log: () => OK,
  proxy_get_log_level: (ret) => (mem().setUint32(ret, 2, true), OK),
  proxy_get_current_time_nanoseconds: (ret) => {
    mem().setBigUint64(ret, BigInt(Date.now()) * 1000000n, true);
    return OK;
  },
  proxy_set_tick_period_milliseconds: () => OK,
  proxy_get_buffer_bytes: (type, start, max, retPtr, retLen) => {
    if (type !== 7 /* plugin configuration */) return NOT_FOUND;
    give(config.subarray(start, start + max), retPtr, retLen);
    return OK;
  },
  proxy_get_header_map_pairs: (type, retPtr, retLen) => {
    give(type === 0 ? requestSerialised : EMPTY_MAP, retPtr, retLen);
    return OK;
  },
  proxy_get_header_map_value: (type, kp, kl, retPtr, retLen) => {
    const k = readStr(kp, kl);
    const hit = requestHeaders.find(([n]) => n === k);
    if (!hit) return NOT_FOUND;
    give(enc.encode(hit[1]), retPtr, retLen);
    return OK;
  },
  proxy_replace_header_map_value: (type, kp, kl, vp, vl) => {
    readStr(kp, kl);
    readStr(vp, vl);
    replaced++;
    return OK;
  },
  proxy_remove_header_map_value: () => OK,
  proxy_add_header_map_value: () => OK,
  proxy_send_local_response: () => (localResponses++, OK),
  proxy_define_metric: (type, np, nl, ret) => {
    mem().setUint32(ret, 1, true);
    return OK;
  },
  proxy_increment_metric: () => OK,
  proxy_record_metric: () => OK,
  proxy_get_metric: () => NOT_FOUND,
  proxy_get_shared_data: () => NOT_FOUND,
  proxy_set_shared_data: () => OK,
  proxy_get_property: () => NOT_FOUND,
  proxy_set_property: () => OK,
  proxy_continue_stream: () => OK,
  proxy_close_stream: () => OK,
  proxy_http_call: () => 1,
  proxy_set_effective_context: () => OK,
  proxy_done: () => OK,
};
// Any import this list lacks answers "not found" (and is named once).
const envProxy = new Proxy(env, {
  get(target, name) {
    if (name in target) return target[name];
    console.error(`bench.mjs: stub for ${String(name)}`);
    target[name] = () => NOT_FOUND;
    return target[name];
  },
});

const wasi = new WASI({ version: 'preview1', args: [], env: {}, returnOnExit: true });
const module = new WebAssembly.Module(readFileSync(wasmPath));
const imports = { env: envProxy, wasi_snapshot_preview1: wasi.wasiImport };
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module === 'env' && imp.kind === 'function') envProxy[imp.name];
}
instance = new WebAssembly.Instance(module, imports);
wasi.initialize(instance);
const x = instance.exports;

const ROOT = 1;
x.proxy_on_context_create(ROOT, 0);
if (!x.proxy_on_vm_start(ROOT, 0)) throw new Error('vm start refused');
if (!x.proxy_on_configure(ROOT, config.length)) throw new Error('configuration refused');

const base = [
  [':method', 'GET'],
  [':scheme', 'http'],
  [':authority', '127.0.0.1:10000'],
  ['user-agent', 'wrk'],
  ['accept', '*/*'],
  ['x-forwarded-proto', 'http'],
  ['x-request-id', '8d4f6f43-55a5-4f0e-9d55-0c5c9d3f2b11'],
];
const variants = {
  allow: [...base, [':path', '/'], ['authorization', `Bearer ${token}`]],
  deny: [...base, [':path', '/'], ['authorization', `Bearer ${token.slice(0, -2)}AA`]],
  none: [...base, [':path', '/health'], ['authorization', `Bearer ${token}`]],
};

let ctx = 2;
// Each variant's headers are serialised once: the harness's own work per
// request stays a copy into guest memory, as in Envoy.
const serialised = new Map(Object.values(variants).map((h) => [h, serialise(h)]));
function request(headers) {
  requestHeaders = headers;
  requestSerialised = serialised.get(headers);
  const id = ctx++;
  x.proxy_on_context_create(id, ROOT);
  const action = x.proxy_on_request_headers(id, headers.length, 1);
  x.proxy_on_done(id);
  x.proxy_on_log(id);
  x.proxy_on_delete(id);
  return action;
}

// A sanity check before timing: the valid token passes (Continue = 0) and
// sets headers; the bad one is answered locally.
replaced = 0;
if (request(variants.allow) !== 0 || replaced === 0) throw new Error('valid token not allowed');
localResponses = 0;
request(variants.deny);
if (localResponses !== 1) throw new Error('bad token not refused');

for (let run = 1; run <= RUNS; run++) {
  for (const [name, headers] of Object.entries(variants)) {
    // Warm-up: let V8 tier the code up.
    for (let i = 0; i < 20000; i++) request(headers);
    let n = 0;
    const start = process.hrtime.bigint();
    const until = start + BigInt(Math.round(SECS * 1e9));
    let now = start;
    while (now < until) {
      for (let i = 0; i < 1000; i++) request(headers);
      n += 1000;
      now = process.hrtime.bigint();
    }
    const ns = Number(now - start) / n;
    console.log(JSON.stringify({ variant: name, run, ns_per_request: Math.round(ns) }));
  }
}
