//! The wasmtime side: engine, compiled-component cache, per-request store
//! state, the host implementations of Spin's key-value and variables
//! interfaces and of `wasi:keyvalue`, and Spin's local service chaining
//! (the API component's e-mail goes to the mailer component, [`Chained`]).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use crate::kv::{KvBackend, KvEmulation, KvError, KvResult, WriteOp};
use crate::outbound::AllowList;

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

// ------------------------------------------------------ fermyon:spin/key-value

fn spin_err(e: KvError) -> key_value::Error {
    key_value::Error::Other(e.0)
}

impl key_value::Host for HostState {}

impl key_value::HostStore for HostState {
    async fn open(&mut self, label: String) -> Result<Resource<KvStoreRes>, key_value::Error> {
        if !self.shared.grants.key_value {
            return Err(key_value::Error::AccessDenied);
        }
        if label != STORE_LABEL {
            // Spin: a label the manifest does not grant is access-denied.
            return Err(if self.shared.spin() {
                key_value::Error::AccessDenied
            } else {
                key_value::Error::NoSuchStore
            });
        }
        self.table
            .push(KvStoreRes)
            .map_err(|_| key_value::Error::StoreTableFull)
    }

    async fn get(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<Option<Vec<u8>>, key_value::Error> {
        self.kv(KvOp::Get, move |kv| kv.get(&key))
            .await
            .map_err(spin_err)
    }

    async fn set(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), key_value::Error> {
        self.kv_write(KvOp::Set, WriteOp::Set(key, value))
            .await
            .map(|_| ())
            .map_err(spin_err)
    }

    async fn delete(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<(), key_value::Error> {
        self.kv_write(KvOp::Delete, WriteOp::Delete(key))
            .await
            .map(|_| ())
            .map_err(spin_err)
    }

    async fn exists(
        &mut self,
        _: Resource<KvStoreRes>,
        key: String,
    ) -> Result<bool, key_value::Error> {
        self.kv(KvOp::Other, move |kv| kv.exists(&key))
            .await
            .map_err(spin_err)
    }

    async fn get_keys(&mut self, _: Resource<KvStoreRes>) -> Result<Vec<String>, key_value::Error> {
        self.kv(KvOp::Other, |kv| kv.keys()).await.map_err(spin_err)
    }

    async fn drop(&mut self, rep: Resource<KvStoreRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

// ---------------------------------------------------- fermyon:spin/variables

/// Spin's rule for variable names: lower-case letters, digits and single
/// underscores, starting with a letter.
fn valid_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
}

impl variables::Host for HostState {
    async fn get(&mut self, name: String) -> Result<String, variables::Error> {
        if !valid_variable_name(&name) {
            return Err(variables::Error::InvalidName(name));
        }
        match self.shared.variables.get(&name) {
            Some(v) => Ok(v.clone()),
            None => Err(variables::Error::Undefined(format!(
                "no variable for {name:?}"
            ))),
        }
    }
}

// ------------------------------------------------------- wasi:config/store

/// The same variables as `fermyon:spin/variables`, as Spin 3.x and 4.x
/// give them through `wasi:config`: an undefined (or invalid) name is
/// `none`; `get-all` lists every variable of the component, so a component
/// reads its settings in one call.
impl wasi_config::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<String>, wasi_config::Error> {
        Ok(self.shared.variables.get(&key).cloned())
    }

    async fn get_all(&mut self) -> Result<Vec<(String, String)>, wasi_config::Error> {
        Ok(self
            .shared
            .variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

// ---------------------------------------------------------- wasi:keyvalue

fn wasi_err(e: KvError) -> wasi_kv::Error {
    wasi_kv::Error::Other(e.0)
}

impl wasi_kv::Host for HostState {
    async fn open(&mut self, identifier: String) -> Result<Resource<BucketRes>, wasi_kv::Error> {
        if !self.shared.grants.key_value {
            return Err(wasi_kv::Error::AccessDenied);
        }
        if identifier != STORE_LABEL {
            return Err(if self.shared.spin() {
                wasi_kv::Error::AccessDenied
            } else {
                wasi_kv::Error::NoSuchStore
            });
        }
        self.table
            .push(BucketRes)
            .map_err(|e| wasi_kv::Error::Other(format!("resource table: {e}")))
    }
}

impl wasi_kv::HostBucket for HostState {
    async fn get(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<Option<Vec<u8>>, wasi_kv::Error> {
        self.kv(KvOp::Get, move |kv| kv.get(&key))
            .await
            .map_err(wasi_err)
    }

    async fn set(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv_write(KvOp::Set, WriteOp::Set(key, value))
            .await
            .map(|_| ())
            .map_err(wasi_err)
    }

    async fn delete(&mut self, _: Resource<BucketRes>, key: String) -> Result<(), wasi_kv::Error> {
        self.kv_write(KvOp::Delete, WriteOp::Delete(key))
            .await
            .map(|_| ())
            .map_err(wasi_err)
    }

    async fn exists(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<bool, wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.exists(&key))
            .await
            .map_err(wasi_err)
    }

    async fn list_keys(
        &mut self,
        _: Resource<BucketRes>,
        cursor: Option<String>,
    ) -> Result<wasi_kv::KeyResponse, wasi_kv::Error> {
        // One page with every key (after `cursor`, exclusive). Spin 4.0.2
        // refuses any cursor.
        if cursor.is_some() && self.shared.spin() {
            return Err(wasi_kv::Error::Other(
                "list_keys: cursor not supported".into(),
            ));
        }
        let keys = self
            .kv(KvOp::Other, |kv| kv.keys())
            .await
            .map_err(wasi_err)?;
        let keys = match cursor {
            Some(c) => keys.into_iter().filter(|k| *k > c).collect(),
            None => keys,
        };
        Ok(wasi_kv::KeyResponse { keys, cursor: None })
    }

    async fn drop(&mut self, rep: Resource<BucketRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl atomics::Host for HostState {
    async fn increment(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
        delta: i64,
    ) -> Result<i64, wasi_kv::Error> {
        self.kv_write(KvOp::Increment, WriteOp::Increment(key, delta))
            .await
            .map_err(wasi_err)
    }

    async fn swap(
        &mut self,
        cas: Resource<CasRes>,
        value: Vec<u8>,
    ) -> Result<(), atomics::CasError> {
        let cas = self
            .table
            .delete(cas)
            .map_err(|e| atomics::CasError::StoreError(wasi_kv::Error::Other(e.to_string())))?;
        let key = cas.key.clone();
        // The backend applies its rule (see crate::kv): this host's own, or
        // Spin 4.0.2's for SQLite or Redis.
        let swapped = self
            .kv(KvOp::Other, {
                let key = key.clone();
                move |kv| kv.swap(&key, cas.seen.as_ref().map(Option::as_deref), &value)
            })
            .await
            .map_err(|e| atomics::CasError::StoreError(wasi_err(e)))?;
        if swapped {
            return Ok(());
        }
        // Hand back a fresh handle holding the value now in the store (Spin
        // also makes a new handle and calls `current` on it).
        let current = self
            .kv(KvOp::Other, {
                let key = key.clone();
                move |kv| kv.get(&key)
            })
            .await
            .map_err(|e| atomics::CasError::StoreError(wasi_err(e)))?;
        let again = self
            .table
            .push(CasRes {
                key,
                seen: Some(current),
            })
            .map_err(|e| atomics::CasError::StoreError(wasi_kv::Error::Other(e.to_string())))?;
        Err(atomics::CasError::CasFailed(again))
    }
}

impl atomics::HostCas for HostState {
    async fn new(
        &mut self,
        _: Resource<BucketRes>,
        key: String,
    ) -> Result<Resource<CasRes>, wasi_kv::Error> {
        // Spin 4.0.2 reads nothing here: the value is read by `current`.
        let seen = if self.shared.spin() {
            None
        } else {
            Some(
                self.kv(KvOp::Other, {
                    let key = key.clone();
                    move |kv| kv.get(&key)
                })
                .await
                .map_err(wasi_err)?,
            )
        };
        self.table
            .push(CasRes { key, seen })
            .map_err(|e| wasi_kv::Error::Other(format!("resource table: {e}")))
    }

    async fn current(&mut self, cas: Resource<CasRes>) -> Result<Option<Vec<u8>>, wasi_kv::Error> {
        let handle = self
            .table
            .get(&cas)
            .map_err(|e| wasi_kv::Error::Other(e.to_string()))?;
        if !self.shared.spin() {
            return Ok(handle.seen.clone().flatten());
        }
        // Spin 4.0.2 reads the store on every call and remembers the value
        // for `swap`.
        let key = handle.key.clone();
        let now = self
            .kv(KvOp::Other, move |kv| kv.get(&key))
            .await
            .map_err(wasi_err)?;
        self.table
            .get_mut(&cas)
            .map_err(|e| wasi_kv::Error::Other(e.to_string()))?
            .seen = Some(now.clone());
        Ok(now)
    }

    async fn drop(&mut self, rep: Resource<CasRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl batch::Host for HostState {
    async fn get_many(
        &mut self,
        _: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> Result<Vec<(String, Option<Vec<u8>>)>, wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.get_many_pairs(&keys))
            .await
            .map_err(wasi_err)
    }

    async fn set_many(
        &mut self,
        _: Resource<BucketRes>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.set_many(&key_values))
            .await
            .map_err(wasi_err)
    }

    async fn delete_many(
        &mut self,
        _: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> Result<(), wasi_kv::Error> {
        self.kv(KvOp::Other, move |kv| kv.delete_many(&keys))
            .await
            .map_err(wasi_err)
    }
}

// ------------------------------------------------------------ engine & link

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{FailingKv, SqliteKv};
    use atomics::{Host as _, HostCas as _};
    use batch::Host as _;

    #[test]
    fn variable_names_follow_spin_rules() {
        assert!(valid_variable_name("jwt_access_secret"));
        assert!(valid_variable_name("a1"));
        assert!(!valid_variable_name("JWT"));
        assert!(!valid_variable_name("1a"));
        assert!(!valid_variable_name("a__b"));
        assert!(!valid_variable_name("a_"));
        assert!(!valid_variable_name(""));
    }

    fn state(
        name: &str,
        fail_after: Option<u64>,
        emulation: KvEmulation,
    ) -> (HostState, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("tfa-rt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut kv: Arc<dyn KvBackend> = Arc::new(SqliteKv::open_dir(&dir, emulation).unwrap());
        if let Some(n) = fail_after {
            kv = Arc::new(FailingKv::new(kv, n, None));
        }
        let shared = Arc::new(Shared {
            kv,
            variables: [("node_env".to_string(), "production".to_string())]
                .into_iter()
                .collect(),
            environment: Vec::new(),
            allow: Arc::new(AllowList::default()),
            guard: Arc::default(),
            clock_offset: Duration::ZERO,
            kv_count: false,
            grants: Grants::API,
            chain: None,
            gate: crate::gate::Gate::new(1),
        });
        (HostState::new(&shared), dir)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn spin_and_wasi_interfaces_share_one_store() {
        let (mut s, dir) = state("share", None, KvEmulation::None);
        assert!(matches!(
            key_value::HostStore::open(&mut s, "other".into()).await,
            Err(key_value::Error::NoSuchStore)
        ));
        assert!(matches!(
            wasi_kv::Host::open(&mut s, "other".into()).await,
            Err(wasi_kv::Error::NoSuchStore)
        ));
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        let rep = st.rep();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"1".to_vec())
            .await
            .unwrap();
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        let b = || Resource::<BucketRes>::new_borrow(bucket.rep());
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "a".into())
                .await
                .unwrap(),
            Some(b"1".to_vec())
        );
        // Counters.
        assert_eq!(s.increment(b(), "n".into(), 2).await.unwrap(), 2);
        assert_eq!(s.increment(b(), "n".into(), 0).await.unwrap(), 2);
        // Batch: every asked key answered, in order.
        let many = s
            .get_many(b(), vec!["n".into(), "zz".into(), "a".into()])
            .await
            .unwrap();
        assert_eq!(
            many,
            vec![
                ("n".to_string(), Some(b"2".to_vec())),
                ("zz".to_string(), None),
                ("a".to_string(), Some(b"1".to_vec())),
            ]
        );
        // CAS: wins on the value seen, fails after someone else wrote, and
        // never creates a missing key.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        let current = s.current(Resource::new_borrow(cas.rep())).await.unwrap();
        assert_eq!(current, Some(b"1".to_vec()));
        s.swap(cas, b"2".to_vec()).await.unwrap();
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"3".to_vec())
            .await
            .unwrap();
        match s.swap(cas, b"4".to_vec()).await {
            Err(atomics::CasError::CasFailed(again)) => {
                let now = s.current(Resource::new_borrow(again.rep())).await.unwrap();
                assert_eq!(now, Some(b"3".to_vec()));
            }
            other => panic!("expected CasFailed, got {:?}", other.is_ok()),
        }
        let cas = atomics::HostCas::new(&mut s, b(), "missing".into())
            .await
            .unwrap();
        assert!(matches!(
            s.swap(cas, b"x".to_vec()).await,
            Err(atomics::CasError::CasFailed(_))
        ));
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "missing".into())
                .await
                .unwrap(),
            None
        );
        // Variables.
        assert_eq!(
            variables::Host::get(&mut s, "node_env".into())
                .await
                .unwrap(),
            "production"
        );
        assert!(matches!(
            variables::Host::get(&mut s, "nope".into()).await,
            Err(variables::Error::Undefined(_))
        ));
        assert!(matches!(
            variables::Host::get(&mut s, "NODE_ENV".into()).await,
            Err(variables::Error::InvalidName(_))
        ));
        // The same variables through wasi:config: one, or all at once.
        assert_eq!(
            wasi_config::Host::get(&mut s, "node_env".into())
                .await
                .unwrap(),
            Some("production".into())
        );
        assert_eq!(
            wasi_config::Host::get(&mut s, "nope".into()).await.unwrap(),
            None
        );
        assert_eq!(
            wasi_config::Host::get_all(&mut s).await.unwrap(),
            vec![("node_env".to_string(), "production".to_string())]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn store_failures_are_error_values() {
        let (mut s, dir) = state("fail", Some(1), KvEmulation::None);
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        assert!(matches!(
            key_value::HostStore::get(&mut s, Resource::new_borrow(st.rep()), "a".into()).await,
            Err(key_value::Error::Other(_))
        ));
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        assert!(matches!(
            s.increment(Resource::new_borrow(bucket.rep()), "n".into(), 1)
                .await,
            Err(wasi_kv::Error::Other(_))
        ));
        assert!(
            atomics::HostCas::new(&mut s, Resource::new_borrow(bucket.rep()), "k".into())
                .await
                .is_err()
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `KV_EMULATE=spin-4.0.2` over SQLite, through the interfaces the
    /// component calls: what Spin 4.0.2's SQLite store and dispatch do.
    #[tokio::test(flavor = "multi_thread")]
    async fn spin_4_0_2_sqlite_through_the_interfaces() {
        let (mut s, dir) = state("spin402", None, KvEmulation::Spin402);
        // Labels the manifest does not grant are access-denied.
        assert!(matches!(
            key_value::HostStore::open(&mut s, "other".into()).await,
            Err(key_value::Error::AccessDenied)
        ));
        assert!(matches!(
            wasi_kv::Host::open(&mut s, "other".into()).await,
            Err(wasi_kv::Error::AccessDenied)
        ));
        let st = key_value::HostStore::open(&mut s, "default".into())
            .await
            .unwrap();
        let rep = st.rep();
        let bucket = wasi_kv::Host::open(&mut s, "default".into()).await.unwrap();
        let b = || Resource::<BucketRes>::new_borrow(bucket.rep());

        // A counter reads back, through Spin's key-value, as 8 LE bytes.
        assert_eq!(s.increment(b(), "n".into(), 258).await.unwrap(), 258);
        assert_eq!(
            key_value::HostStore::get(&mut s, Resource::new_borrow(rep), "n".into())
                .await
                .unwrap(),
            Some(258i64.to_le_bytes().to_vec())
        );
        // Incrementing a value that is not 8 bytes is an error, not a trap.
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"1".to_vec())
            .await
            .unwrap();
        assert!(matches!(
            s.increment(b(), "a".into(), 1).await,
            Err(wasi_kv::Error::Other(_))
        ));

        // get-many: only the keys that exist, each once, in key order.
        let many = s
            .get_many(b(), vec!["zz".into(), "n".into(), "a".into(), "n".into()])
            .await
            .unwrap();
        assert_eq!(
            many,
            vec![
                ("a".to_string(), Some(b"1".to_vec())),
                ("n".to_string(), Some(258i64.to_le_bytes().to_vec())),
            ]
        );
        assert_eq!(s.get_many(b(), vec![]).await.unwrap(), vec![]);

        // CAS on a missing key writes unconditionally.
        let cas = atomics::HostCas::new(&mut s, b(), "fresh".into())
            .await
            .unwrap();
        assert_eq!(
            s.current(Resource::new_borrow(cas.rep())).await.unwrap(),
            None
        );
        s.swap(cas, b"x".to_vec()).await.unwrap();
        assert_eq!(
            wasi_kv::HostBucket::get(&mut s, b(), "fresh".into())
                .await
                .unwrap(),
            Some(b"x".to_vec())
        );
        // So does a swap without `current` (nothing was read), even over
        // a value someone wrote.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"2".to_vec())
            .await
            .unwrap();
        s.swap(cas, b"3".to_vec()).await.unwrap();
        // With `current`, it is UPDATE … WHERE value = old: the value read
        // when `current` ran (not when the handle was made) wins…
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"4".to_vec())
            .await
            .unwrap();
        assert_eq!(
            s.current(Resource::new_borrow(cas.rep())).await.unwrap(),
            Some(b"4".to_vec())
        );
        s.swap(cas, b"5".to_vec()).await.unwrap();
        // …and a write after `current` makes it fail, with a fresh handle.
        let cas = atomics::HostCas::new(&mut s, b(), "a".into())
            .await
            .unwrap();
        s.current(Resource::new_borrow(cas.rep())).await.unwrap();
        key_value::HostStore::set(&mut s, Resource::new_borrow(rep), "a".into(), b"6".to_vec())
            .await
            .unwrap();
        match s.swap(cas, b"7".to_vec()).await {
            Err(atomics::CasError::CasFailed(again)) => {
                let now = s.current(Resource::new_borrow(again.rep())).await.unwrap();
                assert_eq!(now, Some(b"6".to_vec()));
            }
            other => panic!("expected CasFailed, got {:?}", other.is_ok()),
        }

        // list-keys: no cursor allowed.
        let page = wasi_kv::HostBucket::list_keys(&mut s, b(), None)
            .await
            .unwrap();
        assert_eq!(page.keys, ["a", "fresh", "n"]);
        assert!(matches!(
            wasi_kv::HostBucket::list_keys(&mut s, b(), Some("a".into())).await,
            Err(wasi_kv::Error::Other(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
