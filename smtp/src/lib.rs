//! `tfa-smtp`: a sans-I/O SMTP client, the conversation that sends one
//! [`EmailMessage`], as a state machine the host feeds with bytes (in the
//! manner of `quinn-proto`: no sockets, no TLS, no clock, no randomness
//! here). It knows nothing of two-factor authentication: `tfa-core` builds
//! the message, the API component hands it to the mailer component as a
//! `relay::RelayRequest` (feature `relay`), and the mailer's transport
//! (`mailer/src/smtp.rs`) drives this client over a `wasi:sockets`
//! connection and rustls.
//!
//! # What it does
//! - Formats the message (RFC 5322 / MIME): `Date` (from a Unix time the
//!   host passes in), `From`, `To`, `Subject` (an RFC 2047 `=?UTF-8?B?…?=`
//!   encoded word when it is not short printable ASCII), `Message-ID` and the
//!   `multipart/alternative` boundary (both from random bytes the host passes
//!   in), `MIME-Version`, then a `text/plain; charset=utf-8` and a
//!   `text/html; charset=utf-8` part, each quoted-printable. Everything that
//!   goes on the wire is 7-bit ASCII, so no `8BITMIME` or `SMTPUTF8` is
//!   needed.
//! - Refuses before any byte is sent: CR, LF or other control characters in
//!   a header value (no header injection), addresses that are not a plain
//!   ASCII `local@domain` (dot-atom local part, host-name domain), an EHLO
//!   name that is not a host name or address literal.
//! - Speaks the client side of RFC 5321 one command at a time (no
//!   pipelining): greeting, `EHLO` (falling back to `HELO` when `EHLO` is
//!   not recognised), `STARTTLS` when the server offers it and the mode is
//!   [`SmtpTls::StartTlsIfOffered`] (then `EHLO` again over TLS, RFC 3207),
//!   `AUTH PLAIN` (or `AUTH LOGIN` when only that is offered, RFC 4954) when
//!   credentials are given, `MAIL FROM`, `RCPT TO`, `DATA` with CRLF
//!   normalisation and dot-stuffing, `QUIT`.
//! - Parses replies strictly: multi-line replies (`250-…` then `250 …`),
//!   the same code on every line, lines of at most [`MAX_LINE`] bytes, at
//!   most [`MAX_REPLY_LINES`] lines per reply and [`MAX_REPLIES`] replies
//!   per session. A server that speaks before it is asked (for example bytes
//!   queued behind the `220` answer to `STARTTLS`, the classic command
//!   injection) ends the session with an error. No server input can make it
//!   panic or grow without bound.
//!
//! # Credentials over plain text
//! Credentials are only sent over TLS (implicit, or after `STARTTLS`). The
//! one exception is a server on the loopback interface (`EmailMessage::host`
//! is `localhost`, `127.0.0.1` or `::1`), which never leaves the machine and
//! is what tests and local relays use. Against any other server that offers
//! no `STARTTLS`, the session ends with an [`SmtpError`] at [`Stage::Auth`]
//! and the password is never written.
//!
//! # What it does not do
//! No sockets, no TLS, no clock, no randomness, no timeouts: the host owns
//! the connection, the TLS library, and the deadline. It sends to one
//! recipient, does not pipeline, does not retry, and does not do
//! `SMTPUTF8` (non-ASCII addresses are refused; non-ASCII names, subjects
//! and bodies are fine). It trusts whatever TLS the host reports: verifying
//! the server certificate is the host's job.
//!
//! # How a host drives it
//! 1. Build the client with [`SmtpClient::new`], passing a [`Stamp`] (the
//!    current Unix time and 32 random bytes) and [`ClientOptions`]. An error
//!    here means the message itself is unusable; nothing was sent.
//! 2. Connect to `host:port`. For [`SmtpTls::Implicit`] complete the TLS
//!    handshake now (server name = `host`); everything below then goes
//!    through TLS.
//! 3. Loop:
//!    1. Write every buffer [`SmtpClient::poll_output`] returns, in order.
//!    2. Match [`SmtpClient::status`]:
//!       - [`Status::Done`]: stop and close the connection. The result is
//!         `Ok(())` once the server has accepted the message (the `QUIT`
//!         that follows was the last output; its answer is not awaited), or
//!         the [`SmtpError`] with the stage, the server's code and its line.
//!       - [`Status::StartTls`]: run the TLS handshake on the connection,
//!         then call [`SmtpClient::tls_established`] and go on with the loop
//!         over TLS.
//!       - [`Status::Running`]: read from the connection with a deadline:
//!         pass the bytes read to [`SmtpClient::handle_input`]; on end of
//!         stream call [`SmtpClient::handle_eof`]; on a timeout or I/O
//!         error stop with the host's own error.

#![forbid(unsafe_code)]
#![deny(
    missing_docs,
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]

use std::fmt;

/// How to reach the SMTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "relay", derive(serde::Serialize, serde::Deserialize))]
pub enum SmtpTls {
    /// Plain connection, upgraded with STARTTLS when the server offers it.
    StartTlsIfOffered,
    /// TLS from the first byte (port 465).
    Implicit,
}

/// An e-mail to send, with the SMTP server to send it through.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "relay", derive(serde::Serialize, serde::Deserialize))]
pub struct EmailMessage {
    /// SMTP host name.
    pub host: String,
    /// SMTP port.
    pub port: u16,
    /// TLS mode.
    pub tls: SmtpTls,
    /// `AUTH` user name and password, when configured.
    pub auth: Option<(String, String)>,
    /// Envelope and header sender.
    pub from: String,
    /// Recipient address.
    pub to: String,
    /// Subject line (never contains CR or LF).
    pub subject: String,
    /// Plain-text part.
    pub text: String,
    /// HTML part.
    pub html: String,
}

/// The longest reply line accepted, in bytes (RFC 5321 asks for 512; some
/// servers send long capability lines).
pub const MAX_LINE: usize = 64 * 1024;

/// The most lines accepted in one (multi-line) reply.
pub const MAX_REPLY_LINES: usize = 256;

/// The most replies accepted in one session (a complete one takes about 12).
pub const MAX_REPLIES: usize = 64;

/// The most characters of server text kept in an [`SmtpError`].
const MAX_ERROR_TEXT: usize = 512;

/// Where in the session something went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Formatting the message, before anything was sent.
    Message,
    /// Waiting for the server's `220` greeting.
    Greeting,
    /// `EHLO` / `HELO`.
    Hello,
    /// `STARTTLS`.
    StartTls,
    /// `AUTH`.
    Auth,
    /// `MAIL FROM`.
    MailFrom,
    /// `RCPT TO`.
    RcptTo,
    /// `DATA` (before the content).
    Data,
    /// After the content was sent, waiting for the server to accept it.
    Content,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Message => "message",
            Stage::Greeting => "greeting",
            Stage::Hello => "EHLO",
            Stage::StartTls => "STARTTLS",
            Stage::Auth => "AUTH",
            Stage::MailFrom => "MAIL FROM",
            Stage::RcptTo => "RCPT TO",
            Stage::Data => "DATA",
            Stage::Content => "message content",
        })
    }
}

/// Why a session failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpError {
    /// Where.
    pub stage: Stage,
    /// The server's reply code, when the server refused something.
    pub code: Option<u16>,
    /// The server's reply text (lines joined with ` / `, control characters
    /// replaced, at most 512 characters), or what this client refused and
    /// why. Never contains a password.
    pub line: String,
}

impl SmtpError {
    fn ours(stage: Stage, line: impl Into<String>) -> SmtpError {
        SmtpError {
            stage,
            code: None,
            line: line.into(),
        }
    }
}

impl fmt::Display for SmtpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(
                f,
                "SMTP {}: server answered {code} {}",
                self.stage, self.line
            ),
            None => write!(f, "SMTP {}: {}", self.stage, self.line),
        }
    }
}

impl std::error::Error for SmtpError {}

/// The time and randomness a message needs (this crate reads no clock and no
/// random source).
#[derive(Debug, Clone)]
pub struct Stamp {
    /// Seconds since the Unix epoch, for the `Date` header (UTC).
    pub unix_secs: u64,
    /// Random bytes: the first 16 make the `Message-ID`, the last 16 the
    /// MIME boundary.
    pub random: [u8; 32],
}

/// Connection-level choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// The name sent with `EHLO`: a host name or an address literal such as
    /// `[127.0.0.1]`. Default `localhost`.
    pub client_name: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "localhost".to_string(),
        }
    }
}

/// Where the session is, as one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Write output, then read.
    Running,
    /// Write output, then run the TLS handshake and call
    /// [`SmtpClient::tls_established`].
    StartTls,
    /// Finished: write any remaining output, then close.
    Done(Result<(), SmtpError>),
}

mod client;
mod message;
#[cfg(feature = "relay")]
pub mod relay;

pub use client::SmtpClient;
pub use message::{dot_stuff, format_message, quoted_printable, rfc5322_date};

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests;
