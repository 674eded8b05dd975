//! Metrics in the Prometheus text format on a listener of their own
//! (`METRICS_ADDR`, off by default; loopback addresses only, like the
//! service's own listener).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `tfa_http_requests_total` | `route`, `method`, `status` | requests answered; `route` is core's pattern (`/api/webhooks/{webhookId}`) or `unmatched` |
//! | `tfa_http_request_duration_seconds` | `route` | histogram, request head to response head |
//! | `tfa_store_operation_duration_seconds` | `op` | histogram of key-value operations (`get`, `set`, `delete`, `increment`, `other`) |
//! | `tfa_store_errors_total` | `op` | failed key-value operations |
//! | `tfa_store_syncs_total` | | syncs of SQLite's write-ahead log (each makes every commit before it durable, `crate::walsync`) |
//! | `tfa_store_durable_wait_seconds` | | histogram, how long a response waited for its store's writes to become durable (only responses that waited) |
//! | `tfa_instances_in_use` | | instance slots running a request (at most 64) |
//! | `tfa_instances_waiting` | | requests waiting for a slot |
//! | `tfa_instances_heavy` | | instances holding more than 4 MiB of linear memory (hashing a password), at most `MAX_HEAVY_INSTANCES` per component (`crate::gate`) |
//! | `tfa_instances_heavy_waiting` | | instances waiting to grow past 4 MiB |
//! | `tfa_outbound_requests_total` | `kind`, `outcome` | `kind="http"` (SMS gateway, webhooks): `ok` (any status), `error`, `denied`; `kind="smtp"` (connections): `allowed`, `denied` |
//! | `tfa_request_deadline_exceeded_total` | | instances stopped at `REQUEST_TIMEOUT_MS` |
//! | `tfa_connections_open` | | open client connections |
//! | `tfa_header_timeouts_total` | | connections closed at `HEADER_READ_TIMEOUT_MS` |
//! | `tfa_webhook_deliveries_pending` | | webhook deliveries created and not yet settled (succeeded, given up or removed), across every instance sharing the store; read from core's two counters at each scrape (`-1` when the store cannot be read) |

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use prometheus::{
    Encoder as _, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// Every metric of the host.
pub struct Metrics {
    registry: Registry,
    /// Requests by route, method, status.
    pub requests: IntCounterVec,
    /// Request durations by route.
    pub request_seconds: HistogramVec,
    /// Store operation durations by kind.
    pub store_seconds: HistogramVec,
    /// Store errors by kind.
    pub store_errors: IntCounterVec,
    /// Syncs of SQLite's write-ahead log.
    pub store_syncs: IntCounter,
    /// Responses' waits for durability.
    pub durable_wait: Histogram,
    /// Instance slots in use.
    pub instances_in_use: IntGauge,
    /// Requests waiting for a slot.
    pub instances_waiting: IntGauge,
    /// Instances past the gate's memory threshold.
    pub instances_heavy: IntGauge,
    /// Instances waiting at the gate.
    pub instances_heavy_waiting: IntGauge,
    /// Outbound calls by kind and outcome.
    pub outbound: IntCounterVec,
    /// Instances stopped at the deadline.
    pub deadline_exceeded: IntCounter,
    /// Open client connections.
    pub connections_open: IntGauge,
    /// Connections closed at the header-read timeout.
    pub header_timeouts: IntCounter,
    /// Webhook deliveries pending (set at each scrape from the store).
    pub webhooks_pending: IntGauge,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// Holds a gauge one higher until dropped (also when the future holding it
/// is dropped at a deadline or a client's disconnect).
pub struct GaugeGuard(IntGauge);

impl GaugeGuard {
    /// Raises `g` by one until the guard is dropped.
    pub fn inc(g: &IntGauge) -> GaugeGuard {
        g.inc();
        GaugeGuard(g.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The metrics, when `METRICS_ADDR` turned them on.
pub fn get() -> Option<&'static Metrics> {
    METRICS.get()
}

/// Turns metrics on (once; later calls change nothing).
pub fn enable() -> anyhow::Result<&'static Metrics> {
    if let Some(m) = METRICS.get() {
        return Ok(m);
    }
    let m = Metrics::new()?;
    Ok(METRICS.get_or_init(|| m))
}

const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
const STORE_BUCKETS: &[f64] = &[
    0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
    1.0,
];

impl Metrics {
    fn new() -> anyhow::Result<Metrics> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("tfa_http_requests_total", "Requests answered."),
            &["route", "method", "status"],
        )?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "tfa_http_request_duration_seconds",
                "From a request's head to its response's head.",
            )
            .buckets(REQUEST_BUCKETS.to_vec()),
            &["route"],
        )?;
        let store_seconds = HistogramVec::new(
            HistogramOpts::new(
                "tfa_store_operation_duration_seconds",
                "Key-value store operations.",
            )
            .buckets(STORE_BUCKETS.to_vec()),
            &["op"],
        )?;
        let store_errors = IntCounterVec::new(
            Opts::new("tfa_store_errors_total", "Failed key-value operations."),
            &["op"],
        )?;
        let store_syncs = IntCounter::new(
            "tfa_store_syncs_total",
            "Syncs of the SQLite store's write-ahead log.",
        )?;
        let durable_wait = Histogram::with_opts(
            HistogramOpts::new(
                "tfa_store_durable_wait_seconds",
                "How long a response waited for the store's writes to become durable.",
            )
            .buckets(STORE_BUCKETS.to_vec()),
        )?;
        let instances_in_use = IntGauge::new("tfa_instances_in_use", "Instance slots in use.")?;
        let instances_waiting =
            IntGauge::new("tfa_instances_waiting", "Requests waiting for a slot.")?;
        let instances_heavy = IntGauge::new(
            "tfa_instances_heavy",
            "Instances holding more than 4 MiB of linear memory.",
        )?;
        let instances_heavy_waiting = IntGauge::new(
            "tfa_instances_heavy_waiting",
            "Instances waiting to grow past 4 MiB of linear memory.",
        )?;
        let outbound = IntCounterVec::new(
            Opts::new(
                "tfa_outbound_requests_total",
                "Outbound calls of the component.",
            ),
            &["kind", "outcome"],
        )?;
        let deadline_exceeded = IntCounter::new(
            "tfa_request_deadline_exceeded_total",
            "Instances stopped at REQUEST_TIMEOUT_MS.",
        )?;
        let connections_open = IntGauge::new("tfa_connections_open", "Open client connections.")?;
        let header_timeouts = IntCounter::new(
            "tfa_header_timeouts_total",
            "Connections closed at HEADER_READ_TIMEOUT_MS.",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        registry.register(Box::new(store_seconds.clone()))?;
        registry.register(Box::new(store_errors.clone()))?;
        registry.register(Box::new(store_syncs.clone()))?;
        registry.register(Box::new(durable_wait.clone()))?;
        registry.register(Box::new(instances_in_use.clone()))?;
        registry.register(Box::new(instances_waiting.clone()))?;
        registry.register(Box::new(instances_heavy.clone()))?;
        registry.register(Box::new(instances_heavy_waiting.clone()))?;
        registry.register(Box::new(outbound.clone()))?;
        registry.register(Box::new(deadline_exceeded.clone()))?;
        registry.register(Box::new(connections_open.clone()))?;
        registry.register(Box::new(header_timeouts.clone()))?;
        let webhooks_pending = IntGauge::new(
            "tfa_webhook_deliveries_pending",
            "Webhook deliveries created and not yet settled (read from the store at each scrape; -1 if it cannot be read).",
        )?;
        registry.register(Box::new(webhooks_pending.clone()))?;
        // Every series of the fixed label sets exists from the start (at
        // zero), so a scrape shows them before the first event.
        for op in ["get", "set", "delete", "increment", "other"] {
            store_seconds.with_label_values(&[op]);
            store_errors.with_label_values(&[op]);
        }
        for (kind, outcome) in [
            ("http", "ok"),
            ("http", "error"),
            ("http", "denied"),
            ("smtp", "allowed"),
            ("smtp", "denied"),
        ] {
            outbound.with_label_values(&[kind, outcome]);
        }
        Ok(Metrics {
            registry,
            requests,
            request_seconds,
            store_seconds,
            store_errors,
            store_syncs,
            durable_wait,
            instances_in_use,
            instances_waiting,
            instances_heavy,
            instances_heavy_waiting,
            outbound,
            deadline_exceeded,
            connections_open,
            header_timeouts,
            webhooks_pending,
        })
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            crate::log::error(&format!("metrics: cannot encode: {e}"));
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Records one answered request.
    pub fn request(&self, route: &str, method: &str, status: u16, took: Duration) {
        let code = status.to_string();
        self.requests
            .with_label_values(&[route, method_label(method), code.as_str()])
            .inc();
        self.request_seconds
            .with_label_values(&[route])
            .observe(took.as_secs_f64());
    }

    /// Records one store operation.
    pub fn store(&self, op: &str, took: Duration, ok: bool) {
        self.store_seconds
            .with_label_values(&[op])
            .observe(took.as_secs_f64());
        if !ok {
            self.store_errors.with_label_values(&[op]).inc();
        }
    }

    /// Records one outbound call.
    pub fn outbound(&self, kind: &str, outcome: &str) {
        self.outbound.with_label_values(&[kind, outcome]).inc();
    }
}

/// The method as a label: the usual ones, else `other` (a client may send
/// any token as a method; labels must stay few).
pub fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// Parses `METRICS_ADDR` (`127.0.0.1:9464`; loopback addresses only).
pub fn parse_addr(v: &str) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = v
        .parse()
        .map_err(|_| format!("METRICS_ADDR must be IP:PORT, e.g. 127.0.0.1:9464, not {v:?}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "METRICS_ADDR must be a loopback address (the host listens on loopback only), not {v:?}"
        ));
    }
    Ok(addr)
}

/// The answer to one request of the metrics listener: for `/metrics`, the
/// pending webhook deliveries read from `kv` (core's two counters, off the
/// async threads), then every metric; anything else is 404.
async fn answer(
    is_metrics: bool,
    metrics: &'static Metrics,
    kv: std::sync::Arc<dyn crate::kv::KvBackend>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    if !is_metrics {
        let mut r = hyper::Response::new(Full::new(Bytes::from_static(b"not found\n")));
        *r.status_mut() = http::StatusCode::NOT_FOUND;
        return Ok(r);
    }
    let pending = tokio::task::spawn_blocking(move || {
        tfa_core::api::webhooks::pending_deliveries(|key| kv.increment(key, 0))
    })
    .await;
    match pending {
        Ok(Ok(n)) => metrics
            .webhooks_pending
            .set(i64::try_from(n).unwrap_or(i64::MAX)),
        Ok(Err(e)) => {
            crate::log::warn(&format!(
                "metrics: cannot read pending webhook deliveries: {}",
                e.0
            ));
            metrics.webhooks_pending.set(-1);
        }
        Err(_) => metrics.webhooks_pending.set(-1),
    }
    let mut r = hyper::Response::new(Full::new(Bytes::from(metrics.render())));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(r)
}

/// Serves `GET /metrics` on `listener` until the process ends; each scrape
/// first reads the pending webhook deliveries from `kv`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: &'static Metrics,
    kv: std::sync::Arc<dyn crate::kv::KvBackend>,
) {
    use hyper::server::conn::http1;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                crate::log::warn(&format!("metrics: accept failed: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let kv = kv.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    answer(req.uri().path() == "/metrics", metrics, kv.clone())
                });
            let conn = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(wasmtime_wasi_http::io::TokioIo::new(stream), svc);
            let _ = conn.await;
        });
    }
}
