#!/usr/bin/env bash
# Builds the component and the local host, then serves the API on
# http://127.0.0.1:${PORT:-3001} with its data in ${DATA_DIR:-./.data}.
#
#   scripts/serve.sh                    # SQLite store in ./.data
#   KV_URL=redis://127.0.0.1:6379 scripts/serve.sh
#   NODE_ENV=production JWT_ACCESS_SECRET=... scripts/serve.sh
#
# Idempotent: re-running only rebuilds what changed. The service's settings
# (JWT_ACCESS_SECRET, TWILIO_*, ...) are read from the environment.
set -euo pipefail

cd "$(dirname "$0")/.."
say() { printf '==> %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
  if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
  else
    say "cargo is not installed (install Rust with rustup first)"
    exit 1
  fi
fi

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -qx 'wasm32-wasip2'; then
    say "adding the wasm32-wasip2 target"
    rustup target add wasm32-wasip2
  fi
else
  say "rustup not found; assuming the wasm32-wasip2 target is installed"
fi

target_dir="${CARGO_TARGET_DIR:-target}"

say "building the components (spin-app and tfa-mailer, wasm32-wasip2, release)"
cargo build --target wasm32-wasip2 --release -p spin-app -p tfa-mailer

say "building the host (tfa-host, profile host; the first build takes several minutes)"
cargo build --profile host -p tfa-host --bin tfa-host

export PORT="${PORT:-3001}"
export DATA_DIR="${DATA_DIR:-./.data}"
export COMPONENT_PATH="${COMPONENT_PATH:-$target_dir/wasm32-wasip2/release/spin_app.wasm}"
say "serving on http://127.0.0.1:${PORT} (data in ${DATA_DIR}); Ctrl-C stops"
exec "$target_dir/host/tfa-host"
