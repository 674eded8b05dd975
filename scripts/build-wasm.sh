#!/usr/bin/env bash
# Builds the wasm artefacts the tests run, as release builds by rustc (not
# clippy-driver, whose output is not the module that ships):
#   <target>/wasm32-wasip2/release/spin_app.wasm     the API component
#   <target>/wasm32-wasip2/release/tfa_mailer.wasm   the mailer component
#   <target>/test-floor/tfa_bench_floor.wasm         the floor component with
#       its test-only routes (`/hang`, `/heavy`...: the host's limit tests,
#       TFA_HANG_WASM), copied aside because the floor without them is built
#       to the same file
#   <target>/filter/edge_filter.wasm                 the Envoy filter
#       (scripts/build-filter.sh)
# scripts/test.sh runs it once per run, after the wasm lint. Idempotent: cargo
# and build-filter.sh rebuild only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"
cargo build --release --target wasm32-wasip2 -p spin-app -p tfa-mailer
cargo build --release --target wasm32-wasip2 -p tfa-bench-floor --features test-routes
mkdir -p "$target_dir/test-floor"
cp "$target_dir/wasm32-wasip2/release/tfa_bench_floor.wasm" "$target_dir/test-floor/tfa_bench_floor.wasm"
./scripts/build-filter.sh
