//! Fuzz target `filter_config`: the Envoy filter's plugin configuration.
//! The invariants live in `edge_filter::fuzzing::filter_config`, shared with
//! the native replay of `edge-filter/fuzz/regressions/filter_config/`
//! (`edge-filter/tests/fuzz_regressions.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| edge_filter::fuzzing::filter_config(data));
