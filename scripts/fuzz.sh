#!/usr/bin/env bash
# Fuzzes tfa-core and the Envoy filter's configuration parser with libFuzzer
# (crate libfuzzer-sys), without cargo-fuzz: the script builds the fuzz
# binaries with the coverage instrumentation cargo-fuzz would ask for
# (LLVM's SanitizerCoverage: inline 8-bit counters, PC table, compare
# tracing; `--cfg fuzzing`, debug assertions and overflow checks on) and runs
# them itself. The short mode needs only the stable toolchain, so a fresh
# machine installs neither nightly nor cargo-fuzz for the test command.
#
#   scripts/fuzz.sh [--short]   each target for FUZZ_SECONDS (default 20) s,
#                               no sanitizer (core forbids unsafe code); this is
#                               what scripts/test.sh and test-hardening.sh run.
#   scripts/fuzz.sh --long      each target for FUZZ_SECONDS (default 1800 =
#                               30 min) s under AddressSanitizer, 2 jobs
#                               (needs nightly for -Zsanitizer; installed when
#                               missing).
#   FUZZ_TARGETS="jwt_parse filter_config" scripts/fuzz.sh   only those targets.
#
# Targets: api_sequence, jwt_parse, signature_header, normalise, webauthn_parse (core/fuzz)
# and filter_config (edge-filter/fuzz). For a target in <crate>/fuzz, seeds
# come from <crate>/fuzz/seeds/<target>/; the growing corpus stays in
# <crate>/fuzz/corpus/<target>/ (not committed). An input that breaks an
# invariant is copied to <crate>/fuzz/regressions/<target>/, where the native
# test <crate>/tests/fuzz_regressions.rs replays it on every `cargo test`; the
# script then fails. Execution counts of the run are written to
# target/fuzz-summary.txt. `cargo fuzz run <target>` in <crate> still works
# for anyone who has cargo-fuzz (the fuzz crates are ordinary cargo-fuzz
# projects).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

mode=short
case "${1:---short}" in
  --short) mode=short ;;
  --long) mode=long ;;
  *) echo "usage: $0 [--short|--long]" >&2; exit 2 ;;
esac
if [ "$mode" = short ]; then
  secs="${FUZZ_SECONDS:-20}"; sanitizer=none; parallel=()
else
  secs="${FUZZ_SECONDS:-1800}"; sanitizer=address; parallel=(-jobs=2 -workers=2)
fi
targets=(${FUZZ_TARGETS:-api_sequence jwt_parse signature_header normalise webauthn_parse filter_config})
crate_of() { if [ "$1" = filter_config ]; then echo edge-filter; else echo core; fi; }

# The instrumentation of a libFuzzer build. --target keeps RUSTFLAGS away
# from build scripts and proc macros, which run on the host uninstrumented.
flags=(--cfg fuzzing -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cdebug-assertions -Coverflow-checks)
toolchain=()
if [ "$sanitizer" = address ]; then
  rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
  toolchain=(+nightly)
  flags+=(-Zsanitizer=address)
fi
triple="$(rustc -vV | sed -n 's/^host: //p')"
bin_dir="$root/target/fuzz/$triple/release"

mkdir -p "$root/target"
summary="$root/target/fuzz-summary.txt"
: > "$summary"

# 1. Build each fuzz crate once.
built=""
for t in "${targets[@]}"; do
  crate="$(crate_of "$t")"
  case " $built " in
    *" $crate "*) ;;
    *)
      echo "==> build the fuzz targets of $crate (sanitizer: $sanitizer)"
      (cd "$root/$crate" && RUSTFLAGS="${flags[*]}" cargo "${toolchain[@]}" build --release \
        --manifest-path "$root/$crate/fuzz/Cargo.toml" --target "$triple" --target-dir "$root/target/fuzz")
      built="$built $crate"
      ;;
  esac
done

# 2. Run the targets. Each libFuzzer process is single-threaded, so the
# short mode runs as many targets at once as there are cores (each still
# gets its FUZZ_SECONDS of a whole core); the long mode's 2 jobs per target
# use the cores already, so its targets run one after the other. Each
# target writes its own log and exit code; step 3 reads them in order.
if [ "$mode" = short ]; then
  at_once="$(nproc 2>/dev/null || echo 1)"
else
  at_once=1
fi
run_target() { # target -> <crate>/fuzz/last-run/<target>.{log,rc}
  local t="$1" crate fz corpus dict log rc
  crate="$(crate_of "$t")"
  fz="$root/$crate/fuzz"
  mkdir -p "$fz/last-run"
  corpus="$fz/corpus/$t"
  mkdir -p "$corpus" "$fz/regressions/$t" "$fz/artifacts/$t"
  cp -n "$fz/seeds/$t"/* "$corpus"/ 2>/dev/null || true
  dict=()
  if [ "$t" = api_sequence ]; then dict=(-dict="$fz/api.dict"); fi
  log="$fz/last-run/$t.log"
  echo "==> fuzz $t for ${secs}s"
  # Its own working directory: with -jobs, libFuzzer writes fuzz-<n>.log
  # there, and targets running at once must not mix theirs.
  mkdir -p "$fz/last-run/$t.dir"
  set +e
  (cd "$fz/last-run/$t.dir" && "$bin_dir/$t" "$corpus" \
    -max_total_time="$secs" -max_len=4096 -len_control=0 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "${parallel[@]}" "${dict[@]}" \
    -artifact_prefix="$fz/artifacts/$t/") >"$log" 2>&1
  rc=$?
  set -e
  for l in "$fz/last-run/$t.dir"/fuzz-*.log; do
    if [ -e "$l" ]; then cat "$l" >>"$log"; rm -f "$l"; fi
  done
  rmdir "$fz/last-run/$t.dir" 2>/dev/null || true
  echo "$rc" >"$fz/last-run/$t.rc"
}
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$at_once" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  # A run that dies before writing its exit code must not be read as the
  # last run's.
  rm -f "$root/$(crate_of "$t")/fuzz/last-run/$t.rc"
  run_target "$t" &
  running=$((running + 1))
done
wait || true

# 3. Results, in the targets' order.
failed=0
for t in "${targets[@]}"; do
  crate="$(crate_of "$t")"
  fz="$root/$crate/fuzz"
  log="$fz/last-run/$t.log"
  rc="$(cat "$fz/last-run/$t.rc" 2>/dev/null || echo 1)"
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" 2>/dev/null | awk '{s+=$2} END {print s+0}')
  echo "$t: $execs executions in ${secs}s (exit $rc)" | tee -a "$summary"
  found=0
  for f in "$fz/artifacts/$t"/crash-* "$fz/artifacts/$t"/timeout-* "$fz/artifacts/$t"/oom-*; do
    [ -e "$f" ] || continue
    cp "$f" "$fz/regressions/$t/$(basename "$f")"
    echo "   new regression case: $crate/fuzz/regressions/$t/$(basename "$f")"
    rm -f "$f"
    found=1
  done
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    tail -n 40 "$log"
    failed=1
  fi
done
exit "$failed"
