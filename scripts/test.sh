#!/usr/bin/env bash
# Runs every test of the project: formatting, lints, the native unit and
# scenario tests of core (including the SMTP tests against a real aiosmtpd).
# Idempotent; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain components"
rustup component add clippy rustfmt >/dev/null 2>&1 || true

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

# core/tests/smtp_live.rs fails (never skips) without python3 + aiosmtpd.
step "SMTP test tools"
smtp_env="$(./scripts/test-smtp.sh --install-only | tail -n 1)"
export "${smtp_env:?}"

step "cargo test"
cargo test --workspace
