#!/usr/bin/env bash
# EXPERIMENT (not run by scripts/bench.sh or CI): what each proxy-wasm host
# call costs in real Envoy (V8). With bench/experiments/envoy-hostcalls.patch
# applied, bench/empty-filter calls one host function per request
# (PROBE_REPEAT times, or once for modes 11 to 13; see its source). One
# Envoy, one listener per mode plus one without a filter, in front of
# `tfa-bench upstream`; rounds of wrk runs alternate the listeners. Prints
# one line per run: round, concurrency, listener, Envoy's CPU per request
# (user + system from /proc, over the run's requests) and wrk's JSON.
#
#   git apply bench/experiments/envoy-hostcalls.patch
#   cargo build --release --target wasm32-wasip1 -p tfa-bench-empty-filter
#   cargo build --profile host -p tfa-bench
#   [MODES="0 11"] [EXTRA_ROUTES=N] bash bench/experiments/envoy-hostcalls.sh \
#       [rounds] [seconds] [concurrencies]
#
# MODES picks the probe's modes (default: all); EXTRA_ROUTES, below.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=${1:-4}; secs=${2:-4}; concs=${3:-"32 1"}
# EXTRA_ROUTES=N puts N routes that never match before the catch-all one, so
# that resolving a request's route again costs N prefix comparisons more.
extra_routes=""
for i in $(seq 1 "${EXTRA_ROUTES:-0}"); do
    extra_routes+="{ match: { prefix: \"/never-$i/\" }, route: { cluster: upstream } }, "
done
# Mode 13 sets its three claims as filter state; its listener's catch-all
# route turns them into request headers (and removes client-sent copies) as
# the router forwards the request, so no filter changes the headers.
adds=""; removes=""
for kv in x-user-id:tfa_user x-session-id:tfa_session x-user-mfa:tfa_mfa; do
    adds+="${adds:+, }{ header: { key: ${kv%%:*}, value: \"%FILTER_STATE(wasm.${kv#*:}:PLAIN)%\" }, append_action: OVERWRITE_IF_EXISTS_OR_ADD }"
    removes+="${removes:+, }${kv%%:*}"
done
state_headers="request_headers_to_remove: [$removes], request_headers_to_add: [$adds]"
bench=target/host/tfa-bench
probe="$root/target/wasm32-wasip1/release/tfa_bench_empty_filter.wasm"
lua=bench/lua/bench.lua
modes=(${MODES:-0 1 2 3 4 5 6 11 12 13})
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(port); admin=$(port); none=$(port)
declare -A ports
for m in "${modes[@]}"; do ports[$m]=$(port); done
"$bench" upstream --port "$up" --max-secs 3600 2>/dev/null &
up_pid=$!
trap 'kill "$up_pid" ${envoy_pid:-} 2>/dev/null || true; rm -rf "$work"' EXIT
# shellcheck source=bench/envoy-yaml.sh
source "$root/bench/envoy-yaml.sh"
probe_filter() { # mode
    cat <<X
          - name: probe
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: probe_$1
                vm_config:
                  vm_id: probe_$1
                  runtime: envoy.wasm.runtime.v8
                  code: { local: { filename: $probe } }
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: "$1"
X
}
{
    printf 'admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: %s } }\n' "$admin"
    printf 'static_resources:\n  listeners:\n'
    envoy_listener none "$none" "" "$extra_routes"
    for m in "${modes[@]}"; do
        catch_all=""
        [ "$m" = 13 ] && catch_all=$state_headers
        envoy_listener "mode_$m" "${ports[$m]}" "$(probe_filter "$m")" "$extra_routes" "$catch_all"
    done
    envoy_upstream_cluster "$up"
} >"$work/envoy.yaml"
envoy -c "$work/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    --log-path "$work/envoy.log" </dev/null >/dev/null 2>&1 &
envoy_pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/ready" >/dev/null && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$envoy_pid/stat"; }
hz=$(getconf CLK_TCK)
targets=("none:$none")
for m in "${modes[@]}"; do targets+=("mode_$m:${ports[$m]}"); done
for t in "${targets[@]}"; do wrk -t1 -c4 -d1s -s "$lua" "http://127.0.0.1:${t#*:}/" >/dev/null; done
for r in $(seq "$rounds"); do
    for c in $concs; do
        for t in "${targets[@]}"; do
            threads=2; [ "$c" -lt 2 ] && threads=1
            t0=$(ticks)
            j=$(wrk -t"$threads" -c"$c" -d"${secs}s" -s "$lua" "http://127.0.0.1:${t#*:}/" | grep '^{"requests"')
            t1=$(ticks)
            n=$(printf '%s' "$j" | sed 's/^{"requests":\([0-9]*\).*/\1/')
            cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", d / hz * 1e6 / n }')
            echo "$r $c ${t%%:*} cpu_us_per_request=$cpu $j"
        done
    done
done
