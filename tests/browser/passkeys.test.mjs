// Passkeys end to end (issue #17): real headless Chromium (Debian's
// `chromium`) with a Chrome DevTools Protocol virtual authenticator (ctap2,
// internal transport, resident keys, user verification) drives
// `navigator.credentials` on a page of the API's own origin, against the
// real component (`spin_app.wasm`) in the local host (`tfa-host`); then real
// Envoy with the edge filter lets the passkey session through a route that
// requires `phishing_resistant` and turns a TOTP session away.
//
// The test starts and stops every process itself, on 127.0.0.1 (the page's
// origin is http://localhost:PORT, mapped to 127.0.0.1), with bounded waits.
// It needs TFA_HOST_BIN, TFA_COMPONENT_WASM and TFA_FILTER_WASM (set by
// scripts/test.sh, or scripts/test-passkeys.sh builds them), `envoy` on the
// PATH and Chromium at CHROMIUM_PATH (default /usr/bin/chromium).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const ROOT = resolve(import.meta.dirname, '..', '..');
const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (scripts/test-passkeys.sh sets it)`);
  return v;
};
const ACCESS_SECRET = 'browser-access-secret-browser-access-secret-0001';
const PASSWORD = 'Correct-Horse-9-battery-staple';

const freePort = () =>
  new Promise((res, rej) => {
    const s = createNetServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `url` until it answers (any status) or `secs` pass.
async function waitHttp(url, secs, proc) {
  const until = Date.now() + secs * 1000;
  while (Date.now() < until) {
    if (proc && proc.exitCode !== null) throw new Error(`${url}: process exited (${proc.exitCode})`);
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await r.arrayBuffer();
      return;
    } catch {
      await sleep(100);
    }
  }
  throw new Error(`${url} did not answer within ${secs} s`);
}

// A child process whose output is kept for failure messages, stopped in
// `after`.
const procs = [];
function start(cmd, args, env) {
  const p = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  p.log = '';
  const keep = (d) => {
    p.log = (p.log + d).slice(-20000);
  };
  p.stdout.on('data', keep);
  p.stderr.on('data', keep);
  procs.push(p);
  return p;
}

// RFC 6238 TOTP (SHA-1, 6 digits, 30 s) of a base32 secret, `step` steps ahead.
function totp(secret, step = 0) {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let bits = '';
  for (const c of secret.replace(/=+$/, '').toUpperCase()) {
    bits += alphabet.indexOf(c).toString(2).padStart(5, '0');
  }
  const key = Buffer.from(bits.match(/.{8}/g).map((b) => parseInt(b, 2)));
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(Math.floor(Date.now() / 30000) + step));
  const h = createHmac('sha1', key).update(counter).digest();
  const o = h[h.length - 1] & 0xf;
  return String((h.readUInt32BE(o) & 0x7fffffff) % 1000000).padStart(6, '0');
}

const claimsOf = (jwt) => JSON.parse(Buffer.from(jwt.split('.')[1], 'base64url').toString());

let api; // http://localhost:PORT/api
let port;
let dataDir;
let browser;
let page;
let cdp;
let envoyPort;
let upstreamSeen = [];
let upstream;

async function call(method, path, body, token) {
  const r = await fetch(`http://127.0.0.1:${port}/api${path}`, {
    method,
    headers: {
      'content-type': 'application/json',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
}

// The page's helpers: the README's snippet, on window.
const PAGE = `<!doctype html><meta charset="utf-8"><title>passkeys</title>
<script type="module">
const api = (path, body, token) => fetch("/api" + path, {
  method: "POST", body: JSON.stringify(body ?? {}),
  headers: { "Content-Type": "application/json", ...(token && { Authorization: "Bearer " + token }) },
}).then(r => r.json());
window.enrol = async (accessToken, name) => {
  const { data } = await api("/2fa/webauthn/register/options", {}, accessToken);
  const cred = await navigator.credentials.create({
    publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(data) });
  return api("/2fa/webauthn/register/verify", { credential: cred.toJSON(), name }, accessToken);
};
window.assertFor = async (tempToken) => {
  const { data } = await api("/2fa/webauthn/options", { tempToken });
  const cred = await navigator.credentials.get({
    publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(data) });
  return cred.toJSON();
};
window.secondStep = async (tempToken, credential) =>
  api("/2fa/verify-webauthn", { tempToken, credential });
window.passwordless = async () => {
  const { data } = await api("/auth/passkey/options");
  const cred = await navigator.credentials.get({
    publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(data) });
  return api("/auth/passkey/verify", { credential: cred.toJSON() });
};
window.ready = true;
</script>`;

async function addAuthenticator() {
  const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
    options: {
      protocol: 'ctap2',
      transport: 'internal',
      hasResidentKey: true,
      hasUserVerification: true,
      isUserVerified: true,
      automaticPresenceSimulation: true,
    },
  });
  return authenticatorId;
}

async function register(name) {
  const r = await call('POST', '/auth/register', {
    email: `${name}@example.com`,
    username: name,
    password: PASSWORD,
  });
  assert.equal(r.status, 201, JSON.stringify(r.json));
  return r.json.data.accessToken;
}

async function login(name) {
  const r = await call('POST', '/auth/login', { emailOrUsername: name, password: PASSWORD });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.data;
}

before(async () => {
  port = await freePort();
  dataDir = mkdtempSync(join(tmpdir(), 'tfa-passkeys-'));
  const host = start(need('TFA_HOST_BIN'), [], {
    PATH: process.env.PATH,
    PORT: String(port),
    DATA_DIR: dataDir,
    CACHE_DIR: join(ROOT, 'target', 'e2e-compile-cache'),
    COMPONENT_PATH: need('TFA_COMPONENT_WASM'),
    SPIN_MANIFEST: join(ROOT, 'spin.toml'),
    JWT_ACCESS_SECRET: ACCESS_SECRET,
    JWT_REFRESH_SECRET: 'browser-refresh-secret-browser-refresh-secret-02',
    TEMP_TOKEN_SECRET: 'browser-temp-secret-browser-temp-secret-browser-03',
    DEVICE_TOKEN_SECRET: 'browser-device-secret-browser-device-secret-br-04',
    ARGON2_MEMORY_KIB: '1024',
    ARGON2_ITERATIONS: '1',
    RATE_LIMIT_ENABLED: 'false',
    WEBAUTHN_RP_ID: 'localhost',
    WEBAUTHN_ORIGINS: `http://localhost:${port}`,
  });
  await waitHttp(`http://127.0.0.1:${port}/api/health`, 120, host).catch((e) => {
    throw new Error(`${e.message}\n${host.log}`);
  });
  api = `http://localhost:${port}/api`;

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
    args: ['--no-sandbox', '--host-resolver-rules=MAP localhost 127.0.0.1'],
    timeout: 60000,
  });
  const context = await browser.newContext();
  page = await context.newPage();
  // The page comes from the API's own origin: the browser asks the API's
  // address for it and this route answers (every other request, the API
  // calls, goes to the real component).
  await page.route(`http://localhost:${port}/passkeys.html`, (route) =>
    route.fulfill({ status: 200, contentType: 'text/html', body: PAGE }),
  );
  await page.goto(`http://localhost:${port}/passkeys.html`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 10000 });
  cdp = await context.newCDPSession(page);
  await cdp.send('WebAuthn.enable');
});

after(async () => {
  await browser?.close().catch(() => {});
  upstream?.close();
  for (const p of procs) p.kill('SIGTERM');
  for (const p of procs) {
    for (let i = 0; i < 50 && p.exitCode === null && p.signalCode === null; i++) await sleep(100);
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

// Filled by the tests below, in order.
const s = {};

test('enrol a passkey in Chromium: 201, the credential, and 10 backup codes for a first method', async () => {
  s.authA = await addAuthenticator();
  const access = await register('alice');
  const r = await page.evaluate(([t]) => window.enrol(t, 'Virtual key'), [access]);
  assert.equal(r.success, true, JSON.stringify(r));
  assert.equal(r.data.credential.name, 'Virtual key');
  assert.equal(r.data.backupCodes.length, 10);
  const list = await call('GET', '/2fa/webauthn/credentials', undefined, access);
  assert.equal(list.json.data.credentials.length, 1);
  const methods = await call('GET', '/2fa/methods', undefined, access);
  assert.match(JSON.stringify(methods.json.data), /webauthn/);
  const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId: s.authA });
  assert.equal(credentials.length, 1);
  assert.equal(credentials[0].isResidentCredential, true);
  // Log out: the enrolment session ends.
  const out = await call('POST', '/auth/logout', {}, access);
  assert.equal(out.status, 200, JSON.stringify(out.json));
  assert.equal((await call('GET', '/auth/me', undefined, access)).status, 401);
});

test('log in with password + passkey: the session is multi-factor and says hwk/swk', async () => {
  const l = await login('alice');
  assert.equal(l.requiresTwoFactor, true);
  assert.ok(l.availableMethods.includes('webauthn'), JSON.stringify(l));
  const credential = await page.evaluate(([t]) => window.assertFor(t), [l.tempToken]);
  const r = await page.evaluate(([t, c]) => window.secondStep(t, c), [l.tempToken, credential]);
  assert.equal(r.success, true, JSON.stringify(r));
  const c = claimsOf(r.data.accessToken);
  assert.equal(c.mfa, true);
  assert.ok(c.amr.includes('pwd') && c.amr.includes('mfa'), JSON.stringify(c.amr));
  assert.ok(c.amr.includes('hwk') || c.amr.includes('swk'), JSON.stringify(c.amr));
  assert.equal((await call('GET', '/auth/me', undefined, r.data.accessToken)).status, 200);
  // The same assertion again: its challenge is spent.
  const l2 = await login('alice');
  const replay = await call('POST', '/2fa/verify-webauthn', { tempToken: l2.tempToken, credential });
  assert.equal(replay.status, 400, JSON.stringify(replay.json));
  assert.equal(replay.json.success, false);
});

test('passwordless sign-in with the discoverable credential: a full, multi-factor session', async () => {
  const r = await page.evaluate(() => window.passwordless());
  assert.equal(r.success, true, JSON.stringify(r));
  const c = claimsOf(r.data.accessToken);
  assert.equal(c.mfa, true);
  assert.ok(c.amr.includes('hwk') || c.amr.includes('swk'), JSON.stringify(c.amr));
  assert.ok(!c.amr.includes('pwd'), JSON.stringify(c.amr));
  const me = await call('GET', '/auth/me', undefined, r.data.accessToken);
  assert.equal(me.json.data.username, 'alice');
  s.passkeyToken = r.data.accessToken;
});

test('an authenticator that holds no registered credential is refused', async () => {
  await cdp.send('WebAuthn.removeVirtualAuthenticator', { authenticatorId: s.authA });
  const authB = await addAuthenticator();
  // Passwordless: the browser finds no credential for this RP on it.
  const err = await page.evaluate(() => window.passwordless().then(() => 'no error', (e) => e.name));
  assert.equal(err, 'NotAllowedError');
  // Second step for alice: her credential is not on it either.
  const l = await login('alice');
  const err2 = await page.evaluate(
    ([t]) => window.assertFor(t).then(() => 'no error', (e) => e.name),
    [l.tempToken],
  );
  assert.equal(err2, 'NotAllowedError');
  // A credential of another user on the new authenticator is refused for alice.
  const bob = await register('bob');
  const enrolled = await page.evaluate(([t]) => window.enrol(t, 'Bob key'), [bob]);
  assert.equal(enrolled.success, true, JSON.stringify(enrolled));
  const bobLogin = await login('bob');
  const bobCredential = await page.evaluate(([t]) => window.assertFor(t), [bobLogin.tempToken]);
  const aliceLogin = await login('alice');
  const crossed = await call('POST', '/2fa/verify-webauthn', {
    tempToken: aliceLogin.tempToken,
    credential: bobCredential,
  });
  assert.equal(crossed.status, 400, JSON.stringify(crossed.json));
  await cdp.send('WebAuthn.removeVirtualAuthenticator', { authenticatorId: authB });
});

test('a TOTP session for the phishing-resistant route', async () => {
  const access = await register('carol');
  const setup = await call('POST', '/2fa/totp/setup', undefined, access);
  assert.equal(setup.status, 200, JSON.stringify(setup.json));
  const v = await call('POST', '/2fa/totp/verify-setup', { code: totp(setup.json.data.secret) }, access);
  assert.equal(v.status, 200, JSON.stringify(v.json));
  const l = await login('carol');
  const r = await call('POST', '/2fa/verify', { tempToken: l.tempToken, code: totp(setup.json.data.secret, 1) });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const c = claimsOf(r.json.data.accessToken);
  assert.equal(c.mfa, true);
  assert.ok(c.amr.includes('otp'), JSON.stringify(c.amr));
  s.totpToken = r.json.data.accessToken;
});

test('real Envoy + edge filter: phishing_resistant lets the passkey session through, not the TOTP one', async () => {
  assert.ok(s.passkeyToken && s.totpToken, 'earlier tests set the tokens');
  const upPort = await freePort();
  upstream = createServer((req, res) => {
    upstreamSeen.push({ path: req.url, headers: req.headers });
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('upstream');
  });
  await new Promise((r) => upstream.listen(upPort, '127.0.0.1', r));
  envoyPort = await freePort();
  const admin = await freePort();
  const cfg = {
    secrets: [ACCESS_SECRET],
    default: 'auth',
    rules: [{ prefix: '/secure', require: 'phishing_resistant' }],
    forward_claims: { sub: 'x-user-id', mfa: 'x-user-mfa', amr: 'x-user-amr' },
  };
  const dir = mkdtempSync(join(tmpdir(), 'tfa-passkeys-envoy-'));
  const yaml = `
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: ${admin} } }
static_resources:
  listeners:
  - name: edge
    address: { socket_address: { address: 127.0.0.1, port_value: ${envoyPort} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{ match: { prefix: "/" }, route: { cluster: app } }]
          http_filters:
          - name: tfa.edge_filter
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tfa_edge
                vm_config:
                  vm_id: tfa_edge
                  runtime: envoy.wasm.runtime.v8
                  code: { local: { filename: ${need('TFA_FILTER_WASM')} } }
                fail_open: false
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '${JSON.stringify(cfg)}'
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: app
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: ${upPort} } } } }] }]
`;
  writeFileSync(join(dir, 'envoy.yaml'), yaml);
  const envoy = start(
    'envoy',
    ['-c', join(dir, 'envoy.yaml'), '--concurrency', '1', '--disable-hot-restart', '--log-level', 'warn',
      '--base-id', String(10000 + Math.floor(Math.random() * 50000))],
    { PATH: process.env.PATH, HOME: dir },
  );
  try {
    await waitHttp(`http://127.0.0.1:${admin}/ready`, 60, envoy);
    for (let i = 0; i < 100; i++) {
      const r = await fetch(`http://127.0.0.1:${admin}/ready`);
      if ((await r.text()).trim() === 'LIVE') break;
      await sleep(100);
    }
  } catch (e) {
    throw new Error(`${e.message}\n${envoy.log}`);
  }
  const get = async (path, token) => {
    const r = await fetch(`http://127.0.0.1:${envoyPort}${path}`, {
      headers: token ? { authorization: `Bearer ${token}`, 'x-user-amr': 'hwk' } : {},
    });
    return { status: r.status, body: await r.text() };
  };
  upstreamSeen = [];
  const ok = await get('/secure/area', s.passkeyToken);
  assert.equal(ok.status, 200, ok.body);
  const seen = upstreamSeen.at(-1);
  assert.equal(seen.path, '/secure/area');
  const amr = claimsOf(s.passkeyToken).amr;
  assert.equal(seen.headers['x-user-amr'], amr.join(' '));
  assert.equal(seen.headers['x-user-mfa'], 'true');
  // The TOTP session is multi-factor but not phishing-resistant.
  upstreamSeen = [];
  const refused = await get('/secure/area', s.totpToken);
  assert.equal(refused.status, 403, refused.body);
  assert.equal(JSON.parse(refused.body).success, false);
  assert.equal(upstreamSeen.length, 0);
  // Elsewhere (the default `auth`), the TOTP session passes, and the amr it
  // sent itself was replaced by its token's.
  const other = await get('/elsewhere', s.totpToken);
  assert.equal(other.status, 200, other.body);
  assert.equal(upstreamSeen.at(-1).headers['x-user-amr'], claimsOf(s.totpToken).amr.join(' '));
  assert.equal((await get('/secure/area')).status, 401);
  rmSync(dir, { recursive: true, force: true });
});
