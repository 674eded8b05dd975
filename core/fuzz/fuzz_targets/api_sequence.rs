//! Fuzz target `api_sequence`: the invariants live in
//! `tfa_core::testing::fuzzing::api_sequence`, shared with the native replay of
//! `core/fuzz/regressions/api_sequence/` (`core/tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfa_core::testing::fuzzing::api_sequence(data));
