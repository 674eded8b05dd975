#!/usr/bin/env bash
# Tests the browser/Node webhook-signature package (web/webhook-verify):
# the committed wasm is a fresh build of core's signature code, the Rust
# side's tests, and the JS suite in Node and in headless Chromium.
# Idempotent; installs what it needs (the wasm target, Chromium, npm deps).
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=web/webhook-verify

step() { printf '\n==> %s\n' "$*"; }

step "rust target wasm32-unknown-unknown"
rustup target add wasm32-unknown-unknown

step "chromium"
if [ ! -x /usr/bin/chromium ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi
/usr/bin/chromium --version 2>/dev/null || true

step "npm ci ($pkg)"
(cd "$pkg" && npm ci --no-audit --no-fund)

step "the committed webhook_verify_wasm.js is a fresh build"
"$pkg/build.sh" --check

step "cargo test -p webhook-verify-wasm"
cargo test -p webhook-verify-wasm

step "cargo clippy -p webhook-verify-wasm --target wasm32-unknown-unknown"
cargo clippy -p webhook-verify-wasm --target wasm32-unknown-unknown -- -D warnings

step "node --test (Node and headless Chromium)"
node --test "$pkg"/test/*.test.js
