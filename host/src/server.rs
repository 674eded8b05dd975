//! The HTTP server: one component instance per request, served concurrently
//! by tokio + hyper, with a log line per request and a graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::WasiHttpView;

use crate::runtime::{new_store, HostState, Shared, MAX_INSTANCES};

/// How long shutdown waits for open connections and running instances.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the component.
pub struct Server {
    pre: ProxyPre<HostState>,
    shared: Arc<Shared>,
    /// One permit per running instance, held until its after-response
    /// effects are done; shutdown takes them all to wait for those.
    instances: Arc<Semaphore>,
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
    pub fn new(pre: ProxyPre<HostState>, shared: Arc<Shared>) -> Server {
        Server {
            pre,
            shared,
            instances: Arc::new(Semaphore::new(MAX_INSTANCES as usize)),
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
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let resp = self.run(req, peer, local).await;
        crate::accesslog::line(&format!(
            "{method} {path} {} {}ms",
            resp.status().as_u16(),
            started.elapsed().as_millis()
        ));
        Ok(resp)
    }

    async fn run(
        &self,
        mut req: hyper::Request<hyper::body::Incoming>,
        peer: SocketAddr,
        local: SocketAddr,
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
        if !headers.contains_key(http::header::HOST) {
            if let Ok(v) = http::HeaderValue::from_str(&local.to_string()) {
                headers.insert(http::header::HOST, v);
            }
        }

        let kv_label = self
            .shared
            .kv_count
            .then(|| format!("{} {}", req.method(), req.uri().path()));
        let Ok(permit) = self.instances.clone().acquire_owned().await else {
            return error_response(503, "Service unavailable");
        };
        let mut store = new_store(self.pre.engine(), &self.shared);
        let kv_ops = kv_label.map(|label| (store.data().kv_ops.clone(), label));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let prepared = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, req)
            .and_then(|r| Ok((r, store.data_mut().http().new_response_outparam(tx)?)));
        let (req, out) = match prepared {
            Ok(p) => p,
            Err(e) => {
                eprintln!("tfa-host: bad request: {e:#}");
                return error_response(400, "Bad request");
            }
        };
        let pre = self.pre.clone();
        // The instance runs in its own task so that it can go on after the
        // response (the component's after-response effects).
        let kv_ops_task = kv_ops.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _log = KvOpsLog(kv_ops_task);
            let result = async {
                let proxy = pre.instantiate_async(&mut store).await?;
                proxy
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, req, out)
                    .await
            }
            .await;
            if let Err(e) = result {
                eprintln!("tfa-host: component error: {e:?}");
            }
        });
        let answer = rx.await;
        if let Some((ops, label)) = &kv_ops {
            crate::accesslog::line(&format!(
                "kv-ops {label} before-response {}",
                format_ops(ops.snapshot())
            ));
        }
        match answer {
            Ok(Ok(resp)) => resp,
            Ok(Err(code)) => {
                eprintln!("tfa-host: component answered with an error: {code:?}");
                error_response(500, "Internal server error")
            }
            Err(_) => error_response(500, "Internal server error"),
        }
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
        tokio::pin!(shutdown);
        loop {
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
                    let server = self.clone();
                    let mut stop = stop_rx.clone();
                    conns.spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            server.clone().handle(req, peer, local)
                        });
                        let conn = http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), svc);
                        tokio::pin!(conn);
                        tokio::select! {
                            r = conn.as_mut() => {
                                if let Err(e) = r { log_conn_error(&e) }
                            }
                            _ = stop.changed() => {
                                conn.as_mut().graceful_shutdown();
                                if let Err(e) = conn.await { log_conn_error(&e) }
                            }
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

fn log_conn_error(e: &hyper::Error) {
    if !e.is_incomplete_message() {
        eprintln!("tfa-host: connection error: {e}");
    }
}
