//! Outbound HTTP from inside the component: core's [`HttpCall`]s (Twilio
//! messages, webhook deliveries) sent exactly as built, with time limits;
//! and the relay requests that hand e-mail to the mailer component.
//!
//! # What it does
//! - Sends the request over `wasi:http/outgoing-handler` with the headers in
//!   core's order (its explicit `Content-Length` kept, so the body is never
//!   chunked) and [`RequestOptions`] that bound the wait: connect
//!   [`CONNECT_TIMEOUT_NS`] (5 s), first byte and between bytes
//!   [`BYTE_TIMEOUT_NS`] (10 s; the first byte of the mailer's answer
//!   [`RELAY_TIMEOUT_NS`], 45 s, since it answers after the SMTP session). Spin and the local host both honour these, so
//!   an unresponsive gateway costs the same on either.
//! - Reads at most [`MAX_RESPONSE`] bytes of the answer (for the log).
//!
//! # What it does not do
//! No redirects, no retries (webhook retries are core's), no connection
//! reuse. Whether the component may call a host at all is the host's
//! decision (`allowed_outbound_hosts` in `spin.toml`).
//!
//! The wait is a blocking `wasi:io/poll` on the response: the component
//! serves one request and has nothing else to do meanwhile.

use tfa_core::contract::outbox::HttpCall;
use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, RequestOptions,
    Scheme,
};
use wasi::io::streams::StreamError;

use crate::util;

/// Longest wait for the connection: 5 s, in nanoseconds.
pub const CONNECT_TIMEOUT_NS: u64 = 5_000_000_000;
/// Longest wait for the first byte of the answer, and between its bytes:
/// 10 s, in nanoseconds.
pub const BYTE_TIMEOUT_NS: u64 = 10_000_000_000;
/// At most this much of a response body is read.
pub const MAX_RESPONSE: usize = 16 * 1024;

/// An answer: status and (the start of) the body.
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// At most [`MAX_RESPONSE`] bytes of the body.
    pub body: Vec<u8>,
}

/// Longest wait for the mailer's answer (first byte): its whole SMTP
/// session is bounded at 30 s, so 45 s, in nanoseconds.
pub const RELAY_TIMEOUT_NS: u64 = 45_000_000_000;

/// Sends `call`; the answer, or why there is none (for the log).
pub fn send(call: &HttpCall) -> Result<Answer, String> {
    send_with(call, BYTE_TIMEOUT_NS)
}

/// As [`send`], waiting at most `first_byte_ns` for the answer to start.
pub fn send_with(call: &HttpCall, first_byte_ns: u64) -> Result<Answer, String> {
    let target = call.url.split('?').next().unwrap_or("").to_string();
    send_inner(call, first_byte_ns).map_err(|e| format!("request to {target} failed: {e}"))
}

fn send_inner(call: &HttpCall, first_byte_ns: u64) -> Result<Answer, String> {
    let request = build(call)?;
    let body = request
        .body()
        .map_err(|()| "request body already taken".to_string())?;
    let future =
        outgoing_handler::handle(request, Some(options(first_byte_ns)?)).map_err(describe)?;
    let written = (|| {
        let stream = body
            .write()
            .map_err(|()| "request body stream already taken".to_string())?;
        util::write_chunked(&call.body, |chunk| stream.blocking_write_and_flush(chunk))
            .map_err(|e| stream_error("writing the request body", e))
    })();
    if let Err(write_error) = written {
        future.subscribe().block();
        // A host that refuses the call (allow-list, blocked network) closes
        // the body stream; its answer says why, so it wins.
        return Err(match future.get() {
            Some(Ok(Err(e))) => describe(e),
            _ => write_error,
        });
    }
    OutgoingBody::finish(body, None).map_err(describe)?;
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(describe(e)),
        Some(Err(())) => return Err("response already taken".into()),
        None => return Err("no response after the wait".into()),
    };
    read(response)
}

fn options(first_byte_ns: u64) -> Result<RequestOptions, String> {
    let options = RequestOptions::new();
    let set = |r: Result<(), ()>, what: &str| r.map_err(|()| format!("host refused the {what}"));
    set(
        options.set_connect_timeout(Some(CONNECT_TIMEOUT_NS)),
        "connect timeout",
    )?;
    set(
        options.set_first_byte_timeout(Some(first_byte_ns)),
        "first-byte timeout",
    )?;
    set(
        options.set_between_bytes_timeout(Some(BYTE_TIMEOUT_NS)),
        "between-bytes timeout",
    )?;
    Ok(options)
}

fn build(call: &HttpCall) -> Result<OutgoingRequest, String> {
    let url = util::split_url(&call.url)?;
    let fields: Vec<(String, Vec<u8>)> = call
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
        .collect();
    let headers =
        Fields::from_list(&fields).map_err(|e| format!("invalid request headers: {e:?}"))?;
    let request = OutgoingRequest::new(headers);
    request
        .set_method(&method_of(&call.method))
        .map_err(|()| format!("invalid method {:?}", call.method))?;
    let scheme = if url.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| "invalid scheme".to_string())?;
    request
        .set_authority(Some(&url.authority))
        .map_err(|()| format!("invalid authority {:?}", url.authority))?;
    request
        .set_path_with_query(Some(&url.path_with_query))
        .map_err(|()| format!("invalid path {:?}", url.path_with_query))?;
    Ok(request)
}

fn method_of(m: &str) -> Method {
    match m.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "HEAD" => Method::Head,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_string()),
    }
}

fn read(response: IncomingResponse) -> Result<Answer, String> {
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|()| "response body already taken".to_string())?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| "response body stream already taken".to_string())?;
        while body.len() < MAX_RESPONSE {
            match stream.blocking_read((MAX_RESPONSE - body.len()) as u64) {
                Ok(bytes) => body.extend_from_slice(&bytes),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_error("reading the response body", e)),
            }
        }
    }
    Ok(Answer { status, body })
}

fn stream_error(what: &str, e: StreamError) -> String {
    match e {
        StreamError::Closed => format!("{what}: stream closed"),
        StreamError::LastOperationFailed(err) => format!("{what}: {}", err.to_debug_string()),
    }
}

/// `wasi:http`'s error codes in words (timeouts and refusals are the ones
/// operators meet).
fn describe(e: ErrorCode) -> String {
    match e {
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTimeout => "connection timed out".into(),
        ErrorCode::ConnectionReadTimeout => "timed out waiting for the answer".into(),
        ErrorCode::ConnectionWriteTimeout => "timed out sending the request".into(),
        ErrorCode::DnsTimeout => "DNS lookup timed out".into(),
        ErrorCode::DnsError(_) => "DNS lookup failed".into(),
        ErrorCode::HttpRequestDenied => "denied by allowed_outbound_hosts".into(),
        ErrorCode::TlsCertificateError => "TLS certificate not trusted".into(),
        ErrorCode::DestinationIpProhibited => "destination address blocked by the host".into(),
        // The local host's connect-time check puts its reason here
        // ("blocked network 10.0.0.5 (...)").
        ErrorCode::InternalError(Some(msg)) => msg,
        other => format!("{other:?}"),
    }
}
