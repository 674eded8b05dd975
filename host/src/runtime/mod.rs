//! The wasmtime side: engine, compiled-component cache, per-request store
//! state, the host implementations of Spin's key-value and variables
//! interfaces and of `wasi:keyvalue`, and Spin's local service chaining
//! (the API component's e-mail goes to the mailer component, [`Chained`]).
//!
//! Here: a request's store state ([`HostState`], what all stores share in
//! [`Shared`]), its outgoing HTTP ([`OutboundHooks`]) and chaining. In
//! `engine.rs`: the engine, linker, cache, pre-instantiation and the run of
//! one request ([`engine()`], [`new_store`], [`run_handler`]). In
//! `interfaces.rs`: the key-value, variables and config interfaces.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use crate::kv::{KvBackend, KvEmulation, KvError, KvResult, WriteOp};
use crate::outbound::AllowList;

mod engine;
mod interfaces;

pub use engine::{
    engine, engine_config, linker, load_component, new_store, pre_instantiate, run_handler,
    start_epoch_ticker, EPOCH_TICK, SERVER_POOL_SLOTS,
};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "tfa:host/spin-imports",
        imports: { default: async },
        with: {
            "fermyon:spin/key-value.store": super::KvStoreRes,
            "wasi:keyvalue/store.bucket": super::BucketRes,
            "wasi:keyvalue/atomics.cas": super::CasRes,
        },
    });
}

use bindings::fermyon::spin::{key_value, variables};
use bindings::wasi::config::store as wasi_config;
use bindings::wasi::keyvalue::{atomics, batch, store as wasi_kv};

/// The only key-value store label the component may open.
pub const STORE_LABEL: &str = "default";

/// Instances of the API component that may run at once (each one is a
/// pooling-allocator slot).
pub const MAX_INSTANCES: u32 = 64;

/// Instances of the mailer component that may run at once: slots of their
/// own, so that API instances waiting for the mailer never hold every slot
/// it needs. More deliveries wait for a permit.
pub const MAILER_INSTANCES: u32 = 4;

/// The host name under which the API component reaches the mailer
/// (Spin's local service chaining: `<component id>.spin.internal`).
pub const MAILER_HOST: &str = tfa_smtp::relay::MAILER_HOST;

/// Timeouts for outgoing HTTP when the component sets none.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);
const BETWEEN_BYTES_TIMEOUT: Duration = Duration::from_secs(30);

/// What a component of the application may use: its part of `spin.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grants {
    /// The key-value store `default` (`key_value_stores`); without it
    /// opening a store is `access-denied`, as under Spin.
    pub key_value: bool,
    /// Outbound TCP (`wasi:sockets`) to the `tcp://` entries of its
    /// allow-list; without it every connect is refused.
    pub tcp: bool,
}

impl Grants {
    /// The API component: the store, outbound HTTP only.
    pub const API: Grants = Grants {
        key_value: true,
        tcp: false,
    };
    /// The mailer component: TCP to the SMTP server only.
    pub const MAILER: Grants = Grants {
        key_value: false,
        tcp: true,
    };
}

/// What every request's store shares.
pub struct Shared {
    /// The key-value backend behind label `default`.
    pub kv: Arc<dyn KvBackend>,
    /// Spin variables by lower-case name: the settings that are set (see
    /// [`crate::service_settings`]).
    pub variables: BTreeMap<String, String>,
    /// The component's WASI environment: its `environment` in the manifest
    /// ([`crate::manifest::Manifest::environment`]); usually empty.
    pub environment: Vec<(String, String)>,
    /// Hosts the component may call.
    pub allow: Arc<AllowList>,
    /// The connect-time SSRF check for outbound HTTP and TCP.
    pub guard: Arc<crate::netguard::NetGuard>,
    /// Test hook (`TFA_CLOCK_OFFSET_MS`): how far ahead the component's
    /// wall clock runs; zero in normal use.
    pub clock_offset: Duration,
    /// Log each request's key-value operations (`KV_COUNT=true`).
    pub kv_count: bool,
    /// What the component may use.
    pub grants: Grants,
    /// The component it reaches by local service chaining (the API: the
    /// mailer, when one is loaded).
    pub chain: Option<Arc<Chained>>,
    /// Admission of this component's memory-heavy instances
    /// (`MAX_HEAVY_INSTANCES`, [`crate::gate`]).
    pub gate: crate::gate::Gate,
}

/// The system wall clock moved ahead by a fixed offset.
struct OffsetClock(Duration);

impl wasmtime_wasi::HostWallClock for OffsetClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    #[allow(clippy::disallowed_methods)] // the host is where the clock is read
    fn now(&self) -> Duration {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(self.0)
    }
}

impl Shared {
    /// Whether the key-value interfaces copy Spin 4.0.2 (`KV_EMULATE`).
    fn spin(&self) -> bool {
        self.kv.emulation() == KvEmulation::Spin402
    }

    /// Runs a blocking backend call off the async threads.
    async fn kv<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn KvBackend) -> KvResult<T> + Send + 'static,
    ) -> KvResult<T> {
        let kv = self.kv.clone();
        let out = tokio::task::spawn_blocking(move || f(kv.as_ref()))
            .await
            .unwrap_or_else(|e| Err(KvError(format!("store task failed: {e}"))));
        if let Err(e) = &out {
            eprintln!("tfa-host: store error: {e}");
        }
        out
    }
}

/// A `fermyon:spin/key-value` store handle.
pub struct KvStoreRes;
/// A `wasi:keyvalue` bucket handle.
pub struct BucketRes;
/// A `wasi:keyvalue` compare-and-swap handle: the key and the value seen
/// (`None` until read: Spin 4.0.2 reads in `current`, this host's own mode
/// when the handle is made; `Some(None)`: the key was missing).
pub struct CasRes {
    key: String,
    seen: Option<Option<Vec<u8>>>,
}

/// The data of one request's store.
pub struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: OutboundHooks,
    shared: Arc<Shared>,
    /// Key-value operations of this request, by kind.
    pub kv_ops: Arc<KvOps>,
    /// Holds the request's gate permit once its memory grows heavy.
    pub limiter: crate::gate::Limiter,
}

/// Kinds of key-value operations, for [`KvOps`].
#[derive(Debug, Clone, Copy)]
pub enum KvOp {
    /// `get`.
    Get,
    /// `set`.
    Set,
    /// `delete`.
    Delete,
    /// `increment`.
    Increment,
    /// exists, list, batch and compare-and-swap calls.
    Other,
}

impl KvOp {
    /// The operation's name (the metrics' `op` label).
    pub fn name(self) -> &'static str {
        match self {
            KvOp::Get => "get",
            KvOp::Set => "set",
            KvOp::Delete => "delete",
            KvOp::Increment => "increment",
            KvOp::Other => "other",
        }
    }
}

/// Times one store operation for the metrics (nothing when they are off).
struct StoreTimer(Option<(KvOp, std::time::Instant, &'static crate::metrics::Metrics)>);

impl StoreTimer {
    fn start(op: KvOp) -> StoreTimer {
        StoreTimer(crate::metrics::get().map(|m| (op, crate::now(), m)))
    }

    fn done(self, ok: bool) {
        if let Some((op, t, m)) = self.0 {
            m.store(op.name(), t.elapsed(), ok);
        }
    }
}

/// Counts of one request's key-value operations (`KV_COUNT=true` logs them).
#[derive(Debug, Default)]
pub struct KvOps([std::sync::atomic::AtomicU32; 5]);

impl KvOps {
    fn add(&self, op: KvOp) {
        self.0[op as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far: get, set, delete, increment, other.
    pub fn snapshot(&self) -> [u32; 5] {
        std::array::from_fn(|i| self.0[i].load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl HostState {
    /// Counts `op` and performs the write `w`: queued to a backend that
    /// queues writes itself (SQLite's writer thread), else on a blocking
    /// thread. The answer is the counter for an increment, else 0.
    fn kv_write(
        &self,
        op: KvOp,
        w: WriteOp,
    ) -> impl std::future::Future<Output = KvResult<i64>> + Send + 'static {
        self.kv_ops.add(op);
        let shared = self.shared.clone();
        let timer = StoreTimer::start(op);
        async move {
            let out = match shared.kv.write_async(w) {
                Ok(queued) => {
                    let out = queued.await;
                    if let Err(e) = &out {
                        eprintln!("tfa-host: store error: {e}");
                    }
                    out
                }
                Err(w) => {
                    shared
                        .kv(move |kv| match w {
                            WriteOp::Set(k, v) => kv.set(&k, &v).map(|()| 0),
                            WriteOp::Delete(k) => kv.delete(&k).map(|()| 0),
                            WriteOp::Increment(k, d) => kv.increment(&k, d),
                        })
                        .await
                }
            };
            timer.done(out.is_ok());
            out
        }
    }

    /// Counts `op`, then runs it on the backend off the async threads.
    /// (The future holds no borrow of the state, which is not `Sync`.)
    fn kv<T: Send + 'static>(
        &self,
        op: KvOp,
        f: impl FnOnce(&dyn KvBackend) -> KvResult<T> + Send + 'static,
    ) -> impl std::future::Future<Output = KvResult<T>> + Send + 'static {
        self.kv_ops.add(op);
        let shared = self.shared.clone();
        // A read of a store that says it is cheap runs right here: handing
        // it to a blocking thread costs more than the read (two thread
        // switches per operation, the largest share of a store operation's
        // time in the profile).
        let inline = matches!(op, KvOp::Get) && shared.kv.inline_reads();
        let timer = StoreTimer::start(op);
        async move {
            let out = if inline {
                let out = f(shared.kv.as_ref());
                if let Err(e) = &out {
                    eprintln!("tfa-host: store error: {e}");
                }
                out
            } else {
                shared.kv(f).await
            };
            timer.done(out.is_ok());
            out
        }
    }
}

impl HostState {
    /// Fresh state for one request.
    pub fn new(shared: &Arc<Shared>) -> HostState {
        let allow = shared.allow.clone();
        let guard = shared.guard.clone();
        let mut builder = WasiCtx::builder();
        if !shared.clock_offset.is_zero() {
            builder.wall_clock(OffsetClock(shared.clock_offset));
        }
        if !shared.environment.is_empty() {
            builder.envs(&shared.environment);
        }
        let wasi = builder
            .inherit_stdout()
            .inherit_stderr()
            // No files and no UDP. Outbound TCP (SMTP: the mailer only) to
            // the `tcp://` entries of the allow-list, checked by IP address
            // and port as Spin does; name lookups are allowed for them.
            .allow_tcp(shared.grants.tcp)
            .allow_udp(false)
            .allow_ip_name_lookup(shared.grants.tcp)
            .socket_addr_check(move |addr, use_| {
                use wasmtime_wasi::sockets::SocketAddrUse;
                let ok = match use_ {
                    // The address checked is the one connected to.
                    SocketAddrUse::TcpConnect => {
                        let ok = if !allow.allows_tcp(&addr) {
                            eprintln!(
                                "tfa-host: TCP connection to {addr} denied by allowed_outbound_hosts"
                            );
                            false
                        } else if let Err(why) = guard.check(addr.ip(), allow.explicit_tcp(&addr))
                        {
                            eprintln!("tfa-host: TCP connection to {addr} denied: {why}");
                            false
                        } else {
                            true
                        };
                        if let Some(m) = crate::metrics::get() {
                            m.outbound("smtp", if ok { "allowed" } else { "denied" });
                        }
                        ok
                    }
                    // The ephemeral local port a connect binds implicitly
                    // (checked as a bind of the unspecified address, port 0).
                    SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
                    _ => false,
                };
                Box::pin(async move { ok })
            })
            .build();
        let limiter = shared.gate.limiter();
        HostState {
            wasi,
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: OutboundHooks {
                release: limiter.release(),
                allow: shared.allow.clone(),
                guard: shared.guard.clone(),
                chain: shared.chain.clone(),
            },
            shared: shared.clone(),
            kv_ops: Arc::default(),
            limiter,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Outgoing HTTP: allowed hosts only, with default timeouts; requests to
/// `*.spin.internal` go to the chained component.
pub struct OutboundHooks {
    /// An outbound call gives the instance's gate permit back.
    release: crate::gate::Release,
    allow: Arc<AllowList>,
    guard: Arc<crate::netguard::NetGuard>,
    chain: Option<Arc<Chained>>,
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        self.release.release();
        let uri = request.uri().clone();
        if !self.allow.allows(&uri) {
            let shown = format!(
                "{}://{}",
                uri.scheme_str().unwrap_or("?"),
                uri.authority().map(|a| a.as_str()).unwrap_or("?")
            );
            eprintln!("tfa-host: outbound request to {shown} denied by allowed_outbound_hosts");
            if let Some(m) = crate::metrics::get() {
                m.outbound("http", "denied");
            }
            drop(fut);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        if let Some(host) = uri.host().filter(|h| h.ends_with(".spin.internal")) {
            drop(fut);
            let first_byte = options
                .and_then(|o| o.first_byte_timeout)
                .unwrap_or(FIRST_BYTE_TIMEOUT);
            return match self
                .chain
                .clone()
                .filter(|c| c.host.eq_ignore_ascii_case(host))
            {
                Some(chained) => Box::new(chained.call(request, first_byte)),
                None => {
                    eprintln!("tfa-host: no component answers {host} (local service chaining)");
                    Box::new(async { Err(HttpError::DestinationNotFound) })
                }
            };
        }
        let mut opts = options.unwrap_or_default();
        opts.connect_timeout.get_or_insert(CONNECT_TIMEOUT);
        opts.first_byte_timeout.get_or_insert(FIRST_BYTE_TIMEOUT);
        opts.between_bytes_timeout
            .get_or_insert(BETWEEN_BYTES_TIMEOUT);
        drop(fut);
        let explicit = self.allow.explicit(&uri);
        let guard = self.guard.clone();
        let sent = crate::send::send(request, opts, guard, explicit);
        match crate::metrics::get() {
            None => Box::new(sent),
            Some(m) => Box::new(async move {
                let r = sent.await;
                m.outbound("http", if r.is_ok() { "ok" } else { "error" });
                r
            }),
        }
    }
}

// ------------------------------------------------- local service chaining

/// A component that other components of the application reach by Spin's
/// local service chaining, `http://<id>.spin.internal/…` (here the mailer):
/// each request runs a fresh instance of it, in a store of its own with its
/// own grants and allow-list, exactly as a client's request would. The
/// caller's allow-list must name the URL (Spin's rule too).
pub struct Chained {
    /// `<id>.spin.internal`.
    pub host: String,
    /// The pre-instantiated component.
    pub pre: ProxyPre<HostState>,
    /// What its stores share (its grants and allow-list).
    pub shared: Arc<Shared>,
    /// The longest one of its instances runs (`REQUEST_TIMEOUT_MS`).
    pub deadline: Duration,
    /// Its instances running at once, at most [`MAILER_INSTANCES`].
    pub permits: Arc<tokio::sync::Semaphore>,
}

impl Chained {
    /// A chained component with its own permits.
    pub fn new(
        host: &str,
        pre: ProxyPre<HostState>,
        shared: Arc<Shared>,
        deadline: Duration,
    ) -> Chained {
        Chained {
            host: host.to_string(),
            pre,
            shared,
            deadline,
            permits: Arc::new(tokio::sync::Semaphore::new(MAILER_INSTANCES as usize)),
        }
    }

    /// Runs one instance for `request`: its response as the outgoing
    /// request's answer (waiting at most `first_byte` for it), or why there
    /// is none. The instance goes on in its own task until its handler
    /// returns, bounded by [`Chained::deadline`].
    async fn call(
        self: Arc<Self>,
        request: http::Request<WasiBody>,
        first_byte: Duration,
    ) -> Result<crate::send::Sent, HttpError> {
        let fail = |why: String| {
            eprintln!("tfa-host: {}: {why}", self.host);
            if let Some(m) = crate::metrics::get() {
                m.outbound("chained", "error");
            }
            HttpError::InternalError(Some(why))
        };
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return Err(fail("shutting down".into()));
        };
        let mut store = new_store(self.pre.engine(), &self.shared);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, request)
            .map_err(|e| fail(format!("bad request: {e:#}")))?;
        let out = store
            .data_mut()
            .http()
            .new_response_outparam(tx)
            .map_err(|e| fail(format!("{e:#}")))?;
        let pre = self.pre.clone();
        let (deadline, host) = (self.deadline, self.host.clone());
        let task = tokio::spawn(async move {
            let _permit = permit;
            match run_handler(&pre, &mut store, req, out, deadline).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    eprintln!("tfa-host: {host}: component error: {e:?}");
                    Err(HttpError::InternalError(Some(format!("{host} failed"))))
                }
                Err(_) => {
                    crate::log::warn(&format!(
                        "{host}: stopped at REQUEST_TIMEOUT_MS={}",
                        deadline.as_millis()
                    ));
                    Err(HttpError::ConnectionReadTimeout)
                }
            }
        });
        let worker: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
            Box::new(async move {
                task.await
                    .unwrap_or_else(|e| Err(HttpError::InternalError(Some(e.to_string()))))
            });
        match tokio::time::timeout(first_byte, rx).await {
            Ok(Ok(Ok(response))) => {
                if let Some(m) = crate::metrics::get() {
                    m.outbound("chained", "ok");
                }
                Ok((response, worker))
            }
            Ok(Ok(Err(code))) => Err(fail(format!("answered with an error: {code:?}"))),
            Ok(Err(_)) => Err(fail("ended without an answer".into())),
            Err(_) => Err(fail(format!("no answer within {} s", first_byte.as_secs()))),
        }
    }
}
