//! The relay request: how the API component has the mailer component send
//! one e-mail (feature `relay`).
//!
//! The API component carries no TLS stack and opens no TCP connection: for
//! a [`crate::EmailMessage`] core built, it sends `POST` [`MAILER_URL`]
//! with a [`RelayRequest`] as JSON over outbound HTTP. Under Spin that is
//! local service chaining (the mailer is the component `tfa-mailer` of the
//! same application, on a private route); `tfa-host` routes it the same
//! way. The mailer runs the SMTP session and answers with
//! [`answer_sent`] (200) or [`answer_failed`] (502, the reason for the
//! API's log); [`read_answer`] turns either back into a result.
//!
//! Both sides use these functions, so the wire format has one definition.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::EmailMessage;

/// The mailer component's id in `spin.toml`, and so its host name for
/// Spin's local service chaining.
pub const MAILER_HOST: &str = "tfa-mailer.spin.internal";

/// The mailer's origin: the entry the API component's
/// `allowed_outbound_hosts` must hold (Spin's rule for chaining).
pub const MAILER_ORIGIN: &str = "http://tfa-mailer.spin.internal";

/// Where the API component sends a [`RelayRequest`]: [`MAILER_ORIGIN`] and
/// [`RELAY_PATH`].
pub const MAILER_URL: &str = "http://tfa-mailer.spin.internal/send";

/// The path of [`MAILER_URL`]: the only route the mailer serves.
pub const RELAY_PATH: &str = "/send";

/// The largest request body the mailer reads (a message's parts are short;
/// this bounds what a malformed caller can make it hold).
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// One e-mail for the mailer to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelayRequest {
    /// The message and the SMTP server to send it through.
    pub message: EmailMessage,
    /// PEM certificates trusted for the server's TLS besides the public
    /// roots (`EMAIL_TLS_CA_PEM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_ca_pem: Option<String>,
    /// Connect to this address instead of resolving `message.host` (under
    /// Spin: the IP of the `email_outbound_host` variable); `message.host`
    /// stays the TLS server name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
}

impl RelayRequest {
    /// The request body.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings, numbers and options always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a request body; the reason when it is not a relay request.
    pub fn from_json(body: &[u8]) -> Result<RelayRequest, String> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(format!("request body over {MAX_REQUEST_BYTES} bytes"));
        }
        serde_json::from_slice(body).map_err(|e| format!("not a relay request: {e}"))
    }
}

#[derive(Serialize, Deserialize)]
struct Answer {
    sent: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The mailer's answer (status 200) once the server accepted the message.
pub fn answer_sent() -> Vec<u8> {
    serde_json::to_vec(&Answer {
        sent: true,
        error: None,
    })
    .unwrap_or_default()
}

/// The mailer's answer (status 502, or 400 for a request it cannot read)
/// when the message was not sent: `why` goes to the API's log.
pub fn answer_failed(why: &str) -> Vec<u8> {
    serde_json::to_vec(&Answer {
        sent: false,
        error: Some(why.to_string()),
    })
    .unwrap_or_default()
}

/// The result of a relay call from the mailer's answer: `Ok(())` only for
/// status 200 with `{"sent":true}`; otherwise the mailer's reason, or a
/// description of the unexpected answer.
pub fn read_answer(status: u16, body: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer { sent: true, .. }) if status == 200 => Ok(()),
        Ok(Answer {
            error: Some(why), ..
        }) => Err(why),
        _ => {
            let shown: String = String::from_utf8_lossy(body).chars().take(200).collect();
            Err(format!("the mailer answered {status}: {shown}"))
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod tests {
    use super::*;
    use crate::SmtpTls;

    fn message() -> EmailMessage {
        EmailMessage {
            host: "smtp.example.com".into(),
            port: 587,
            tls: SmtpTls::StartTlsIfOffered,
            auth: Some(("user".into(), "pass word".into())),
            from: "2fa@example.com".into(),
            to: "alice@example.org".into(),
            subject: "Your code: 123456".into(),
            text: "Code 123456\n".into(),
            html: "<p>Code <b>123456</b></p>".into(),
        }
    }

    #[test]
    fn request_round_trips_with_and_without_options() {
        let full = RelayRequest {
            message: message(),
            extra_ca_pem: Some("-----BEGIN CERTIFICATE-----\n...".into()),
            address: Some("203.0.113.7:587".parse().unwrap()),
        };
        assert_eq!(RelayRequest::from_json(&full.to_json()).unwrap(), full);
        let bare = RelayRequest {
            message: EmailMessage {
                tls: SmtpTls::Implicit,
                auth: None,
                ..message()
            },
            extra_ca_pem: None,
            address: None,
        };
        let json = bare.to_json();
        assert!(!String::from_utf8_lossy(&json).contains("address"));
        assert_eq!(RelayRequest::from_json(&json).unwrap(), bare);
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        for body in [
            &b""[..],
            b"[]",
            b"{\"message\":{}}",
            b"{\"message\":null,\"extra\":1}",
        ] {
            let why = RelayRequest::from_json(body).unwrap_err();
            assert!(why.starts_with("not a relay request"), "{why}");
        }
        let mut unknown = serde_json::to_value(RelayRequest {
            message: message(),
            extra_ca_pem: None,
            address: None,
        })
        .unwrap();
        unknown["bcc"] = "eve@example.net".into();
        let why = RelayRequest::from_json(unknown.to_string().as_bytes()).unwrap_err();
        assert!(why.contains("unknown field"), "{why}");
        let huge = vec![b' '; MAX_REQUEST_BYTES + 1];
        assert!(RelayRequest::from_json(&huge).unwrap_err().contains("over"));
    }

    #[test]
    fn the_url_is_the_origin_and_the_path() {
        assert_eq!(MAILER_URL, format!("{MAILER_ORIGIN}{RELAY_PATH}"));
        assert_eq!(MAILER_ORIGIN, format!("http://{MAILER_HOST}"));
    }

    #[test]
    fn answers_read_back() {
        assert_eq!(read_answer(200, &answer_sent()), Ok(()));
        assert_eq!(
            read_answer(502, &answer_failed("SMTP x:25: connect: refused")),
            Err("SMTP x:25: connect: refused".into())
        );
        // `sent` under another status, or an answer from something else,
        // is not a delivery.
        assert!(read_answer(500, &answer_sent()).is_err());
        let other = read_answer(404, b"{\"success\":false,\"error\":\"Resource not found\"}");
        assert_eq!(
            other,
            Err(
                "the mailer answered 404: {\"success\":false,\"error\":\"Resource not found\"}"
                    .into()
            )
        );
    }
}
