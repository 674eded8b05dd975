//! End-to-end test support for the workspace's hosts.
//!
//! Each module is self-contained and owned by the tests that use it:
//! [`proxy_wasm_host`] (with [`filter_build`]) serves `tests/filter_host.rs`
//! and `tests/filter_envoy.rs`.

pub mod filter_build;
pub mod proxy_wasm_host;
