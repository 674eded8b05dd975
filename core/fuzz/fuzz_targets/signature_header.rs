//! Fuzz target `signature_header`: the invariants live in
//! `tfa_core::testing::fuzzing::signature_header`, shared with the native replay of
//! `core/fuzz/regressions/signature_header/` (`core/tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfa_core::testing::fuzzing::signature_header(data));
