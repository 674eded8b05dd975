//! `tfa-mailer`: the component that sends the service's e-mail.
//!
//! The API component (`spin-app`) never opens a socket and carries no TLS
//! stack: for each e-mail core asks for, it sends `POST /send` with a
//! [`RelayRequest`] to `http://tfa-mailer.spin.internal` (Spin's local
//! service chaining; `tfa-host` routes it the same way). This component,
//! on a private route of the same Spin application, runs the SMTP session
//! (`smtp.rs`: `wasi:sockets` TCP, rustls with the RustCrypto provider and
//! Mozilla's roots, the sans-I/O client of `tfa-smtp`) and answers whether
//! the server accepted the message.
//!
//! Why a component of its own: the TLS stack is half of the service's
//! code and is used once per e-mail, so the API component that runs on
//! every request is about 40 % smaller without it; and only this
//! component may open TCP connections (its `allowed_outbound_hosts` names
//! the SMTP server, the API's names no TCP destination at all), so the
//! component that holds the signing secrets and the store cannot.
//!
//! # What it does
//! 1. Accepts exactly `POST /send` (anything else: 404, or 405 with
//!    `Allow: POST`), reads at most
//!    [`tfa_smtp::relay::MAX_REQUEST_BYTES`] of body and parses the
//!    [`RelayRequest`] (400 with the reason when it is not one).
//! 2. Sends the message: connects to the request's `address`, or resolves
//!    the message's host; bounded by `smtp.rs`'s step and session
//!    timeouts (10 s, 30 s).
//! 3. Answers 200 `{"sent":true}` once the server accepted the message,
//!    else 502 `{"sent":false,"error":"SMTP …: why"}`.
//!
//! # What it does not do
//! No settings, no store, no queue, no retries: the API component decides
//! what to send and to whom, and reports a failure to its client as core
//! says. It keeps nothing between requests. Whether it is reachable only
//! from the API is the platform's decision: under Spin its route is
//! private (`spin.toml`); `tfa-host` never routes a client's request to it.
//!
//! The Spin glue is compiled for `wasm32` only; [`respond`] is
//! target-independent so that it is unit-tested natively.

use tfa_smtp::relay::{answer_failed, answer_sent, RelayRequest, RELAY_PATH};

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod smtp;

/// An answer of the mailer: status, extra headers, JSON body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Headers besides `content-type` and `content-length`.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Steps 1 and 3 around `send` (step 2): the answer to one request.
/// `send` is called only for a well-formed `POST /send`.
pub fn respond(
    method: &str,
    path: &str,
    body: &[u8],
    send: impl FnOnce(&RelayRequest) -> Result<(), String>,
) -> Answer {
    let answer = |status, body| Answer {
        status,
        headers: Vec::new(),
        body,
    };
    let path = path.split('?').next().unwrap_or(path);
    if path != RELAY_PATH {
        return answer(
            404,
            answer_failed("no such route: the mailer serves POST /send"),
        );
    }
    if !method.eq_ignore_ascii_case("POST") {
        let mut a = answer(405, answer_failed("method not allowed: use POST"));
        a.headers.push(("allow", "POST"));
        return a;
    }
    let request = match RelayRequest::from_json(body) {
        Ok(r) => r,
        Err(why) => return answer(400, answer_failed(&why)),
    };
    match send(&request) {
        Ok(()) => answer(200, answer_sent()),
        Err(why) => answer(502, answer_failed(&why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfa_smtp::relay::read_answer;
    use tfa_smtp::{EmailMessage, SmtpTls};

    fn request() -> RelayRequest {
        RelayRequest {
            message: EmailMessage {
                host: "127.0.0.1".into(),
                port: 2525,
                tls: SmtpTls::StartTlsIfOffered,
                auth: None,
                from: "2fa@example.com".into(),
                to: "alice@example.org".into(),
                subject: "Your code".into(),
                text: "123456".into(),
                html: "<p>123456</p>".into(),
            },
            extra_ca_pem: None,
            address: None,
        }
    }

    #[test]
    fn a_relay_request_is_sent_and_answered() {
        let mut seen = None;
        let a = respond("POST", "/send", &request().to_json(), |r| {
            seen = Some(r.clone());
            Ok(())
        });
        assert_eq!(a.status, 200);
        assert_eq!(read_answer(a.status, &a.body), Ok(()));
        assert_eq!(seen, Some(request()));
    }

    #[test]
    fn a_failed_delivery_is_a_502_with_the_reason() {
        let a = respond("post", "/send?x=1", &request().to_json(), |_| {
            Err("SMTP 127.0.0.1:2525: connect: connection-refused".into())
        });
        assert_eq!(a.status, 502);
        assert_eq!(
            read_answer(a.status, &a.body),
            Err("SMTP 127.0.0.1:2525: connect: connection-refused".into())
        );
    }

    #[test]
    fn nothing_but_a_well_formed_post_send_reaches_smtp() {
        let never = |_: &RelayRequest| -> Result<(), String> { panic!("sent") };
        let a = respond("POST", "/", &request().to_json(), never);
        assert_eq!(a.status, 404);
        let a = respond("GET", "/send", b"", never);
        assert_eq!(
            (a.status, a.headers.clone()),
            (405, vec![("allow", "POST")])
        );
        for body in [&b""[..], b"{}", b"not json", b"{\"message\":1}"] {
            let a = respond("POST", "/send", body, never);
            assert_eq!(a.status, 400);
            assert!(read_answer(a.status, &a.body)
                .unwrap_err()
                .starts_with("not a relay request"));
        }
    }
}
