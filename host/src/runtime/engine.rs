//! The engine (pooling allocator, epoch deadline), the linker of every
//! import, the compiled-component cache, pre-instantiation, and the store
//! and run of one request.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, Resource};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use super::{atomics, batch, key_value, variables, wasi_config, wasi_kv};
use super::{HostState, Shared, MAILER_INSTANCES, MAX_INSTANCES};

/// Bytes of each linear memory kept resident between requests: above the
/// ~170 KiB a light request dirties, far below the 19 MiB an Argon2 hash
/// does. wasmtime applies it to every memory slot a request has ever
/// used, so it bounds the host's idle growth after a burst of logins at
/// about `total_memories × KEEP_RESIDENT` (docs/decisions.md, "Each pooled
/// memory keeps 256 KiB resident").
const KEEP_RESIDENT: usize = 256 << 10;
/// Bytes of each table kept resident between requests.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;

/// The pool's slots in the server: one for every instance it may run at
/// once.
pub const SERVER_POOL_SLOTS: u32 = MAX_INSTANCES + MAILER_INSTANCES;

/// A wasmtime engine with the pooling allocator: [`engine_config`] with
/// [`SERVER_POOL_SLOTS`]; with `perf_map`, wasmtime writes
/// `/tmp/perf-PID.map` (the compiled wasm functions' names for `perf`).
pub fn engine(perf_map: bool) -> anyhow::Result<Engine> {
    let mut config = engine_config(SERVER_POOL_SLOTS);
    if perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("cannot create the wasmtime engine")
}

/// The server's engine configuration with a pool of `slots` component
/// instances. Only the pool's size depends on `slots`; the compiled code
/// and its cache entry are the same for every size. `tfa-bench handle
/// --pool-slots 2` uses a small pool to run under valgrind, which cannot
/// reserve the full pool's address space (a 4 GiB reservation per memory).
pub fn engine_config(slots: u32) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots * 4)
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .total_stacks(slots)
        // Argon2 needs its memory cost in linear memory; 1 GiB is ample.
        .max_memory_size(1 << 30)
        // A slot handed back is reset in place (memset of the pages that
        // were touched, found with Linux's PAGEMAP_SCAN where available)
        // instead of madvise: no page faults on the next request and no
        // TLB-shootdown interrupts to the other cores, which the profile
        // showed as ~30 % of the host's CPU under load. Only the first
        // KEEP_RESIDENT bytes of each memory stay resident; the rest (most
        // of an Argon2 hash's 19 MiB) is given back to the system at once.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(TABLE_KEEP_RESIDENT)
        .pagemap_scan(wasmtime::Enabled::Auto);
    let mut config = Config::new();
    config.wasm_component_model(true);
    // Guest deadline (`REQUEST_TIMEOUT_MS`): compiled code checks the
    // engine's epoch at function entries and loop heads; a thread advances
    // it every [`EPOCH_TICK`] ([`start_epoch_ticker`]) and each store yields
    // to tokio at every tick ([`new_store`]), so a guest that never returns
    // neither blocks a worker thread nor escapes the deadline's timer.
    config.epoch_interruption(true);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// Links every import the component uses: WASI 0.2 (cli, clocks, random,
/// io, sockets for SMTP limited by the allow-list, and the rest of the
/// command world, with files denied),
/// wasi:http types + outgoing handler, Spin key-value and variables,
/// wasi:config/store, wasi:keyvalue store/atomics/batch.
pub fn linker(engine: &Engine) -> anyhow::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    key_value::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    variables::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    wasi_config::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    wasi_kv::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    atomics::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    batch::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s)?;
    Ok(linker)
}

/// Compiles the component at `wasm_path`, or loads the compiled form cached
/// in `cache_dir` (keyed by the wasm's SHA-256, the wasmtime version and the
/// engine's compatibility hash). Progress goes to stderr.
pub async fn load_component(
    engine: &Engine,
    wasm_path: &Path,
    cache_dir: &Path,
) -> anyhow::Result<Component> {
    let name = wasm_path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .unwrap_or("component");
    let wasm = std::fs::read(wasm_path)
        .with_context(|| format!("cannot read the component {}", wasm_path.display()))?;
    let digest = hex(&Sha256::digest(&wasm));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let cached = cache_dir.join(format!(
        "{name}-{}-wasmtime-48.0.8-{:016x}.cwasm",
        &digest[..32],
        h.finish()
    ));
    if cached.exists() {
        // SAFETY: the file is one this program wrote with
        // `Component::serialize` into its own data directory (written to a
        // temporary name and renamed, so never partial), keyed by the
        // engine's compatibility hash; wasmtime still checks the header and
        // refuses an incompatible artifact, in which case we recompile.
        match unsafe { Component::deserialize_file(engine, &cached) } {
            Ok(c) => {
                eprintln!(
                    "tfa-host: loaded compiled component from {}",
                    cached.display()
                );
                return Ok(c);
            }
            Err(e) => eprintln!("tfa-host: ignoring cache {}: {e:#}", cached.display()),
        }
    }
    eprintln!(
        "tfa-host: compiling {} ({} KiB), first run only…",
        wasm_path.display(),
        wasm.len() / 1024
    );
    let engine2 = engine.clone();
    let mut job = tokio::task::spawn_blocking(move || Component::from_binary(&engine2, &wasm));
    let started = crate::now();
    let component = loop {
        tokio::select! {
            done = &mut job => break done.context("compile task failed")??,
            _ = tokio::time::sleep(Duration::from_secs(3)) => {
                eprintln!("tfa-host: still compiling… {}s", started.elapsed().as_secs());
            }
        }
    };
    eprintln!("tfa-host: compiled in {} ms", started.elapsed().as_millis());
    if let Err(e) = write_cache(&component, cache_dir, &cached) {
        eprintln!("tfa-host: could not cache the compiled component: {e:#}");
    }
    Ok(component)
}

fn write_cache(component: &Component, dir: &Path, path: &PathBuf) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = component.serialize()?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Pre-instantiates the component for the `wasi:http/proxy` shape.
pub fn pre_instantiate(
    linker: &Linker<HostState>,
    component: &Component,
) -> anyhow::Result<ProxyPre<HostState>> {
    let pre = linker
        .instantiate_pre(component)
        .map_err(anyhow::Error::from)
        .context("the component imports something this host does not provide")?;
    ProxyPre::new(pre)
        .map_err(anyhow::Error::from)
        .context("the component does not export wasi:http/incoming-handler")
}

/// How often the engine's epoch advances: the longest a guest runs
/// without giving its thread back to tokio, and how late past
/// `REQUEST_TIMEOUT_MS` a looping guest may be stopped. Longer ticks cost
/// less (each wakes a thread and moves tokio's workers around) but make a
/// server whose workers are all held by looping guests notice new
/// connections late: tokio polls for I/O every 61 task polls, i.e. every
/// 61 ticks of a guest's yields (100 ms ticks: 6 s; `docs/decisions.md`).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Starts the thread that advances `engine`'s epoch every [`EPOCH_TICK`];
/// it ends with the engine.
pub fn start_epoch_ticker(engine: &Engine) -> anyhow::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("tfa-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        })
        .context("cannot start the epoch thread")?;
    Ok(())
}

/// Instantiates the component in `store` and runs its
/// `wasi:http/incoming-handler` for `req` (the response goes to `out`),
/// within `deadline`: `Err` when the deadline came first (the instance is
/// then stopped at its next yield, see [`new_store`]), else what the
/// handler returned.
pub async fn run_handler(
    pre: &ProxyPre<HostState>,
    store: &mut Store<HostState>,
    req: Resource<wasmtime_wasi_http::p2::types::HostIncomingRequest>,
    out: Resource<wasmtime_wasi_http::p2::types::HostResponseOutparam>,
    deadline: Duration,
) -> Result<wasmtime::Result<()>, tokio::time::error::Elapsed> {
    tokio::time::timeout(deadline, async {
        let proxy = pre.instantiate_async(&mut *store).await?;
        proxy
            .wasi_http_incoming_handler()
            .call_handle(&mut *store, req, out)
            .await
    })
    .await
}

/// A store for one request. Guest code yields to tokio at every epoch
/// tick (the deadline itself is a timer around the instance's run, see
/// `server.rs`); with no ticker running it is never interrupted.
///
/// A new store's epoch deadline is epoch 0, already past: without
/// `set_epoch_deadline(1)` every request would yield at its first check,
/// a task switch (3.5 context switches per request instead of 1 for the
/// floor component; `docs/decisions.md`, "Guest deadline").
pub fn new_store(engine: &Engine, shared: &Arc<Shared>) -> Store<HostState> {
    let mut store = Store::new(engine, HostState::new(shared));
    store.limiter_async(|s| &mut s.limiter);
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
    store
}
