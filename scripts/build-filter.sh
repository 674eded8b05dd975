#!/usr/bin/env bash
# Builds the Envoy filter as it ships:
#   target/filter/edge_filter.wasm
# cargo's release build for wasm32-wasip1
# (target/wasm32-wasip1/release/edge_filter.wasm), then binaryen's
# `wasm-opt -O3` over it (Debian package `binaryen`, installed when missing).
# A file of its own, because cargo puts its own build back in its place on
# every `cargo build`, even one that compiles nothing.
#
# Why wasm-opt: rustc/LLVM leave about 45 KB that binaryen's whole-module
# passes remove (duplicate functions, unreachable glue, locals), which takes
# the filter under its 300 KB goal without making it slower in V8
# (BENCHMARKS.md, section 3; docs/decisions.md, "Edge filter"). -O3, not
# -Oz: the filter's other goal is speed.
#
# Idempotent: a stamp beside the module records the digest of the cargo
# build it was made from, so an unchanged build is not optimised twice.
# Every script and test that needs the filter builds it through here
# (scripts/test.sh, test-filter.sh, test-passkeys.sh, bench.sh, and
# tests/src/filter_build.rs when TFA_FILTER_WASM is not set).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

sysroot="$(rustc --print sysroot)"
[ -d "$sysroot/lib/rustlib/wasm32-wasip1/lib" ] || rustup target add wasm32-wasip1
if ! command -v wasm-opt >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binaryen
  else
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binaryen
  fi
fi

cargo build --release --target wasm32-wasip1 -p edge-filter "$@"
target_dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
built="$target_dir/wasm32-wasip1/release/edge_filter.wasm"
mkdir -p "$target_dir/filter"
wasm="$target_dir/filter/edge_filter.wasm"
stamp="$wasm.from"
if [ -f "$wasm" ] && [ -f "$stamp" ] && [ "$(sha256sum <"$built")" = "$(cat "$stamp")" ]; then
  echo "$wasm: up to date ($(wc -c <"$wasm") bytes)"
  exit 0
fi
# The features rustc's wasm32-wasip1 output uses; wasm-opt must keep them.
wasm-opt -O3 --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
  --enable-nontrapping-float-to-int "$built" -o "$wasm.tmp"
mv -f "$wasm.tmp" "$wasm"
sha256sum <"$built" >"$stamp"
echo "$wasm: $(wc -c <"$built") -> $(wc -c <"$wasm") bytes (wasm-opt -O3)"
