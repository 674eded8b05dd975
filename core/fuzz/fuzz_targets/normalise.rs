//! Fuzz target `normalise`: the invariants live in
//! `tfa_core::testing::fuzzing::normalise`, shared with the native replay of
//! `core/fuzz/regressions/normalise/` (`core/tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfa_core::testing::fuzzing::normalise(data));
