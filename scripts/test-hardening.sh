#!/usr/bin/env bash
# The core-level hardening suite (issue #9): short fuzzing of every target,
# then the adversarial, fault, model and regression tests. Idempotent;
# needs only the stable toolchain (scripts/fuzz.sh builds the fuzz binaries
# itself). About three minutes on a two-core machine once built.
#
#   scripts/test-hardening.sh             fuzz --short, then the tests
#   FUZZ_SECONDS=5 scripts/test-hardening.sh   shorter fuzzing
#   SKIP_FUZZ=1 scripts/test-hardening.sh      tests only
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if [ -z "${SKIP_FUZZ:-}" ]; then
  step "fuzzing (short)"
  scripts/fuzz.sh --short
fi

step "hardening tests"
cargo test -p tfa-core \
  --test fuzz_regressions \
  --test hardening_tokens \
  --test hardening_input \
  --test hardening_faults \
  --test hardening_model \
  --test hardening_config \
  --test hardening_argon2
