#!/usr/bin/env bash
# The end-to-end scenarios under real Spin instead of the local host: the
# same tests (tests/tests/*.rs) with TFA_E2E_RUNTIME=spin, so that
# e2e::procs::Host::start runs `$SPIN_BIN up --from spin.toml --listen
# 127.0.0.1:<port> --state-dir <fresh dir>` with the settings as Spin
# variables (SPIN_VARIABLE_<NAME>) and Redis through a generated
# runtime-config file.
#
#   SPIN_BIN=/path/to/spin scripts/test-spin.sh
#   SPIN_BIN=... TFA_SPIN_TESTS="api_stores" scripts/test-spin.sh   # a subset
#
# Skips (exit 0, with a message) when SPIN_BIN is not set: Spin is not on
# the package registries; ../shared/spin/BUILD.md builds it from source.
#
# Steps: the components (`$SPIN_BIN build`, unless TFA_COMPONENT_WASM and
# TFA_MAILER_WASM name the ones spin.toml serves), `spin up` with no variables must start with no
# warning and answer, then the test files below, TFA_SPIN_TEST_THREADS
# (default 2) tests at a time. Tests that need hooks only the local host has
# are skipped by name, and listed with the reason. Every Spin process is
# started and stopped by this script or by the tests, on 127.0.0.1 only.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${SPIN_BIN:-}" ] || [ ! -x "${SPIN_BIN:-}" ]; then
  cat <<'EOF'
SKIPPED: SPIN_BIN not set — no Spin binary to run the end-to-end tests under.
  Spin 4.0.2 builds from source (15-80 minutes on 2 cores, once per machine):
  see ../shared/spin/BUILD.md, then run
    SPIN_BIN=/path/to/target/release/spin scripts/test-spin.sh
EOF
  [ -n "${SPIN_BIN:-}" ] && echo "  (SPIN_BIN=$SPIN_BIN is not an executable file)"
  exit 0
fi

started=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }

SPIN_BIN="$(cd "$(dirname "$SPIN_BIN")" && pwd)/$(basename "$SPIN_BIN")"
export SPIN_BIN
threads="${TFA_SPIN_TEST_THREADS:-2}"
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"
# Spin keeps its wasmtime cache under $HOME: the same directory the tests
# use (tests/src/procs.rs), so the component is compiled once.
spin_home="$PWD/target/e2e-spin-home"
mkdir -p "$spin_home"

step "Spin: $SPIN_BIN"
"$SPIN_BIN" --version

step "redis-server"
if ! command -v redis-server >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi
redis-server --version

step "SMTP test tools (for api_email)"
smtp_ok=1
if smtp_env="$(./scripts/test-smtp.sh --install-only | tail -n 1)" && [ -n "$smtp_env" ]; then
  export "${smtp_env:?}"
else
  smtp_ok=""
  echo "not available: api_email is skipped"
fi

step "the components that spin.toml serves (API, mailer)"
manifest_wasm="$PWD/target/wasm32-wasip2/release/spin_app.wasm"
manifest_mailer="$PWD/target/wasm32-wasip2/release/tfa_mailer.wasm"
if [ -n "${TFA_COMPONENT_WASM:-}" ] && [ -n "${TFA_MAILER_WASM:-}" ]; then
  for f in "$TFA_COMPONENT_WASM" "$TFA_MAILER_WASM"; do
    [ -f "$f" ] || { echo "$f does not exist (TFA_COMPONENT_WASM, TFA_MAILER_WASM)" >&2; exit 1; }
  done
  echo "already built: $TFA_COMPONENT_WASM $TFA_MAILER_WASM"
else
  # spin.toml's build commands (cargo build --target wasm32-wasip2 --release
  # -p spin-app, then -p tfa-mailer).
  "$SPIN_BIN" build
  export TFA_COMPONENT_WASM="$manifest_wasm" TFA_MAILER_WASM="$manifest_mailer"
fi
for pair in "$manifest_wasm:$TFA_COMPONENT_WASM" "$manifest_mailer:$TFA_MAILER_WASM"; do
  named="${pair%%:*}" given="${pair#*:}"
  if [ ! -f "$named" ] || [ "$(realpath "$given")" != "$(realpath "$named")" ]; then
    echo "spin.toml serves $named, but the component under test is $given;" >&2
    echo "build it where spin.toml expects it (\`\$SPIN_BIN build\` without CARGO_TARGET_DIR)" >&2
    exit 1
  fi
done
ls -l "$TFA_COMPONENT_WASM" "$TFA_MAILER_WASM"

work="$(mktemp -d "${TMPDIR:-/tmp}/tfa-spin.XXXXXX")"
spin_pid=""
stop_spin() {
  # `spin up` and its `spin trigger` child: one process group (setsid).
  if [ -n "$spin_pid" ]; then
    kill -TERM -- "-$spin_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 -- "-$spin_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$spin_pid" 2>/dev/null || true
    wait "$spin_pid" 2>/dev/null || true
    spin_pid=""
  fi
}
cleanup() {
  stop_spin
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "spin up: no warning, serves (SQLite store, no variables: development defaults)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# --quiet: only Spin's own output (the component's goes to the state dir).
env -i PATH="$PATH" HOME="$spin_home" \
  setsid "$SPIN_BIN" up --from "$PWD/spin.toml" --listen "127.0.0.1:$port" \
  --state-dir "$work/state" --quiet >"$work/up.log" 2>&1 </dev/null &
spin_pid=$!
ready=""
for _ in $(seq 1 3000); do
  if curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$port/api/health/live" 2>/dev/null; then ready=1; break; fi
  kill -0 "$spin_pid" 2>/dev/null || break
  sleep 0.1
done
health="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$port/api/health" 2>/dev/null || true)"
stop_spin
echo "--- spin up's output ---"
cat "$work/up.log"
echo "------------------------"
if [ -z "$ready" ]; then
  echo "spin up did not serve within 300 s" >&2
  exit 1
fi
if [ "$health" != 200 ]; then
  echo "GET /api/health answered $health under spin up, not 200" >&2
  echo "component output:" >&2
  cat "$work/state/logs/"*.txt >&2 || true
  exit 1
fi
if grep -qiE 'warn|deprecat|unknown field|unused' "$work/up.log"; then
  echo "spin up printed a warning:" >&2
  grep -iE 'warn|deprecat|unknown field|unused' "$work/up.log" >&2
  exit 1
fi
echo "no warning; GET /api/health: $health"

# Tests that cannot run under Spin, by name, with the reason.
skip_names=(
  a_failing_store_gives_503_and_the_host_keeps_serving
  data_survives_a_clean_restart_with_the_log_store
  webhook_retries_survive_restarts_until_delivered
)
skip_reasons=(
  "api_stores: store fault injection (TFA_FAIL_STORE_AFTER) is a hook of the local host only"
  "api_stores: the log store (KV_ENGINE=log) is the local host's; Spin has its own stores"
  "api_integrations: the clock hook (TFA_CLOCK_OFFSET_MS) is local-host only, and it allows two extra outbound hosts (spin.toml has one extra_outbound_host)"
)
files=(api_flows api_stores api_keys_audit api_integrations api_email)
[ -n "${TFA_SPIN_TESTS:-}" ] && read -r -a files <<<"$TFA_SPIN_TESTS"
not_run=(
  "api_crash: SIGKILL, then checks the local host's SQLite file DATA_DIR/kv.sqlite3 (Spin's is <state dir>/sqlite_key_value.db)"
  "filter_host, filter_envoy, smtp_client_live: not about the component's host (the Envoy filter, the tfa-smtp client)"
)
if [ -z "$smtp_ok" ]; then
  files=("${files[@]/api_email}")
  not_run+=("api_email: python3 with aiosmtpd or openssl is missing (scripts/test-smtp.sh --install-only failed)")
fi

# --workspace, not -p e2e-tests: the same packages (hence the same feature
# unification) and, from scripts/test.sh, the same lint wrapper as its
# `cargo test --workspace`, so nothing is compiled again (with -p, about 95
# crates were, some 3 minutes).
step "build the tests (a no-op when scripts/test.sh has built them)"
cargo test --workspace --no-run

logs="$target_dir/e2e-spin-logs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$logs"
failed=()
for f in "${files[@]}"; do
  [ -n "$f" ] || continue
  step "cargo test --test $f under Spin ($threads at a time)"
  skip_args=()
  for s in "${skip_names[@]}"; do skip_args+=(--skip "$s"); done
  if ! TFA_E2E_RUNTIME=spin cargo test --workspace --test "$f" -- \
      --test-threads="$threads" "${skip_args[@]}" 2>&1 | tee "$logs/$f.log"; then
    failed+=("$f")
  fi
done

# block_networks (runtime-config.sqlite.toml, as in the Redis file and the
# SpinKube manifest): a webhook to a loopback receiver that spin.toml and
# WEBHOOK_ALLOW_PRIVATE both allow is delivered without the runtime config,
# and refused by Spin after name resolution with it (nothing reaches the
# receiver; the delivery log says why). Bounded waits, 127.0.0.1 only.
block_networks_check() { # $1: runtime config file or "none"; prints the delivery
  local rport port sd rpid spid b tok hid i out
  read -r rport port < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
  : > "$logs/receiver.log"
  python3 -c 'import http.server,sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length",0)))
        print("GOT",self.path,flush=True); self.send_response(200); self.end_headers()
    def log_message(self,*a): pass
http.server.HTTPServer(("127.0.0.1",int(sys.argv[1])),H).serve_forever()' "$rport" >> "$logs/receiver.log" 2>&1 &
  rpid=$!
  mkdir -p "$PWD/target/e2e-scratch"
  sd="$(mktemp -d "$PWD/target/e2e-scratch/spin-block-XXXXXX")"
  local rc=(); [ "$1" != none ] && rc=(--runtime-config-file "$1")
  SPIN_VARIABLE_WEBHOOK_ALLOW_PRIVATE=true SPIN_VARIABLE_EXTRA_OUTBOUND_HOST="http://127.0.0.1:$rport" \
    setsid "$SPIN_BIN" up --from spin.toml --listen "127.0.0.1:$port" --state-dir "$sd" "${rc[@]}" \
    > "$logs/spin-block-$(basename "$1").log" 2>&1 &
  spid=$!
  b="http://127.0.0.1:$port/api"
  for i in $(seq 1 120); do curl -sf -m 1 "$b/health" >/dev/null && break; sleep 0.5; done
  tok=$(curl -s -m 10 -X POST "$b/auth/register" -H 'content-type: application/json' \
    -d '{"email":"block@example.com","username":"block","password":"Str0ng!Passw0rd#"}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["accessToken"])')
  hid=$(curl -s -m 10 -X POST "$b/webhooks" -H "authorization: Bearer $tok" -H 'content-type: application/json' \
    -d "{\"url\":\"http://127.0.0.1:$rport/hook\",\"events\":[\"user.login\"]}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["id"])')
  curl -s -m 10 -X POST "$b/webhooks/$hid/test" -H "authorization: Bearer $tok" -H 'content-type: application/json' -d '{}' >/dev/null
  out=""
  for i in $(seq 1 40); do
    out=$(curl -s -m 10 "$b/webhooks/$hid/deliveries" -H "authorization: Bearer $tok" \
      | python3 -c 'import json,sys; d=json.load(sys.stdin)["data"]["deliveries"][0]; a=d["attempts"]; print(d["status"], a[0]["statusCode"] or "no-status", a[0]["error"] or "") if a else print("waiting")')
    case "$out" in waiting|"") sleep 0.25 ;; *) break ;; esac
  done
  kill -- "-$spid" 2>/dev/null || true; kill "$rpid" 2>/dev/null || true
  wait "$spid" "$rpid" 2>/dev/null || true
  echo "$out | receiver: $(grep -c GOT "$logs/receiver.log" || true) request(s)"
}
step "block_networks: a loopback webhook without and with runtime-config.sqlite.toml"
open_result="$(block_networks_check none)"
echo "without block_networks: $open_result"
blocked_result="$(block_networks_check runtime-config.sqlite.toml)"
echo "with block_networks:    $blocked_result"
case "$open_result" in "succeeded 200 "*"receiver: 1 request(s)") ;; *) failed+=("block_networks control (delivery without it)") ;; esac
case "$blocked_result" in "pending no-status "*"blocked by the host"*"receiver: 0 request(s)") ;; *) failed+=("block_networks (delivery refused by Spin)") ;; esac

step "summary (full logs in $logs)"
for f in "${files[@]}"; do
  [ -n "$f" ] || continue
  echo "$f:"
  grep -E '^test .* \.\.\. ' "$logs/$f.log" | sed 's/^/  /' || echo "  (no test ran: see $logs/$f.log)"
done
echo "skipped under Spin:"
for i in "${!skip_names[@]}"; do
  echo "  ${skip_names[$i]} — ${skip_reasons[$i]}"
done
for n in "${not_run[@]}"; do echo "  $n"; done

# The tests stop every Spin they start; check that none is left.
left="$(pgrep -f -- "$SPIN_BIN .*--state-dir $PWD/target/e2e-scratch" || true)"
if [ -n "$left" ]; then
  echo "Spin processes left running by the tests (pids $left)" >&2
  failed+=("spin processes left running")
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED under Spin: ${failed[*]}" >&2
  exit 1
fi
echo "all selected end-to-end tests passed under Spin in $(( $(date +%s) - started )) s"
