//! Finds the filter's `.wasm`, building it at most once per test run.
//!
//! `TFA_FILTER_WASM` (set by `scripts/test-filter.sh`) names a built module;
//! otherwise the shipped artefact of the workspace
//! (`target/filter/edge_filter.wasm`) is used, rebuilt with
//! `scripts/build-filter.sh` (cargo's release build, then wasm-opt) when it
//! is missing or older than any source it is built from.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn newest_mtime(path: &Path, newest: &mut Option<SystemTime>) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.flatten() {
                newest_mtime(&e.path(), newest);
            }
        }
    } else if let Ok(m) = meta.modified() {
        if newest.is_none_or(|n| m > n) {
            *newest = Some(m);
        }
    }
}

/// Path of the filter's `.wasm`; panics (failing the test) when it cannot be
/// found or built.
pub fn filter_wasm() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("TFA_FILTER_WASM") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "TFA_FILTER_WASM={} is not a file", p.display());
            return p;
        }
        let root = workspace_root();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let artefact = target.join("filter/edge_filter.wasm");
        let built = std::fs::metadata(&artefact).and_then(|m| m.modified()).ok();
        let mut sources = None;
        for p in [
            "edge-filter",
            "core/src",
            "core/Cargo.toml",
            "Cargo.lock",
            "Cargo.toml",
            "scripts/build-filter.sh",
        ] {
            newest_mtime(&root.join(p), &mut sources);
        }
        let stale = match (built, sources) {
            (Some(b), Some(s)) => s > b,
            (Some(_), None) => false,
            (None, _) => true,
        };
        if stale {
            let status = Command::new("bash")
                .current_dir(&root)
                .arg(root.join("scripts/build-filter.sh"))
                .status()
                .expect("run scripts/build-filter.sh");
            assert!(status.success(), "building the filter failed: {status}");
        }
        assert!(
            artefact.is_file(),
            "{} missing after the build",
            artefact.display()
        );
        artefact
    })
    .clone()
}
