//! Fuzz target `webauthn_parse`: the invariants live in
//! `tfa_core::testing::fuzzing::webauthn_parse`, shared with the native replay
//! of `core/fuzz/regressions/webauthn_parse/` (`core/tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tfa_core::testing::fuzzing::webauthn_parse(data));
