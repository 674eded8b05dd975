//! Sending an outgoing HTTP request with the connect-time SSRF check: the
//! name is resolved once ([`NetGuard::resolve`]), every answer checked, and
//! the TCP connection opened to exactly the checked address. Otherwise as
//! `wasmtime_wasi_http::default_send_request` (same TLS roots, hyper
//! HTTP/1, timeouts). Redirects are never followed (hyper's client does not).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use crate::netguard::NetGuard;

trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T> Stream for T where T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}

/// The sender's result: the response and the connection's driver.
pub type Sent = (
    http::Response<WasiBody>,
    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
);

/// Opens a TCP connection to one of the checked addresses for `host:port`.
async fn connect(
    guard: &NetGuard,
    host: &str,
    port: u16,
    explicit: bool,
    timeout: Duration,
) -> Result<TcpStream, HttpError> {
    let addrs = guard.resolve(host, port, explicit).await.map_err(|why| {
        eprintln!("tfa-host: outbound request to {host}:{port} denied: {why}");
        if why.starts_with("blocked network") {
            HttpError::InternalError(Some(why))
        } else {
            HttpError::DestinationNotFound
        }
    })?;
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                // The address connected to is the one checked.
                debug_assert_eq!(s.peer_addr().ok(), Some(addr as SocketAddr));
                // No Nagle: a request's head and streamed body are written
                // separately, and the body must not wait for the server's
                // delayed ACK of the head (up to 40 ms). Only speed is lost
                // if it cannot be set.
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(HttpError::Connect(e)),
            Err(_) => last = Some(HttpError::ConnectionTimeout),
        }
    }
    Err(last.unwrap_or(HttpError::DestinationNotFound))
}

/// Sends `req` (absolute URI) through `guard`; `explicit` when the operator
/// named its destination.
pub async fn send(
    mut req: http::Request<WasiBody>,
    opts: RequestOptions,
    guard: Arc<NetGuard>,
    explicit: bool,
) -> Result<Sent, HttpError> {
    let uri = req.uri().clone();
    let host = uri.host().ok_or(HttpError::HttpRequestUriInvalid)?;
    let use_tls = uri.scheme() == Some(&Scheme::HTTPS);
    let port = uri.port_u16().unwrap_or(if use_tls { 443 } else { 80 });
    let connect_timeout = opts.connect_timeout.unwrap_or(Duration::from_secs(600));
    let first_byte_timeout = opts.first_byte_timeout.unwrap_or(Duration::from_secs(600));
    let between_bytes_timeout = opts
        .between_bytes_timeout
        .unwrap_or(Duration::from_secs(600))
        .max(Duration::from_nanos(1));

    let tcp = connect(&guard, host, port, explicit, connect_timeout).await?;
    let stream: Box<dyn Stream> = if use_tls {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        if let Some(pem) = &guard.hooks.ca_pem {
            use rustls::pki_types::pem::PemObject as _;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem).flatten() {
                let _ = roots.add(cert);
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::InternalError(Some(e.to_string())))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => rustls::pki_types::ServerName::from(ip),
            Err(_) => rustls::pki_types::ServerName::try_from(bare.to_string())
                .map_err(|_| HttpError::HttpRequestUriInvalid)?,
        };
        Box::new(connector.connect(name, tcp).await.map_err(HttpError::Tls)?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;

    // Origin form on the wire.
    *req.uri_mut() = http::Uri::builder()
        .path_and_query(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;

    // Drive the connection in the background while waiting for the answer.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let r = conn.await;
        let _ = done_tx.send(r);
    });
    let res = tokio::time::timeout(first_byte_timeout, sender.send_request(req))
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)?
        .map_err(HttpError::from)?;

    struct Body {
        incoming: hyper::body::Incoming,
        timeout: tokio::time::Interval,
    }
    impl http_body::Body for Body {
        type Data = Bytes;
        type Error = HttpError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
            match Pin::new(&mut self.incoming).poll_frame(cx) {
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                    HttpError::HttpResponseTimeout
                } else {
                    HttpError::from(e)
                }))),
                Poll::Ready(Some(Ok(f))) => {
                    self.timeout.reset();
                    Poll::Ready(Some(Ok(f)))
                }
                Poll::Pending => {
                    ready!(self.timeout.poll_tick(cx));
                    Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
                }
            }
        }
        fn is_end_stream(&self) -> bool {
            self.incoming.is_end_stream()
        }
        fn size_hint(&self) -> http_body::SizeHint {
            self.incoming.size_hint()
        }
    }
    let mut timeout = tokio::time::interval(between_bytes_timeout);
    timeout.reset();
    let res = res.map(|incoming| Body { incoming, timeout }.boxed_unsync());
    let io = async move {
        match done_rx.await {
            Ok(Err(e)) if e.is_timeout() => Err(HttpError::HttpResponseTimeout),
            Ok(Err(e)) => Err(HttpError::from(e)),
            _ => Ok(()),
        }
    };
    Ok((res, Box::new(io)))
}
