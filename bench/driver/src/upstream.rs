//! The upstream behind Envoy: answers every request with a small 200, and
//! `POST /api/auth/introspect` with an active session (the filter's
//! introspection call, needed only until its cache is warm).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use tokio::net::TcpListener;

const ACTIVE: &str = r#"{"success":true,"data":{"active":true,"sub":"bench-user","sid":"bench-session","mfa":true}}"#;

async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = if req.uri().path() == "/api/auth/introspect" {
        ACTIVE
    } else {
        r#"{"ok":true}"#
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// Serves on 127.0.0.1:`port` for at most `max_secs` (then exits).
pub async fn run(port: u16, max_secs: u64) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!(
        "tfa-bench upstream: listening on {}",
        listener.local_addr()?
    );
    let serve = async {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(a) => a,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let io = wasmtime_wasi_http::io::TokioIo::new(stream);
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(io, service_fn(answer))
                    .await;
            });
        }
    };
    tokio::select! {
        _ = serve => {}
        _ = tokio::time::sleep(Duration::from_secs(max_secs)) => {
            eprintln!("tfa-bench upstream: time limit reached, stopping");
        }
    }
    Ok(())
}
