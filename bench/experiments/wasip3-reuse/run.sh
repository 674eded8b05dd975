#!/usr/bin/env bash
# Experiment only (issue 15, target 1; docs/decisions.md, "Where the WASIp3
# route stands upstream"): the floor as a WASIp3 component (WASI 0.3.0,
# wasip3 0.7.1, the WASI spin-sdk 7.0.0 builds on) served by
# wasmtime-wasi-http 48.0.8's ProxyHandler with 128 requests per instance
# and with 1, beside tfa-host serving the WASIp2 floor (fresh instances) and
# plain hyper; wrk at concurrency 32 (requests/s) and 1 (p50), in turn.
# Needs target/host/{tfa-host,tfa-bench} and the release tfa_bench_floor.wasm
# (bash /path/scripts/bench.sh builds them). Usage: run.sh [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"
t="$root/target/experiments/wasip3-reuse"
(cd "$here/floor" && CARGO_TARGET_DIR=$t cargo build -q --release --target wasm32-wasip2)
(cd "$here/serve" && CARGO_TARGET_DIR=$t cargo build -q --release)
serve="$t/release/wasip3-serve"
floor="$t/wasm32-wasip2/release/wasip3_floor.wasm"
data=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$data"' EXIT
"$serve" "$floor" 3821 128 2>"$data/reuse.log" & pids+=($!)
"$serve" "$floor" 3822 1 2>"$data/fresh.log" & pids+=($!)
CACHE_DIR="$data/cache" SPIN_MANIFEST=spin.toml PORT=3812 DATA_DIR="$data/kv" RATE_LIMIT_ENABLED=false \
    COMPONENT_PATH=target/wasm32-wasip2/release/tfa_bench_floor.wasm target/host/tfa-host >/dev/null 2>"$data/host.log" & pids+=($!)
target/host/tfa-bench upstream --port 3823 --threads "$(nproc)" --max-secs 3600 2>/dev/null & pids+=($!)
for i in $(seq 100); do
    curl -sf -o /dev/null http://127.0.0.1:3821/ && curl -sf -o /dev/null http://127.0.0.1:3822/ &&
        curl -sf -o /dev/null http://127.0.0.1:3812/api/health && curl -sf -o /dev/null http://127.0.0.1:3823/ && break
    sleep 0.2
done
for round in $(seq "${1:-3}"); do
    for t in "wasip3-reuse-128 3821/" "wasip3-fresh 3822/" "tfa-host-wasip2-fresh 3812/api/health" "hyper 3823/"; do
        set -- $t
        r32=$(wrk -t2 -c32 -d4s "http://127.0.0.1:$2" | awk '/Requests\/sec/{print $2}')
        p50=$(wrk -t1 -c1 -d2s --latency "http://127.0.0.1:$2" | awk '$1=="50%"{print $2}')
        echo "round=$round $1 c32_requests_per_s=$r32 c1_p50=$p50"
    done
done
