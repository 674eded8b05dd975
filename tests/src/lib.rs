//! Shared pieces of the end-to-end tests: artefacts built once per run, a
//! small HTTP/1.1 client, and processes (the local host, Redis) started and
//! stopped by the tests on 127.0.0.1 with bounded waits.
//!
//! Artefacts: the test script builds them once and passes their paths
//! (`TFA_COMPONENT_WASM`, `TFA_MAILER_WASM`, `TFA_HOST_BIN`); when a variable is unset the
//! artefact is built here, once per test binary, with the same command.
//! [`proxy_wasm_host`] (with [`filter_build`]) serves the filter tests.

#![allow(clippy::disallowed_methods)] // tests measure wall time for their timeouts

pub mod api;
pub mod client;
pub mod fake;
pub mod filter_build;
pub mod procs;
pub mod proxy_wasm_host;
pub mod smtp;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn cargo(args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo {args:?} failed");
}

/// Builds the application's two components (release, wasm32-wasip2): the
/// API and the mailer, as `spin build` does.
fn build_components() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        cargo(&[
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            "spin-app",
            "-p",
            "tfa-mailer",
        ])
    });
}

/// A component `.wasm`: the file `var` names, else `file` of the
/// workspace's release build (built once, with the other component).
fn component_file(var: &str, file: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    build_components();
    root().join("target/wasm32-wasip2/release").join(file)
}

/// The API component `.wasm` (release, wasm32-wasip2).
pub fn component_wasm() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| component_file("TFA_COMPONENT_WASM", "spin_app.wasm"))
        .clone()
}

/// The mailer component `.wasm` (release, wasm32-wasip2).
pub fn mailer_wasm() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| component_file("TFA_MAILER_WASM", "tfa_mailer.wasm"))
        .clone()
}

/// The local host binary.
pub fn host_bin() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Ok(p) = std::env::var("TFA_HOST_BIN") {
            return PathBuf::from(p);
        }
        // The dev profile optimises dependencies (wasmtime) at opt-level 3;
        // building with the same targets as `cargo test --workspace` keeps
        // one feature set, so the dependencies are built once per run.
        cargo(&["build", "--workspace", "--all-targets"]);
        root().join("target/debug/tfa-host")
    })
    .clone()
}

/// A free TCP port on 127.0.0.1 (bound and released; tests use it at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
