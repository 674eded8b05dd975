//! Runs the `wasm32-wasip2` build of `core-ops` (a WASI command component)
//! under wasmtime with its default configuration (Cranelift, SIMD on), with
//! stdout and stderr inherited: the guest prints its own JSON. With a cache
//! directory, the compiled component is kept there as the host keeps its
//! own (`tfa_host::runtime::load_component`), so a benchmark that starts
//! this program a hundred times compiles the module once.

use std::path::Path;

use anyhow::{bail, Context as _};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::p2::bindings::sync::Command;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

struct State {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

pub fn run(wasm: &Path, cache_dir: Option<&Path>, args: &[String]) -> anyhow::Result<()> {
    // Compiled on one thread: what it costs is then the same in every
    // process, so `scripts/bench.sh` can count a verify's instructions as
    // the difference of two processes (wasmtime's parallel compilation
    // counted differently from one process to the next, by up to 100
    // million instructions under callgrind). With a cache directory only
    // its first process compiles at all.
    let mut config = Config::new();
    config.parallel_compilation(false);
    let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
    let component = match cache_dir {
        Some(dir) => tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?
            .block_on(tfa_host::runtime::load_component(&engine, wasm, dir))?,
        None => Component::from_file(&engine, wasm)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("load {}", wasm.display()))?,
    };
    let mut linker = Linker::<State>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    let mut argv = vec!["core-ops".to_string()];
    argv.extend(args.iter().cloned());
    let ctx = WasiCtx::builder().inherit_stdio().args(&argv).build();
    let mut store = Store::new(
        &engine,
        State {
            ctx,
            table: ResourceTable::new(),
        },
    );
    let command = Command::instantiate(&mut store, &component, &linker)?;
    if command.wasi_cli_run().call_run(&mut store)?.is_err() {
        bail!("core-ops (wasm) failed");
    }
    Ok(())
}
