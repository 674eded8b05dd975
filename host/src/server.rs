//! The HTTP server: one component instance per request, served concurrently
//! by tokio + hyper, with a log line per request and a graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::WasiHttpView;

use crate::conn::{Activity, Tracked};
use crate::metrics::GaugeGuard;
use crate::runtime::{new_store, run_handler, HostState, Shared, MAX_INSTANCES};

/// The request id header.
const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
/// Asks the component for the user id of its reply (JSON log lines only).
const OBSERVE: http::HeaderName = http::HeaderName::from_static("spin-tfa-observe");
/// The component's answer to [`OBSERVE`]; never reaches the client.
const USER_ID: http::HeaderName = http::HeaderName::from_static("tfa-user-id");

/// How often the connection cap's line may be logged.
const CAP_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long shutdown waits for open connections and running instances.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The server's limits (settings of the host, see the crate documentation).
#[derive(Debug, Clone)]
pub struct Limits {
    /// The longest an instance may run, after-response work included
    /// (`REQUEST_TIMEOUT_MS`).
    pub request_timeout: Duration,
    /// The longest a client may take to send a request's head
    /// (`HEADER_READ_TIMEOUT_MS`).
    pub header_read_timeout: Duration,
    /// A keep-alive connection that moves no byte for this long between
    /// requests is closed (`IDLE_TIMEOUT_MS`).
    pub idle_timeout: Duration,
    /// Open connections at most (`MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Instances of one component past the memory threshold at once
    /// (`MAX_HEAVY_INSTANCES`, [`crate::gate`]).
    pub heavy_instances: usize,
    /// One request per this interval checks the service's queues after
    /// its response; zero: every request (`MAINTENANCE_INTERVAL_MS`,
    /// [`crate::maintenance`]).
    pub maintenance_interval: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_timeout: Duration::from_millis(crate::DEFAULT_REQUEST_TIMEOUT_MS),
            header_read_timeout: Duration::from_millis(crate::DEFAULT_HEADER_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(crate::DEFAULT_IDLE_TIMEOUT_MS),
            max_connections: crate::DEFAULT_MAX_CONNECTIONS,
            heavy_instances: crate::gate::default_heavy_instances(),
            maintenance_interval: Duration::from_millis(crate::maintenance::DEFAULT_INTERVAL_MS),
        }
    }
}

/// What the server reports about requests.
#[derive(Debug, Clone)]
pub struct Observe {
    /// How request lines are written (`LOG_FORMAT`).
    pub log_format: crate::accesslog::Format,
    /// The service's base path (`API_BASE_PATH`), to name routes.
    pub base_path: String,
}

impl Default for Observe {
    fn default() -> Observe {
        Observe {
            log_format: crate::accesslog::Format::Text,
            base_path: "/api".into(),
        }
    }
}

/// The route pattern of `path` under `base` as core's router names it
/// (`/api/webhooks/{webhookId}`), or `unmatched`: never the raw path, which
/// may carry ids or tokens.
pub fn route_pattern(base: &str, path: &str) -> String {
    use tfa_core::api::router::{resolve, segments};
    let base = base.trim_end_matches('/');
    segments(path, base)
        .and_then(|segs| resolve(&segs))
        .and_then(|(routes, _)| routes.first().map(|r| format!("{base}{}", r.path)))
        .unwrap_or_else(|| "unmatched".into())
}

/// How an instance's run ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// The handler returned.
    Done,
    /// The handler trapped or a host call failed.
    Failed,
    /// Stopped at the deadline.
    Deadline,
}

/// An instance's run, polled by the request's own task until the instance
/// has answered, then (or when that task is dropped, its client gone) left
/// to a task of its own for whatever it does after its response.
///
/// Polling it in place, instead of spawning it at once, keeps a request
/// that has nothing left to do after its response (the floor, `GET
/// /health`, `GET /auth/me`) on one task: no spawn and no wake-up from the
/// instance's task to the connection's, and a component that writes its
/// body right after setting its response (as `spin-app`'s `send` does) has
/// written it before hyper writes the head. Measured against the spawned
/// task (alternating `wrk -t2 -c32` pairs, 2026-12-01): the floor component
/// +2 to +9 % requests/s, `GET /health` and `GET /auth/me` +1 to +4 %,
/// `POST /2fa/verify` level within noise; no change at concurrency 1.
struct Run<F: Future<Output = Outcome> + Send + 'static> {
    run: Option<Pin<Box<F>>>,
    ended: Option<Outcome>,
}

impl<F: Future<Output = Outcome> + Send + 'static> Run<F> {
    fn new(run: F) -> Run<F> {
        Run {
            run: Some(Box::pin(run)),
            ended: None,
        }
    }

    /// Runs the instance until it waits for something or ends; whether it
    /// has ended (how: [`Run::detach`]).
    fn poll_run(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(run) = self.run.as_mut() {
            if let Poll::Ready(outcome) = run.as_mut().poll(cx) {
                self.run = None;
                self.ended = Some(outcome);
            }
        }
        self.ended.is_some()
    }

    /// Leaves the rest of the run, if any, to a task of its own; how it
    /// ended if it has.
    fn detach(&mut self) -> Option<Outcome> {
        if let Some(run) = self.run.take() {
            // Within the server every drop happens on the runtime; outside
            // it (the runtime shutting down) the run is stopped, as its
            // task would have been.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                drop(rt.spawn(run));
            }
        }
        self.ended
    }
}

impl<F: Future<Output = Outcome> + Send + 'static> Drop for Run<F> {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Serves the component.
pub struct Server {
    pre: ProxyPre<HostState>,
    shared: Arc<Shared>,
    limits: Limits,
    observe: Observe,
    /// One permit per running instance, held until its after-response
    /// effects are done; shutdown takes them all to wait for those.
    instances: Arc<Semaphore>,
    /// Which requests check the service's queues.
    maintenance: crate::maintenance::Ticker,
}

fn error_response(status: u16, message: &str) -> hyper::Response<HyperOutgoingBody> {
    let body = format!(r#"{{"success":false,"error":"{message}"}}"#);
    let mut resp = hyper::Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

impl Server {
    /// A server for the pre-instantiated component.
    pub fn new(
        pre: ProxyPre<HostState>,
        shared: Arc<Shared>,
        limits: Limits,
        observe: Observe,
    ) -> Server {
        let maintenance =
            crate::maintenance::Ticker::new(limits.maintenance_interval, crate::now());
        Server {
            pre,
            shared,
            limits,
            observe,
            instances: Arc::new(Semaphore::new(MAX_INSTANCES as usize)),
            maintenance,
        }
    }

    /// Handles one request; never fails (errors become 500/503 answers).
    async fn handle(
        self: Arc<Self>,
        req: hyper::Request<hyper::body::Incoming>,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<hyper::Response<HyperOutgoingBody>, Infallible> {
        let started = crate::now();
        let mut req = req;
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        // X-Request-Id: the client's when valid, else a new one; the
        // component sees it as a request header, the client gets it back.
        let request_id = match req.headers().get(REQUEST_ID) {
            Some(v) if crate::accesslog::valid_request_id(v.as_bytes()) => v.clone(),
            _ => http::HeaderValue::from_str(&crate::accesslog::new_request_id())
                .unwrap_or_else(|_| http::HeaderValue::from_static("invalid")),
        };
        req.headers_mut().insert(REQUEST_ID, request_id.clone());
        let mut resp = self.run(req, peer, local, started).await;
        resp.headers_mut().insert(REQUEST_ID, request_id.clone());
        // The component's answer to `spin-tfa-observe`: for the log only.
        let user_id = resp.headers_mut().remove(USER_ID);
        let metrics = crate::metrics::get();
        let route =
            if metrics.is_some() || self.observe.log_format == crate::accesslog::Format::Json {
                route_pattern(&self.observe.base_path, &path)
            } else {
                String::new()
            };
        let took = started.elapsed();
        if let Some(m) = metrics {
            m.request(&route, &method, resp.status().as_u16(), took);
        }
        crate::accesslog::request(
            self.observe.log_format,
            &crate::accesslog::Request {
                method: &method,
                path: &path,
                route: &route,
                request_id: request_id.to_str().unwrap_or_default(),
                user_id: user_id.as_ref().and_then(|v| v.to_str().ok()),
                status: resp.status().as_u16(),
                duration: took,
            },
        );
        Ok(resp)
    }

    async fn run(
        &self,
        mut req: hyper::Request<hyper::body::Incoming>,
        peer: SocketAddr,
        local: SocketAddr,
        arrived: std::time::Instant,
    ) -> hyper::Response<HyperOutgoingBody> {
        // The spin-* headers are the host's to set, never the client's.
        let spin_headers: Vec<_> = req
            .headers()
            .keys()
            .filter(|k| k.as_str().starts_with("spin-"))
            .cloned()
            .collect();
        for k in spin_headers {
            req.headers_mut().remove(k);
        }
        let headers = req.headers_mut();
        if let Ok(v) = http::HeaderValue::from_str(&peer.to_string()) {
            headers.insert("spin-client-addr", v);
        }
        if self.observe.log_format == crate::accesslog::Format::Json {
            headers.insert(OBSERVE, http::HeaderValue::from_static("user"));
        }
        if !self.maintenance.check(arrived) {
            headers.insert(crate::maintenance::HEADER, crate::maintenance::SKIP);
        }
        if !headers.contains_key(http::header::HOST) {
            if let Ok(v) = http::HeaderValue::from_str(&local.to_string()) {
                headers.insert(http::header::HOST, v);
            }
        }

        let label = format!(
            "{} {}",
            req.method(),
            crate::accesslog::shown_path(req.uri().path())
        );
        let kv_label = self.shared.kv_count.then(|| label.clone());
        let metrics = crate::metrics::get();
        // A guard, so that a request dropped while it waits (its client
        // gone) is not counted as waiting forever.
        let waiting = metrics.map(|m| GaugeGuard::inc(&m.instances_waiting));
        let permit = self.instances.clone().acquire_owned().await;
        drop(waiting);
        let Ok(permit) = permit else {
            return error_response(503, "Service unavailable");
        };
        let in_use = metrics.map(|m| GaugeGuard::inc(&m.instances_in_use));
        let mut store = new_store(self.pre.engine(), &self.shared);
        let used_store = store.data().kv_ops.clone();
        let kv_ops = kv_label.map(|label| (store.data().kv_ops.clone(), label));
        let (tx, rx) = tokio::sync::oneshot::channel();
        // With KV_COUNT, the operations before the response are counted at
        // the moment the component hands its response over, in its own
        // call: once this task wakes up to receive it, the after-response
        // work may have run already.
        let at_answer = kv_ops.clone();
        // Handing the response over gives the instance's gate permit back
        // (`crate::gate`): its after-response work never holds one.
        let release = store.data().limiter.release();
        let answer = move |response| {
            release.release();
            if let Some((ops, label)) = &at_answer {
                crate::accesslog::line(&format!(
                    "kv-ops {label} before-response {}",
                    format_ops(ops.snapshot())
                ));
            }
            let _ = tx.send(response);
        };
        let prepared = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, req)
            .and_then(|r| {
                let out = store
                    .data_mut()
                    .http()
                    .new_response_outparam_from_callback(answer)?;
                Ok((r, out))
            });
        let (req, out) = match prepared {
            Ok(p) => p,
            Err(e) => {
                eprintln!("tfa-host: bad request: {e:#}");
                return error_response(400, "Bad request");
            }
        };
        let pre = self.pre.clone();
        let deadline = self.limits.request_timeout;
        let answered = Arc::new(AtomicBool::new(false));
        let answered_task = answered.clone();
        // The instance's run goes on after the response (the component's
        // after-response effects), in a task of its own from then on
        // ([`Run`]), within the deadline: at the deadline the future is
        // dropped (a looping guest yields at every epoch tick, see
        // `runtime::new_store`), which stops the instance and frees its
        // slot; the permit goes with the run.
        let kv_ops_task = kv_ops.clone();
        let mut instance = Run::new(async move {
            let _permit = permit;
            let _in_use = in_use;
            let _log = KvOpsLog(kv_ops_task);
            let started = crate::now();
            match run_handler(&pre, &mut store, req, out, deadline).await {
                Ok(Ok(())) => Outcome::Done,
                Ok(Err(e)) => {
                    eprintln!("tfa-host: component error: {e:?}");
                    Outcome::Failed
                }
                Err(_) => {
                    crate::log::warn(&format!(
                        "request deadline exceeded (REQUEST_TIMEOUT_MS={}): {label} \
                         stopped after {} ms {}; its slot is free",
                        deadline.as_millis(),
                        started.elapsed().as_millis(),
                        if answered_task.load(Ordering::Relaxed) {
                            "after its response"
                        } else {
                            "before any response (answered 503)"
                        }
                    ));
                    if let Some(m) = crate::metrics::get() {
                        m.deadline_exceeded.inc();
                    }
                    Outcome::Deadline
                }
            }
        });
        // The instance runs in this request's task until it answers (see
        // [`Run`]); the instance's store holds the answer's sender, so once
        // the run has ended the answer has come or never will.
        let mut rx = rx;
        let answer = std::future::poll_fn(|cx| {
            let ended = instance.poll_run(cx);
            match Pin::new(&mut rx).poll(cx) {
                // `None`: the instance ended without an answer.
                Poll::Ready(answer) => Poll::Ready(answer.ok()),
                Poll::Pending if ended => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        let ended = instance.detach();
        match answer {
            Some(Ok(resp)) => {
                // Nothing the store says leaves before it is durable.
                if used_store.snapshot().iter().any(|&n| n > 0) {
                    if let Err(withheld) = self.durable(deadline).await {
                        return withheld;
                    }
                }
                answered.store(true, Ordering::Relaxed);
                resp
            }
            Some(Err(code)) => {
                eprintln!("tfa-host: component answered with an error: {code:?}");
                error_response(500, "Internal server error")
            }
            None => match ended {
                Some(Outcome::Deadline) => error_response(503, "Service unavailable"),
                Some(Outcome::Done | Outcome::Failed) | None => {
                    error_response(500, "Internal server error")
                }
            },
        }
    }

    /// Waits, at most `deadline`, until everything written to the store so
    /// far is durable ([`crate::kv::KvBackend::durable`]); `Err` is the
    /// answer to send instead of the component's.
    async fn durable(&self, deadline: Duration) -> Result<(), hyper::Response<HyperOutgoingBody>> {
        let Some(durable) = self.shared.kv.durable() else {
            return Ok(());
        };
        let waited = crate::now();
        let out = tokio::time::timeout(deadline, durable).await;
        if let Some(m) = crate::metrics::get() {
            m.durable_wait.observe(waited.elapsed().as_secs_f64());
        }
        let why = match out {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the store was not durable within REQUEST_TIMEOUT_MS".to_string(),
        };
        eprintln!("tfa-host: response withheld: {why}");
        Err(error_response(503, "Service unavailable"))
    }

    /// Accepts connections on `listener` until `shutdown` resolves, then
    /// stops accepting, lets open connections finish their requests, and
    /// waits for running instances (including after-response work).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        let limits = self.limits.clone();
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        let mut cap_logged: Option<std::time::Instant> = None;
        tokio::pin!(shutdown);
        loop {
            // A connection slot first: at the cap nothing is accepted, so
            // new connections wait in the listen backlog.
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    if cap_logged.is_none_or(|t| t.elapsed() >= CAP_LOG_EVERY) {
                        cap_logged = Some(crate::now());
                        crate::log::warn(&format!(
                            "MAX_CONNECTIONS={} connections open: not accepting more until one \
                             closes",
                            limits.max_connections
                        ));
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        Some(_) = conns.join_next(), if !conns.is_empty() => continue,
                    }
                }
            };
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            eprintln!("tfa-host: accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    // No Nagle: hyper writes a streamed response's head and
                    // body separately, and with Nagle the body waited for
                    // the client's delayed ACK of the head (40 ms on Linux):
                    // about 1 % of keep-alive requests took 33-37 ms.
                    if let Err(e) = stream.set_nodelay(true) {
                        eprintln!("tfa-host: TCP_NODELAY not set for {peer}: {e}");
                    }
                    let server = self.clone();
                    let mut stop = stop_rx.clone();
                    let limits = limits.clone();
                    conns.spawn(async move {
                        let _slot = slot;
                        let _open = crate::metrics::get()
                            .map(|m| GaugeGuard::inc(&m.connections_open));
                        let _open_for_store = OpenConnection::new(server.shared.kv.clone());
                        let activity = Arc::new(Activity::default());
                        let act = activity.clone();
                        let svc = hyper::service::service_fn(move |req| {
                            let busy = act.request();
                            let server = server.clone();
                            async move {
                                let r = server.handle(req, peer, local).await;
                                drop(busy);
                                r
                            }
                        });
                        let conn = http1::Builder::new()
                            .keep_alive(true)
                            .timer(TokioTimer::new())
                            .header_read_timeout(limits.header_read_timeout)
                            .serve_connection(
                                TokioIo::new(Tracked::new(stream, activity.clone())),
                                svc,
                            );
                        tokio::pin!(conn);
                        let r = tokio::select! {
                            r = conn.as_mut() => r,
                            _ = stop.changed() => {
                                conn.as_mut().graceful_shutdown();
                                conn.await
                            }
                            _ = activity.idle_for(limits.idle_timeout) => {
                                crate::log::debug(&format!(
                                    "connection from {peer} closed: idle for IDLE_TIMEOUT_MS={}",
                                    limits.idle_timeout.as_millis()
                                ));
                                conn.as_mut().graceful_shutdown();
                                conn.await
                            }
                        };
                        if let Err(e) = r {
                            log_conn_error(&e, peer, &limits);
                        }
                    });
                }
            }
        }
        eprintln!("tfa-host: shutting down: no new connections, finishing requests…");
        drop(listener);
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while conns.join_next().await.is_some() {}
            // Every permit back = no instance still running.
            let _ = self.instances.acquire_many(MAX_INSTANCES).await;
        })
        .await;
        if drained.is_err() {
            eprintln!(
                "tfa-host: gave up waiting after {}s",
                DRAIN_TIMEOUT.as_secs()
            );
        }
    }
}

/// A client connection, told to the store
/// ([`crate::kv::KvBackend::connection_opened`]) for as long as it is open.
struct OpenConnection(Arc<dyn crate::kv::KvBackend>);

impl OpenConnection {
    fn new(kv: Arc<dyn crate::kv::KvBackend>) -> Self {
        kv.connection_opened();
        OpenConnection(kv)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connection_closed();
    }
}

/// Logs a request's key-value operations once its instance has ended.
struct KvOpsLog(Option<(Arc<crate::runtime::KvOps>, String)>);

impl Drop for KvOpsLog {
    fn drop(&mut self) {
        if let Some((ops, label)) = &self.0 {
            crate::accesslog::line(&format!(
                "kv-ops {label} total {}",
                format_ops(ops.snapshot())
            ));
        }
    }
}

fn format_ops(o: [u32; 5]) -> String {
    format!(
        "get={} set={} delete={} increment={} other={}",
        o[0], o[1], o[2], o[3], o[4]
    )
}

fn log_conn_error(e: &hyper::Error, peer: SocketAddr, limits: &Limits) {
    if e.is_timeout() {
        if let Some(m) = crate::metrics::get() {
            m.header_timeouts.inc();
        }
        crate::log::warn(&format!(
            "connection from {peer} closed: no complete request head within \
             HEADER_READ_TIMEOUT_MS={}",
            limits.header_read_timeout.as_millis()
        ));
    } else if !e.is_incomplete_message() {
        crate::log::warn(&format!("connection error: {e}"));
    }
}
