//! Component start-up in the host, through `tfa_host::runtime` (the very
//! engine configuration, linker and per-request store the server uses):
//! the compile time of the component (no cache), and the per-request cost
//! of a fresh store plus instantiation from the pre-instantiated component.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use serde_json::json;
use tfa_host::{kv, outbound, runtime};
use wasmtime::component::Component;

use crate::{now, percentile};

/// Options of a start-up measurement.
pub struct Options<'a> {
    pub component: &'a Path,
    pub label: &'a str,
    pub compile_runs: usize,
    pub instances: usize,
}

/// A measurement's own store directory under the temporary directory,
/// removed when this is dropped. Declare it before the [`shared`] state
/// that opens a store in it, so that the store (its sync thread, its open
/// files) is gone first: removed while the log store was still open, the
/// directory was sometimes left behind (10 MB a process in `/dev/shm`).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `tfa-bench-<what>-<pid>` in the temporary directory (not created).
    pub fn new(what: &str) -> ScratchDir {
        ScratchDir(std::env::temp_dir().join(format!("tfa-bench-{what}-{}", std::process::id())))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("cannot remove {}: {e}", self.0.display()),
        }
    }
}

/// What the API component's requests share in a measurement: a store of
/// `engine` in `dir`, `variables`, no outbound host, no mailer.
pub fn shared(
    dir: &Path,
    engine: kv::KvEngine,
    variables: std::collections::BTreeMap<String, String>,
) -> anyhow::Result<Arc<runtime::Shared>> {
    let backend = kv::open_store(None, dir, engine, kv::KvEmulation::default(), None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Arc::new(runtime::Shared {
        kv: backend,
        variables,
        environment: Vec::new(),
        allow: Arc::new(outbound::AllowList::new(Vec::new())),
        guard: Arc::default(),
        clock_offset: std::time::Duration::ZERO,
        kv_count: false,
        grants: runtime::Grants::API,
        chain: None,
        // One request at a time here: the gate never makes it wait.
        gate: tfa_host::gate::Gate::new(1),
    }))
}

pub async fn run(o: &Options<'_>) -> anyhow::Result<()> {
    let wasm =
        std::fs::read(o.component).with_context(|| format!("read {}", o.component.display()))?;
    let engine = runtime::engine(false)?;
    let mut compile_ms = Vec::new();
    let mut component = None;
    for _ in 0..o.compile_runs.max(1) {
        let t = now();
        let c = Component::from_binary(&engine, &wasm).map_err(anyhow::Error::from)?;
        compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
        component = Some(c);
    }
    let component = component.context("no component")?;
    let serialized = component.serialize().map_err(anyhow::Error::from)?;
    let t = now();
    // SAFETY: the bytes were serialized just above by this engine.
    let _loaded =
        unsafe { Component::deserialize(&engine, &serialized) }.map_err(anyhow::Error::from)?;
    let load_cached_ms = t.elapsed().as_secs_f64() * 1e3;

    let linker = runtime::linker(&engine)?;
    let pre = runtime::pre_instantiate(&linker, &component)?;
    let dir = ScratchDir::new("startup");
    let shared = shared(dir.path(), kv::KvEngine::Sqlite, Default::default())?;

    let mut store_us = Vec::with_capacity(o.instances);
    let mut inst_us = Vec::with_capacity(o.instances);
    let mut drop_us = Vec::with_capacity(o.instances);
    // Warm-up: the pooling allocator's slots are touched once.
    for _ in 0..20 {
        let mut store = runtime::new_store(&engine, &shared);
        pre.instantiate_async(&mut store).await?;
    }
    for _ in 0..o.instances {
        let t0 = now();
        let mut store = runtime::new_store(&engine, &shared);
        let t1 = now();
        // The instance lives in the store; dropping the store frees its slot.
        let _proxy = pre.instantiate_async(&mut store).await?;
        let t2 = now();
        drop(store);
        let t3 = now();
        store_us.push((t1 - t0).as_secs_f64() * 1e6);
        inst_us.push((t2 - t1).as_secs_f64() * 1e6);
        drop_us.push((t3 - t2).as_secs_f64() * 1e6);
    }
    let mut total: Vec<f64> = store_us.iter().zip(&inst_us).map(|(a, b)| a + b).collect();
    println!(
        "{}",
        json!({
            "bench": "startup", "component": o.label, "wasm_bytes": wasm.len(),
            "compile_ms_median": percentile(&mut compile_ms, 50.0),
            "compile_runs": compile_ms.len(),
            "load_cached_ms": load_cached_ms,
            "instances": o.instances,
            "new_store_us_p50": percentile(&mut store_us, 50.0),
            "instantiate_us_p50": percentile(&mut inst_us, 50.0),
            "store_plus_instantiate_us_p50": percentile(&mut total, 50.0),
            "store_plus_instantiate_us_p99": percentile(&mut total, 99.0),
            "teardown_us_p50": percentile(&mut drop_us, 50.0),
        })
    );
    Ok(())
}
