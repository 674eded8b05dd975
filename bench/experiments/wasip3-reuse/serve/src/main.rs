//! Experiment only (issue 15): serves a WASIp3 `wasi:http/service` component
//! with wasmtime-wasi-http 48's `ProxyHandler`, the dispatcher Spin's main
//! branch uses, with up to REUSE requests per instance, CONCURRENT (default
//! 16) at once (Spin's defaults for WASIp3 are 128 and 16; a REUSE of 1 is a
//! fresh instance per request).
//! A minimal host: no access log, no limits, no deadline, no store. Never to
//! be served. Usage: wasip3-serve COMPONENT PORT REUSE [CONCURRENT] (run.sh builds
//! it).
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::service::service_fn;
use wasmtime::component::{GuestTaskId, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, StoreContextMut};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::handler::{
    HandlerState, Instance, ProxyHandler, ProxyPre, ShouldAccept, WorkerExpiration, WorkerState,
    WorkerStatus,
};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

struct Data {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
}

impl WasiView for Data {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Data {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: wasmtime_wasi_http::default_hooks(),
        }
    }
}

fn view(d: &mut Data) -> WasiHttpCtxView<'_> {
    d.http()
}

struct Never;
impl WorkerExpiration for Never {
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>, _: WorkerStatus, _: Instant) -> Poll<()> {
        // No expiry: a worker ends when it may take no more requests.
        Poll::Pending
    }
}

struct Limits {
    reuse: usize,
    concurrent: usize,
}
impl WorkerState for Limits {
    type StoreData = Data;
    type RequestData = ();
    fn should_accept_request(&self, concurrent: usize, total: usize) -> ShouldAccept {
        if total >= self.reuse {
            ShouldAccept::Never
        } else if concurrent >= self.concurrent {
            ShouldAccept::No
        } else {
            ShouldAccept::Yes
        }
    }
    fn on_request_start(
        &self,
        _: StoreContextMut<'_, Data>,
        _: (),
        _: GuestTaskId,
    ) -> Pin<Box<dyn std::future::Future<Output = ()> + 'static + Send + Sync>> {
        Box::pin(std::future::pending())
    }
    fn drop(&self, _: Store<Data>, r: wasmtime::Result<()>) {
        if let Err(e) = r {
            eprintln!("worker ended: {e:?}");
        }
    }
}

struct State {
    engine: Engine,
    pre: ProxyPre<Data>,
    reuse: usize,
    concurrent: usize,
}

impl HandlerState for State {
    type StoreData = Data;
    type WorkerExpiration = Never;
    type WorkerState = Limits;
    async fn instantiate(&self) -> wasmtime::Result<Instance<Data, Never, Limits>> {
        let mut store = Store::new(
            &self.engine,
            Data {
                wasi: WasiCtx::builder().build(),
                http: WasiHttpCtx::new(),
                table: ResourceTable::new(),
            },
        );
        let proxy = self.pre.instantiate_async(&mut store).await?;
        Ok(Instance {
            store,
            proxy,
            view,
            expiration: Never,
            state: Limits {
                reuse: self.reuse,
                concurrent: self.concurrent,
            },
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, port, reuse) = (&args[1], args[2].parse::<u16>()?, args[3].parse::<usize>()?);
    let concurrent = match args.get(4) {
        Some(c) => c.parse::<usize>()?,
        None => 16,
    };
    let mut config = Config::new();
    config.wasm_component_model_async(true);
    let mut pool = wasmtime::PoolingAllocationConfig::default();
    pool.total_component_instances(1000)
        .total_memories(1000)
        .total_tables(1000)
        .total_core_instances(4000);
    config.allocation_strategy(pool);
    let engine = Engine::new(&config)?;
    let component = wasmtime::component::Component::from_file(&engine, path)?;
    let mut linker: Linker<Data> = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi::p3::add_to_linker(&mut linker)?;
    wasmtime_wasi_http::p3::add_to_linker(&mut linker)?;
    let pre = linker.instantiate_pre(&component)?;
    let pre = ProxyPre::P3(wasmtime_wasi_http::p3::bindings::ServicePre::new(pre)?);
    let handler = ProxyHandler::new(State {
        engine,
        pre,
        reuse,
        concurrent,
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!("wasip3-serve: listening on 127.0.0.1:{port}, reuse {reuse}, {concurrent} at once");
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let handler = handler.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let handler = handler.clone();
                async move {
                    let req =
                        req.map(|b| b.map_err(wasmtime_wasi_http::Error::from).boxed_unsync());
                    let resp = handler
                        .handle((), req)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    Ok::<_, anyhow::Error>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}
