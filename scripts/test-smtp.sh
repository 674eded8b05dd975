#!/usr/bin/env bash
# E-mail over SMTP: the SMTP client's unit tests (crate tfa-smtp), then the live tests
# against a real SMTP server (aiosmtpd, started and stopped by each test on
# 127.0.0.1; see tests/smtp/server.py). Idempotent: installs what is missing.
#
#   ./scripts/test-smtp.sh                 # install if needed, run the tests
#   ./scripts/test-smtp.sh --install-only  # only make sure the tools exist;
#                                          # prints TFA_PYTHON=<python> last
#
# The live tests use $TFA_PYTHON (default python3). When the system Python
# refuses `pip install` (PEP 668), aiosmtpd goes into a virtualenv under
# target/smtp-venv and TFA_PYTHON points at it.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "SMTP test tools (python3, aiosmtpd, openssl)"
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is required for the SMTP tests (apt-get install python3)" >&2
    exit 1
fi
if ! command -v openssl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -q openssl >/dev/null
    else
        echo "openssl is required for the SMTP tests (apt-get install openssl)" >&2
        exit 1
    fi
fi
PY="${TFA_PYTHON:-python3}"
if ! "$PY" -c 'import aiosmtpd' >/dev/null 2>&1; then
    if ! "$PY" -m pip install --quiet aiosmtpd >/dev/null 2>&1; then
        venv=target/smtp-venv
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet aiosmtpd >&2
        PY="$PWD/$venv/bin/python"
    fi
fi
"$PY" -c 'import aiosmtpd; print("aiosmtpd", aiosmtpd.__version__)' >&2
export TFA_PYTHON="$PY"

if [ "${1:-}" = "--install-only" ]; then
    echo "TFA_PYTHON=$PY"
    exit 0
fi

step "core SMTP client (scripted servers, property tests)"
cargo test -p tfa-smtp

step "core SMTP client against aiosmtpd (plain, STARTTLS, implicit TLS, AUTH)"
cargo test -p e2e-tests --test smtp_client_live
