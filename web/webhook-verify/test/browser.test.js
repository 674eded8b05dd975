// Runs test/browser.html (the shared suite, WebCrypto as reference) in real
// headless Chromium: a static server on 127.0.0.1 serves the package
// folder, playwright-core drives the system Chromium, and every result the
// page reports must have passed. Fails, never skips, without Chromium.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { extname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
};

/** Serves files under ROOT (no listing, no `..`), GET and HEAD only. */
function startServer() {
  const server = createServer(async (req, res) => {
    try {
      const path = decodeURIComponent(new URL(req.url, 'http://127.0.0.1').pathname);
      const file = resolve(join(ROOT, path));
      const type = TYPES[extname(file)];
      if (!file.startsWith(ROOT.endsWith(sep) ? ROOT : ROOT + sep) || !type) {
        res.writeHead(404).end();
        return;
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405).end();
        return;
      }
      const body = await readFile(file);
      res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((done, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => done(server));
  });
}

/** `promise`, or a rejection after `ms`: no step of the test can hang. */
function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, fail) => {
    timer = setTimeout(() => fail(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

test('the shared suite passes in headless Chromium', { timeout: 240_000 }, async (t) => {
  assert.ok(
    existsSync(CHROMIUM),
    `Chromium not found at ${CHROMIUM}: apt-get install -y chromium (scripts/test-web.sh does it)`,
  );
  const server = await startServer();
  const profile = mkdtempSync(join(tmpdir(), 'webhook-verify-chromium-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      timeout: 60_000,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    await runPage(t, context, server.address().port);
  } finally {
    // Browser first (it holds connections to the server), then the server.
    if (context) await within(30_000, 'closing Chromium', context.close()).catch(() => {});
    server.closeAllConnections();
    await within(10_000, 'closing the server', new Promise((done) => server.close(done)));
    rmSync(profile, { recursive: true, force: true });
  }
});

async function runPage(t, context, port) {
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(`console: ${message.text()}`);
  });
  page.on('requestfailed', (request) => problems.push(`request failed: ${request.url()}`));
  page.on('response', (response) => {
    if (response.status() >= 400) problems.push(`HTTP ${response.status()}: ${response.url()}`);
  });

  const url = `http://127.0.0.1:${port}/test/browser.html`;
  const response = await page.goto(url, { timeout: 30_000 });
  assert.equal(response.status(), 200, url);
  try {
    await page.waitForFunction(() => window.__done === true, null, { timeout: 180_000 });
  } catch (error) {
    const text = await page.locator('#out').textContent().catch(() => '');
    assert.fail(`the page did not finish: ${error.message}\n${text}\n${problems.join('\n')}`);
  }
  const results = await page.evaluate(() => window.__results);
  const version = context.browser()?.version() ?? 'unknown';
  t.diagnostic(`Chromium ${version}: ${results.length} checks`);
  for (const r of results) t.diagnostic(`${r.ok ? 'ok' : 'FAILED'} ${r.name} (${r.ms} ms)`);

  assert.ok(results.length >= 10, `only ${results.length} results: ${JSON.stringify(results)}`);
  const failed = results.filter((r) => !r.ok);
  assert.deepEqual(
    failed.map((r) => `${r.name}\n${r.error}`),
    [],
    `failed in Chromium:\n${failed.map((r) => `${r.name}: ${r.error}`).join('\n')}`,
  );
  assert.deepEqual(problems, []);
  const names = results.map((r) => r.name);
  assert.ok(names.some((n) => n.includes('WebCrypto')), 'the WebCrypto comparison ran');
}
