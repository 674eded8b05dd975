//! A sans-I/O SMTP client: the conversation that sends one
//! [`EmailMessage`], as a state machine the host feeds with bytes.
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
//!    2. If [`SmtpClient::is_done`]: stop, and close the connection.
//!    3. If [`SmtpClient::wants_tls`]: run the TLS handshake on the
//!       connection, then call [`SmtpClient::tls_established`] and go on
//!       with the loop over TLS.
//!    4. Otherwise read from the connection with a deadline: pass the bytes
//!       read to [`SmtpClient::handle_input`]; on end of stream call
//!       [`SmtpClient::handle_eof`]; on a timeout or I/O error stop with the
//!       host's own error.
//! 4. The result is [`SmtpClient::outcome`]: `Ok(())` once the server has
//!    accepted the message (the `QUIT` that follows is queued as output;
//!    its answer is not awaited), or the [`SmtpError`] with the stage, the
//!    server's code and its line.
//!
//! [`SmtpClient::status`] gives the same information as one value.

#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;
use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use crate::outbox::{EmailMessage, SmtpTls};

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

/// The time and randomness a message needs (core reads no clock and no
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Greeting,
    Ehlo,
    Helo,
    StartTls,
    AwaitTls,
    AuthPlain,
    AuthLoginUser,
    AuthLoginPass,
    AuthLoginDone,
    MailFrom,
    RcptTo,
    Data,
    Content,
    Done,
}

impl State {
    fn stage(self) -> Stage {
        match self {
            State::Greeting => Stage::Greeting,
            State::Ehlo | State::Helo => Stage::Hello,
            State::StartTls | State::AwaitTls => Stage::StartTls,
            State::AuthPlain
            | State::AuthLoginUser
            | State::AuthLoginPass
            | State::AuthLoginDone => Stage::Auth,
            State::MailFrom => Stage::MailFrom,
            State::RcptTo => Stage::RcptTo,
            State::Data => Stage::Data,
            State::Content | State::Done => Stage::Content,
        }
    }
}

/// What the server said it supports in its `EHLO` answer.
#[derive(Debug, Default, Clone)]
struct Capabilities {
    starttls: bool,
    auth_plain: bool,
    auth_login: bool,
}

impl Capabilities {
    fn from_ehlo(lines: &[String]) -> Capabilities {
        let mut caps = Capabilities::default();
        // The first line is the server's name and greeting.
        for line in lines.iter().skip(1) {
            let upper = line.to_ascii_uppercase();
            let mut words = upper.split([' ', '=']);
            match words.next() {
                Some("STARTTLS") => caps.starttls = true,
                Some("AUTH") => {
                    for mech in words {
                        match mech {
                            "PLAIN" => caps.auth_plain = true,
                            "LOGIN" => caps.auth_login = true,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        caps
    }
}

/// A reply being read (possibly over several lines).
#[derive(Debug, Default)]
struct PartialReply {
    code: Option<u16>,
    lines: Vec<String>,
}

/// The client side of one SMTP session (see the module docs for the loop).
#[derive(Debug)]
pub struct SmtpClient {
    state: State,
    implicit_tls: bool,
    try_starttls: bool,
    secure: bool,
    loopback: bool,
    client_name: String,
    auth: Option<(String, String)>,
    from: String,
    to: String,
    data: Vec<u8>,
    input: Vec<u8>,
    reply: PartialReply,
    replies: usize,
    caps: Capabilities,
    output: VecDeque<Vec<u8>>,
    outcome: Option<Result<(), SmtpError>>,
}

impl SmtpClient {
    /// Validates and formats the message; the session starts by waiting for
    /// the server's greeting. With [`SmtpTls::Implicit`] the host must have
    /// completed the TLS handshake before passing the first bytes.
    pub fn new(
        message: &EmailMessage,
        stamp: &Stamp,
        options: &ClientOptions,
    ) -> Result<SmtpClient, SmtpError> {
        check_client_name(&options.client_name)?;
        if let Some((user, pass)) = &message.auth {
            if user.contains('\0') || pass.contains('\0') {
                return Err(SmtpError::ours(
                    Stage::Message,
                    "the SMTP user name and password may not contain NUL",
                ));
            }
        }
        let from = parse_mailbox(&message.from, "sender")?;
        let to = parse_mailbox(&message.to, "recipient")?;
        let content = format_message(message, stamp)?;
        let host = message
            .host
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let loopback =
            host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1" || host == "::1";
        let implicit_tls = message.tls == SmtpTls::Implicit;
        Ok(SmtpClient {
            state: State::Greeting,
            implicit_tls,
            try_starttls: message.tls == SmtpTls::StartTlsIfOffered,
            secure: implicit_tls,
            loopback,
            client_name: options.client_name.clone(),
            auth: message.auth.clone(),
            from: from.addr,
            to: to.addr,
            data: dot_stuff(&content),
            input: Vec::new(),
            reply: PartialReply::default(),
            replies: 0,
            caps: Capabilities::default(),
            output: VecDeque::new(),
            outcome: None,
        })
    }

    /// The next bytes to write to the connection, if any.
    pub fn poll_output(&mut self) -> Option<Vec<u8>> {
        self.output.pop_front()
    }

    /// Whether the host must now run the TLS handshake (after writing any
    /// pending output) and then call [`SmtpClient::tls_established`].
    pub fn wants_tls(&self) -> bool {
        self.state == State::AwaitTls
    }

    /// Whether the session is over (write remaining output, then close).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The result, once the session is over.
    pub fn outcome(&self) -> Option<&Result<(), SmtpError>> {
        self.outcome.as_ref()
    }

    /// Whether the connection is encrypted (implicit TLS, or after
    /// `STARTTLS`).
    pub fn is_secure(&self) -> bool {
        self.secure
    }

    /// Where the session is, as one value.
    pub fn status(&self) -> Status {
        match (&self.outcome, self.state) {
            (Some(result), _) => Status::Done(result.clone()),
            (None, State::AwaitTls) => Status::StartTls,
            (None, _) => Status::Running,
        }
    }

    /// The TLS handshake asked for by [`SmtpClient::wants_tls`] succeeded:
    /// everything from now on goes through TLS, starting with a new `EHLO`.
    /// Does nothing in any other state.
    pub fn tls_established(&mut self) {
        if self.state != State::AwaitTls {
            return;
        }
        self.secure = true;
        self.caps = Capabilities::default();
        self.send_ehlo();
    }

    /// The server closed the connection.
    pub fn handle_eof(&mut self) {
        if self.state == State::Done {
            return;
        }
        let partial = if self.input.is_empty() && self.reply.lines.is_empty() {
            ""
        } else {
            " in the middle of a reply"
        };
        self.fail(
            SmtpError::ours(
                self.state.stage(),
                format!("the server closed the connection{partial}"),
            ),
            false,
        );
    }

    /// Bytes read from the server (any split: partial lines are kept until
    /// their end arrives). Ignored once the session is over.
    pub fn handle_input(&mut self, bytes: &[u8]) {
        if self.state == State::Done {
            return;
        }
        if self.state == State::AwaitTls {
            // Plain-text bytes between the `220` to STARTTLS and the
            // handshake: never trust them (RFC 3207 section 5).
            self.fail(
                SmtpError::ours(
                    Stage::StartTls,
                    "the server sent data before the TLS handshake",
                ),
                false,
            );
            return;
        }
        self.input.extend_from_slice(bytes);
        while self.state != State::Done && self.state != State::AwaitTls {
            let Some(end) = self.input.iter().position(|&b| b == b'\n') else {
                if self.input.len() > MAX_LINE {
                    self.protocol_error("a reply line is too long");
                }
                return;
            };
            // `end` is a valid index, so `end + 1 <= len`.
            let mut line: Vec<u8> = self.input.drain(..=end).collect();
            line.pop(); // '\n'
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > MAX_LINE {
                self.protocol_error("a reply line is too long");
                return;
            }
            self.handle_line(&line);
        }
        if self.state == State::AwaitTls && !self.input.is_empty() {
            self.fail(
                SmtpError::ours(
                    Stage::StartTls,
                    "the server sent data before the TLS handshake",
                ),
                false,
            );
        }
    }

    fn handle_line(&mut self, line: &[u8]) {
        let (code, last, text) = match parse_reply_line(line) {
            Some(parsed) => parsed,
            None => {
                let shown = clean_text(&String::from_utf8_lossy(line));
                self.protocol_error(&format!("malformed reply line {shown:?}"));
                return;
            }
        };
        if self.reply.code.is_some_and(|c| c != code) {
            self.protocol_error("a multi-line reply changed its code");
            return;
        }
        if self.reply.lines.len() >= MAX_REPLY_LINES {
            self.protocol_error("a reply has too many lines");
            return;
        }
        self.reply.code = Some(code);
        self.reply.lines.push(text);
        if !last {
            return;
        }
        let reply = std::mem::take(&mut self.reply);
        self.replies = self.replies.saturating_add(1);
        if self.replies > MAX_REPLIES {
            self.protocol_error("too many replies");
            return;
        }
        // One command at a time: a complete reply must be the last thing the
        // server sent, since nothing else has been asked yet.
        if !self.input.is_empty() {
            self.protocol_error("the server sent data before it was asked");
            return;
        }
        self.handle_reply(code, &reply.lines);
    }

    fn handle_reply(&mut self, code: u16, lines: &[String]) {
        match (self.state, code) {
            (State::Greeting, 220) => self.send_ehlo(),
            (State::Ehlo, 250) => {
                self.caps = Capabilities::from_ehlo(lines);
                self.after_hello();
            }
            // EHLO not recognised: an old server; say HELO instead.
            (State::Ehlo, 500 | 502 | 504 | 550) => {
                let name = self.client_name.clone();
                self.send(State::Helo, format!("HELO {name}\r\n").into_bytes());
            }
            (State::Helo, 250) => {
                self.caps = Capabilities::default();
                self.after_hello();
            }
            (State::StartTls, 220) => self.state = State::AwaitTls,
            (State::AuthPlain | State::AuthLoginDone, 235) => self.send_mail_from(),
            (State::AuthLoginUser, 334) => {
                let user = self.auth.as_ref().map(|a| a.0.clone()).unwrap_or_default();
                let line = format!("{}\r\n", B64.encode(user));
                self.send(State::AuthLoginPass, line.into_bytes());
            }
            (State::AuthLoginPass, 334) => {
                let pass = self.auth.as_ref().map(|a| a.1.clone()).unwrap_or_default();
                let line = format!("{}\r\n", B64.encode(pass));
                self.send(State::AuthLoginDone, line.into_bytes());
            }
            (State::MailFrom, 250) => {
                let to = self.to.clone();
                self.send(State::RcptTo, format!("RCPT TO:<{to}>\r\n").into_bytes());
            }
            (State::RcptTo, 250 | 251) => self.send(State::Data, b"DATA\r\n".to_vec()),
            (State::Data, 354) => {
                let data = std::mem::take(&mut self.data);
                self.send(State::Content, data);
            }
            (State::Content, 250) => {
                self.outcome = Some(Ok(()));
                self.send(State::Done, b"QUIT\r\n".to_vec());
            }
            (state, code) => {
                let error = SmtpError {
                    stage: state.stage(),
                    code: Some(code),
                    line: join_reply(lines),
                };
                // The conversation is still in step: say goodbye politely
                // (except in the middle of AUTH LOGIN, where a line would be
                // taken as a credential, and before the greeting).
                let polite = !matches!(
                    state,
                    State::Greeting | State::AuthLoginUser | State::AuthLoginPass
                );
                self.fail(error, polite);
            }
        }
    }

    fn after_hello(&mut self) {
        if !self.secure && self.try_starttls && self.caps.starttls {
            self.send(State::StartTls, b"STARTTLS\r\n".to_vec());
            return;
        }
        let Some((user, pass)) = self.auth.clone() else {
            self.send_mail_from();
            return;
        };
        if !self.secure && !self.loopback {
            self.fail(
                SmtpError::ours(
                    Stage::Auth,
                    "refusing to send credentials over an unencrypted connection \
                     (the server offered no STARTTLS)",
                ),
                true,
            );
            return;
        }
        if self.caps.auth_plain {
            let mut token =
                Vec::with_capacity(user.len().saturating_add(pass.len()).saturating_add(2));
            token.push(0);
            token.extend_from_slice(user.as_bytes());
            token.push(0);
            token.extend_from_slice(pass.as_bytes());
            let line = format!("AUTH PLAIN {}\r\n", B64.encode(token));
            self.send(State::AuthPlain, line.into_bytes());
        } else if self.caps.auth_login {
            self.send(State::AuthLoginUser, b"AUTH LOGIN\r\n".to_vec());
        } else {
            self.fail(
                SmtpError::ours(
                    Stage::Auth,
                    "credentials are configured but the server offers neither AUTH PLAIN nor AUTH LOGIN",
                ),
                true,
            );
        }
    }

    fn send_ehlo(&mut self) {
        let name = self.client_name.clone();
        self.send(State::Ehlo, format!("EHLO {name}\r\n").into_bytes());
    }

    fn send_mail_from(&mut self) {
        let from = self.from.clone();
        self.send(
            State::MailFrom,
            format!("MAIL FROM:<{from}>\r\n").into_bytes(),
        );
    }

    fn send(&mut self, next: State, bytes: Vec<u8>) {
        self.output.push_back(bytes);
        self.state = next;
    }

    fn protocol_error(&mut self, what: &str) {
        let stage = self.state.stage();
        self.fail(
            SmtpError::ours(stage, format!("protocol error: {what}")),
            false,
        );
    }

    fn fail(&mut self, error: SmtpError, quit: bool) {
        if quit {
            self.output.push_back(b"QUIT\r\n".to_vec());
        }
        self.outcome = Some(Err(error));
        self.state = State::Done;
        self.input.clear();
        self.reply = PartialReply::default();
    }

    /// Which mechanism `AUTH` will use, once `EHLO` has been answered (for
    /// tests and logs): `"PLAIN"`, `"LOGIN"` or `None`.
    pub fn auth_mechanism(&self) -> Option<&'static str> {
        if self.caps.auth_plain {
            Some("PLAIN")
        } else if self.caps.auth_login {
            Some("LOGIN")
        } else {
            None
        }
    }

    /// Whether the connection started with TLS.
    pub fn implicit_tls(&self) -> bool {
        self.implicit_tls
    }
}

/// `250-text`, `250 text` or `250` → (code, last line?, text).
fn parse_reply_line(line: &[u8]) -> Option<(u16, bool, String)> {
    let digits = line.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code = digits.iter().try_fold(0u16, |acc, d| {
        acc.checked_mul(10)?
            .checked_add(u16::from(d.checked_sub(b'0')?))
    })?;
    if !(200..=599).contains(&code) {
        return None;
    }
    let last = match line.get(3) {
        None | Some(b' ') => true,
        Some(b'-') => false,
        Some(_) => return None,
    };
    let text = line.get(4..).unwrap_or_default();
    Some((code, last, clean_text(&String::from_utf8_lossy(text))))
}

/// Control characters replaced, at most [`MAX_ERROR_TEXT`] characters.
fn clean_text(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_ERROR_TEXT)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(MAX_ERROR_TEXT).is_some() {
        out.push('…');
    }
    out
}

fn join_reply(lines: &[String]) -> String {
    clean_text(&lines.join(" / "))
}

// ------------------------------------------------------------------ message

/// A parsed `Name <addr>` or bare `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mailbox {
    name: Option<String>,
    addr: String,
}

fn parse_mailbox(raw: &str, what: &str) -> Result<Mailbox, SmtpError> {
    let bad = |why: &str| SmtpError::ours(Stage::Message, format!("the {what} address {why}"));
    if raw.chars().any(char::is_control) {
        return Err(bad("contains a control character"));
    }
    let raw = raw.trim();
    let (name, addr) = match (raw.rfind('<'), raw.strip_suffix('>')) {
        (Some(open), Some(without_close)) => {
            let name = without_close.get(..open).unwrap_or_default().trim();
            let addr = without_close
                .get(open.saturating_add(1)..)
                .unwrap_or_default();
            let name = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
                Some(quoted) => unescape_quoted(quoted),
                None => name.to_string(),
            };
            let name = name.trim();
            ((!name.is_empty()).then(|| name.to_string()), addr.trim())
        }
        (None, None) => (None, raw),
        _ => return Err(bad("is not of the form Name <local@domain>")),
    };
    if let Some(name) = &name {
        if name.chars().count() > 200 {
            return Err(bad("has a display name longer than 200 characters"));
        }
    }
    check_address(addr).map_err(bad)?;
    Ok(Mailbox {
        name,
        addr: addr.to_string(),
    })
}

/// The content of a quoted string, a backslash escaping the next character.
fn unescape_quoted(quoted: &str) -> String {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// A plain ASCII `local@domain`: dot-atom local part (RFC 5322 atext), a
/// host-name domain; at most 64 + 255 characters, 254 in all.
fn check_address(addr: &str) -> Result<(), &'static str> {
    if addr.is_empty() {
        return Err("is empty");
    }
    if addr.len() > 254 {
        return Err("is longer than 254 characters");
    }
    let Some((local, domain)) = addr.rsplit_once('@') else {
        return Err("has no @");
    };
    if local.is_empty() || local.len() > 64 {
        return Err("has an empty or too long local part");
    }
    let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c);
    if local
        .split('.')
        .any(|atom| atom.is_empty() || !atom.chars().all(atext))
    {
        return Err("has an unsupported local part (only plain ASCII dot-atoms are accepted)");
    }
    if !is_host_name(domain) {
        return Err("has an invalid domain");
    }
    Ok(())
}

/// Letters, digits and hyphens in dot-separated labels of 1..=63
/// characters, not starting or ending with a hyphen; 255 characters at most.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn check_client_name(name: &str) -> Result<(), SmtpError> {
    let literal = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|inner| {
            let inner = inner.strip_prefix("IPv6:").unwrap_or(inner);
            !inner.is_empty()
                && inner.len() <= 45
                && inner
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':')
        });
    if literal || is_host_name(name) {
        Ok(())
    } else {
        Err(SmtpError::ours(
            Stage::Message,
            "the EHLO client name must be a host name or an address literal",
        ))
    }
}

/// Formats the complete message (headers and MIME body) with CRLF line
/// ends, before dot-stuffing.
pub fn format_message(message: &EmailMessage, stamp: &Stamp) -> Result<Vec<u8>, SmtpError> {
    let from = parse_mailbox(&message.from, "sender")?;
    let to = parse_mailbox(&message.to, "recipient")?;
    if message.subject.contains(['\r', '\n']) {
        return Err(SmtpError::ours(
            Stage::Message,
            "the subject contains a line break",
        ));
    }
    let (id_bytes, boundary_bytes) = stamp.random.split_at(16);
    let domain = from
        .addr
        .rsplit_once('@')
        .map(|(_, d)| d)
        .unwrap_or("localhost");
    let boundary = format!("=_tfa_{}", hex(boundary_bytes));

    let mut out = String::new();
    let mut header = |name: &str, value: &str| {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    };
    header("Date", &rfc5322_date(stamp.unix_secs));
    header("From", &format_mailbox(&from));
    header("To", &format_mailbox(&to));
    header("Subject", &encode_unstructured(&message.subject, "Subject"));
    header("Message-ID", &format!("<{}@{domain}>", hex(id_bytes)));
    header("MIME-Version", "1.0");
    header(
        "Content-Type",
        &format!("multipart/alternative;\r\n boundary=\"{boundary}\""),
    );
    out.push_str("\r\n");
    for (subtype, body) in [("plain", &message.text), ("html", &message.html)] {
        out.push_str("--");
        out.push_str(&boundary);
        out.push_str("\r\n");
        out.push_str("Content-Type: text/");
        out.push_str(subtype);
        out.push_str("; charset=utf-8\r\n");
        out.push_str("Content-Transfer-Encoding: quoted-printable\r\n\r\n");
        out.push_str(&quoted_printable(body));
        out.push_str("\r\n");
    }
    out.push_str("--");
    out.push_str(&boundary);
    out.push_str("--\r\n");
    Ok(out.into_bytes())
}

fn format_mailbox(mailbox: &Mailbox) -> String {
    match &mailbox.name {
        None => mailbox.addr.clone(),
        Some(name) => {
            let plain = name.chars().all(|c| (' '..='~').contains(&c)) && name.len() <= 60;
            let shown = if plain {
                let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
                format!("\"{escaped}\"")
            } else {
                // Folded encoded words, continuing on the address line.
                encode_words(name)
            };
            format!("{shown} <{}>", mailbox.addr)
        }
    }
}

/// A header value as is when it is short printable ASCII that cannot be
/// mistaken for an encoded word; otherwise RFC 2047 encoded words.
fn encode_unstructured(value: &str, header: &str) -> String {
    let start = header.len().saturating_add(2);
    let plain = value.chars().all(|c| (' '..='~').contains(&c))
        && !value.contains("=?")
        && value.len().saturating_add(start) <= 78;
    if plain {
        value.to_string()
    } else {
        encode_words(value)
    }
}

/// `=?UTF-8?B?…?=` words of at most 64 characters (39 bytes of text each,
/// never splitting a character), folded with CRLF + space.
fn encode_words(value: &str) -> String {
    let mut words = Vec::new();
    let mut chunk = String::new();
    for c in value.chars() {
        if chunk.len().saturating_add(c.len_utf8()) > 39 {
            words.push(format!("=?UTF-8?B?{}?=", B64.encode(&chunk)));
            chunk.clear();
        }
        chunk.push(c);
    }
    if !chunk.is_empty() || words.is_empty() {
        words.push(format!("=?UTF-8?B?{}?=", B64.encode(&chunk)));
    }
    words.join("\r\n ")
}

/// Quoted-printable (RFC 2045 section 6.7) of UTF-8 text: any line break
/// (CRLF, LF or CR) becomes a hard CRLF, lines are at most 76 characters
/// with soft breaks, trailing white space and `=` are encoded.
pub fn quoted_printable(text: &str) -> String {
    let normalised = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(normalised.len().saturating_add(normalised.len() / 8));
    for (i, line) in normalised.split('\n').enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        let bytes = line.as_bytes();
        let mut width = 0usize;
        for (j, &b) in bytes.iter().enumerate() {
            let is_last = j.saturating_add(1) == bytes.len();
            let literal =
                matches!(b, b'!'..=b'<' | b'>'..=b'~') || (matches!(b, b' ' | b'\t') && !is_last);
            let token = if literal {
                char::from(b).to_string()
            } else {
                format!("={b:02X}")
            };
            if width.saturating_add(token.len()) > 75 {
                out.push_str("=\r\n");
                width = 0;
            }
            width = width.saturating_add(token.len());
            out.push_str(&token);
        }
    }
    out
}

/// CRLF line ends everywhere (a lone CR or LF becomes CRLF), a `.` doubled
/// at the start of every line, and the `CRLF . CRLF` terminator.
pub fn dot_stuff(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        content
            .len()
            .saturating_add(content.len() / 32)
            .saturating_add(5),
    );
    let mut at_line_start = true;
    let mut iter = content.iter().peekable();
    while let Some(&b) = iter.next() {
        match b {
            b'\r' => {
                if iter.peek() == Some(&&b'\n') {
                    iter.next();
                }
                out.extend_from_slice(b"\r\n");
                at_line_start = true;
            }
            b'\n' => {
                out.extend_from_slice(b"\r\n");
                at_line_start = true;
            }
            _ => {
                if at_line_start && b == b'.' {
                    out.push(b'.');
                }
                out.push(b);
                at_line_start = false;
            }
        }
    }
    if !at_line_start {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `Thu, 01 Jan 1970 00:00:00 +0000` for a Unix time in UTC (clamped to
/// the year 9999).
#[allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)]
// Bounded: `secs` is clamped below 2.6e11, so every intermediate fits in
// i64, divisors are non-zero constants, and the table indexes are reduced
// modulo 7 and 1..=12.
pub fn rfc5322_date(unix_secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = i64::try_from(unix_secs.min(253_402_300_799)).unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from a day count (proleptic Gregorian calendar), computed
    // over 400-year eras of 146097 days, with years starting in March.
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year:04} {hour:02}:{minute:02}:{second:02} +0000",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
    )
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    fn message(tls: SmtpTls, auth: bool) -> EmailMessage {
        EmailMessage {
            host: "mail.example.com".into(),
            port: 587,
            tls,
            auth: auth.then(|| ("user@example.com".into(), "s3cret".into())),
            from: "Two Factor <no-reply@example.com>".into(),
            to: "alice@example.org".into(),
            subject: "Your code".into(),
            text: "Your code is 123456.\n.\nBye".into(),
            html: "<p>Your code is <b>123456</b>.</p>".into(),
        }
    }

    fn stamp() -> Stamp {
        let mut random = [0u8; 32];
        for (i, b) in random.iter_mut().enumerate() {
            *b = i as u8;
        }
        Stamp {
            unix_secs: 1_700_000_000,
            random,
        }
    }

    fn client(msg: &EmailMessage) -> SmtpClient {
        SmtpClient::new(msg, &stamp(), &ClientOptions::default()).unwrap()
    }

    /// Feeds `server` and returns everything the client wants to write.
    fn feed(c: &mut SmtpClient, server: &str) -> String {
        c.handle_input(server.as_bytes());
        drain(c)
    }

    fn drain(c: &mut SmtpClient) -> String {
        let mut out = Vec::new();
        while let Some(b) = c.poll_output() {
            out.extend(b);
        }
        String::from_utf8(out).unwrap()
    }

    fn err(c: &SmtpClient) -> SmtpError {
        match c.status() {
            Status::Done(Err(e)) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    const EHLO_PLAIN: &str =
        "250-mail.example.com hi\r\n250-PIPELINING\r\n250-SIZE 1000\r\n250 8BITMIME\r\n";

    /// Runs from MAIL FROM to the end.
    fn finish(c: &mut SmtpClient, after_hello: String) {
        assert_eq!(after_hello, "MAIL FROM:<no-reply@example.com>\r\n");
        assert_eq!(feed(c, "250 ok\r\n"), "RCPT TO:<alice@example.org>\r\n");
        assert_eq!(feed(c, "250 ok\r\n"), "DATA\r\n");
        let data = feed(c, "354 go ahead\r\n");
        assert!(data.ends_with("\r\n.\r\n"));
        assert!(data.contains("\r\n..\r\n"), "dot-stuffed: {data}");
        assert!(!c.is_done());
        assert_eq!(feed(c, "250 queued as 1\r\n"), "QUIT\r\n");
        assert_eq!(c.status(), Status::Done(Ok(())));
        // Whatever comes later is ignored.
        assert_eq!(feed(c, "221 bye\r\n"), "");
        c.handle_eof();
        assert_eq!(c.status(), Status::Done(Ok(())));
    }

    #[test]
    fn happy_path_without_auth() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        assert_eq!(drain(&mut c), "");
        assert_eq!(
            feed(&mut c, "220 mail.example.com ESMTP\r\n"),
            "EHLO localhost\r\n"
        );
        let next = feed(&mut c, EHLO_PLAIN);
        assert!(!c.is_secure());
        finish(&mut c, next);
    }

    #[test]
    fn replies_may_arrive_in_pieces() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        let mut out = String::new();
        for b in "220 hi\r\n".bytes() {
            out += &feed(&mut c, std::str::from_utf8(&[b]).unwrap());
        }
        assert_eq!(out, "EHLO localhost\r\n");
        assert_eq!(feed(&mut c, "250-a\r\n250-STARTTLS"), "");
        assert_eq!(feed(&mut c, "\r\n250 b\r\n"), "STARTTLS\r\n");
    }

    #[test]
    fn bare_lf_and_code_only_lines_are_accepted() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        assert_eq!(feed(&mut c, "220\n"), "EHLO localhost\r\n");
        let next = feed(&mut c, "250\n");
        finish(&mut c, next);
    }

    #[test]
    fn custom_client_name() {
        let msg = message(SmtpTls::StartTlsIfOffered, false);
        for name in ["tfa.example.com", "[127.0.0.1]", "[IPv6:::1]"] {
            let opts = ClientOptions {
                client_name: name.into(),
            };
            let mut c = SmtpClient::new(&msg, &stamp(), &opts).unwrap();
            assert_eq!(feed(&mut c, "220 hi\r\n"), format!("EHLO {name}\r\n"));
        }
        for name in ["", "a b", "x\r\nRCPT TO:<x@y>", "-bad", "[zz]"] {
            let opts = ClientOptions {
                client_name: name.into(),
            };
            assert_eq!(
                SmtpClient::new(&msg, &stamp(), &opts).unwrap_err().stage,
                Stage::Message
            );
        }
    }

    #[test]
    fn starttls_then_auth_plain() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, true));
        feed(&mut c, "220 hi\r\n");
        assert_eq!(
            feed(&mut c, "250-hi\r\n250-STARTTLS\r\n250 AUTH LOGIN\r\n"),
            "STARTTLS\r\n"
        );
        assert!(!c.wants_tls());
        assert_eq!(feed(&mut c, "220 ready\r\n"), "");
        assert!(c.wants_tls());
        assert_eq!(c.status(), Status::StartTls);
        c.tls_established();
        assert!(c.is_secure());
        assert_eq!(drain(&mut c), "EHLO localhost\r\n");
        // Capabilities are read again; PLAIN is preferred.
        let auth = feed(&mut c, "250-hi\r\n250-AUTH LOGIN PLAIN\r\n250 SIZE\r\n");
        let token = B64.encode(b"\0user@example.com\0s3cret");
        assert_eq!(auth, format!("AUTH PLAIN {token}\r\n"));
        assert_eq!(c.auth_mechanism(), Some("PLAIN"));
        let next = feed(&mut c, "235 2.7.0 ok\r\n");
        finish(&mut c, next);
    }

    #[test]
    fn auth_login_when_only_login_is_offered() {
        let mut c = client(&message(SmtpTls::Implicit, true));
        assert!(c.is_secure() && c.implicit_tls());
        feed(&mut c, "220 hi\r\n");
        // Implicit TLS: STARTTLS is never attempted even when offered.
        assert_eq!(
            feed(&mut c, "250-hi\r\n250-STARTTLS\r\n250 AUTH=LOGIN\r\n"),
            "AUTH LOGIN\r\n"
        );
        assert_eq!(
            feed(&mut c, "334 VXNlcm5hbWU6\r\n"),
            format!("{}\r\n", B64.encode("user@example.com"))
        );
        assert_eq!(
            feed(&mut c, "334 UGFzc3dvcmQ6\r\n"),
            format!("{}\r\n", B64.encode("s3cret"))
        );
        let next = feed(&mut c, "235 ok\r\n");
        finish(&mut c, next);
    }

    #[test]
    fn credentials_never_go_out_in_plain_text_to_remote_servers() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, true));
        feed(&mut c, "220 hi\r\n");
        let out = feed(&mut c, "250-hi\r\n250 AUTH PLAIN LOGIN\r\n");
        assert_eq!(out, "QUIT\r\n");
        assert!(!out.contains(&B64.encode(b"\0user@example.com\0s3cret")));
        let e = err(&c);
        assert_eq!((e.stage, e.code), (Stage::Auth, None));
        assert!(e.line.contains("unencrypted"));
    }

    #[test]
    fn loopback_servers_may_take_credentials_in_plain_text() {
        for host in ["127.0.0.1", "localhost", "::1", "[::1]"] {
            let mut msg = message(SmtpTls::StartTlsIfOffered, true);
            msg.host = host.into();
            let mut c = client(&msg);
            feed(&mut c, "220 hi\r\n");
            let out = feed(&mut c, "250-hi\r\n250 AUTH PLAIN\r\n");
            assert!(out.starts_with("AUTH PLAIN "), "{host}: {out}");
        }
    }

    #[test]
    fn auth_without_a_usable_mechanism_fails() {
        let mut msg = message(SmtpTls::Implicit, true);
        msg.host = "127.0.0.1".into();
        let mut c = client(&msg);
        feed(&mut c, "220 hi\r\n");
        assert_eq!(feed(&mut c, "250-hi\r\n250 AUTH CRAM-MD5\r\n"), "QUIT\r\n");
        assert_eq!(err(&c).stage, Stage::Auth);
    }

    #[test]
    fn helo_fallback() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        assert_eq!(feed(&mut c, "502 what?\r\n"), "HELO localhost\r\n");
        let next = feed(&mut c, "250 hello\r\n");
        finish(&mut c, next);
    }

    #[test]
    fn server_errors_at_each_stage() {
        // (replies before the failing one, the failing reply, stage)
        let ok_path = [
            "220 hi\r\n",
            "250-hi\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n",
            "220 go\r\n",
            "250-hi\r\n250 AUTH PLAIN\r\n",
            "235 ok\r\n",
            "250 ok\r\n",
            "250 ok\r\n",
            "354 go\r\n",
        ];
        let stages = [
            (Stage::Greeting, "554 go away\r\n", false),
            (Stage::Hello, "421 busy\r\n", true),
            (Stage::StartTls, "454 TLS not available\r\n", true),
            (Stage::Hello, "421 busy\r\n", true),
            (Stage::Auth, "535 5.7.8 bad credentials\r\n", true),
            (Stage::MailFrom, "553 sender rejected\r\n", true),
            (Stage::RcptTo, "550 no such user\r\n", true),
            (Stage::Data, "554 no valid recipients\r\n", true),
            (Stage::Content, "552 too big\r\n", true),
        ];
        for (i, (stage, failure, quit)) in stages.iter().enumerate() {
            let mut c = client(&message(SmtpTls::StartTlsIfOffered, true));
            for (j, reply) in ok_path.iter().take(i).enumerate() {
                feed(&mut c, reply);
                if j == 2 {
                    c.tls_established();
                    drain(&mut c);
                }
            }
            let out = feed(&mut c, failure);
            assert_eq!(out == "QUIT\r\n", *quit, "stage {stage:?}: {out:?}");
            let e = err(&c);
            assert_eq!(e.stage, *stage, "{failure}");
            assert_eq!(e.code, failure[..3].parse().ok());
            assert_eq!(e.line, failure[4..].trim_end());
            assert!(e.to_string().contains(failure.trim_end()), "{e}");
        }
    }

    #[test]
    fn multi_line_error_text_is_kept() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        feed(&mut c, EHLO_PLAIN);
        feed(&mut c, "550-5.1.1 first\r\n550 5.1.1 second\r\n");
        assert_eq!(err(&c).line, "5.1.1 first / 5.1.1 second");
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        for garbage in [
            "hello\r\n",
            "22\r\n",
            "2200 x\r\n",
            "220x\r\n",
            "999 x\r\n",
            "099 x\r\n",
            "\u{0}\u{1}\u{2}\r\n",
            "250-a\r\n251 b\r\n",
        ] {
            let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
            assert_eq!(feed(&mut c, garbage), "", "{garbage:?}");
            let e = err(&c);
            assert_eq!(e.code, None, "{garbage:?}");
            assert!(e.line.starts_with("protocol error"), "{e}");
        }
    }

    #[test]
    fn unrequested_replies_end_the_session() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        assert_eq!(feed(&mut c, "220 hi\r\n250 extra\r\n"), "");
        assert!(err(&c).line.contains("before it was asked"));
    }

    #[test]
    fn starttls_injection_is_refused() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        feed(&mut c, "250-hi\r\n250 STARTTLS\r\n");
        feed(&mut c, "220 go\r\n250 injected\r\n");
        assert_eq!(err(&c).stage, Stage::StartTls);

        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        feed(&mut c, "250-hi\r\n250 STARTTLS\r\n");
        feed(&mut c, "220 go\r\n");
        assert!(c.wants_tls());
        c.handle_input(b"250 late");
        assert_eq!(err(&c).stage, Stage::StartTls);
    }

    #[test]
    fn limits_hold() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        let long = vec![b'2'; MAX_LINE + 1];
        c.handle_input(&long);
        assert!(err(&c).line.contains("too long"));

        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        let many = "250-x\r\n".repeat(MAX_REPLY_LINES + 1);
        feed(&mut c, &many);
        assert!(err(&c).line.contains("too many lines"));

        let long_text = format!("554 {}\r\n", "x".repeat(5000));
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, &long_text);
        assert!(err(&c).line.chars().count() <= MAX_ERROR_TEXT + 1);
    }

    #[test]
    fn eof_is_an_error_before_acceptance() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        feed(&mut c, "220 hi\r\n");
        c.handle_eof();
        let e = err(&c);
        assert_eq!((e.stage, e.code), (Stage::Hello, None));
        assert!(e.line.contains("closed"));
    }

    #[test]
    fn tls_established_outside_starttls_does_nothing() {
        let mut c = client(&message(SmtpTls::StartTlsIfOffered, false));
        c.tls_established();
        assert!(!c.is_secure());
        assert_eq!(drain(&mut c), "");
    }

    #[test]
    fn dot_stuffing_and_line_ends() {
        assert_eq!(dot_stuff(b""), b".\r\n");
        assert_eq!(dot_stuff(b"a"), b"a\r\n.\r\n");
        assert_eq!(
            dot_stuff(b".a\nb\r.\r\n..\r\n"),
            b"..a\r\nb\r\n..\r\n...\r\n.\r\n"
        );
        assert_eq!(dot_stuff(b"x\r\n"), b"x\r\n.\r\n");
        assert_eq!(dot_stuff(b"a.b\r\n"), b"a.b\r\n.\r\n");
    }

    #[test]
    fn quoted_printable_rules() {
        assert_eq!(quoted_printable("a=b"), "a=3Db");
        assert_eq!(quoted_printable("é"), "=C3=A9");
        assert_eq!(quoted_printable("a \nb\t"), "a=20\r\nb=09");
        assert_eq!(quoted_printable("x\r\ny\rz"), "x\r\ny\r\nz");
        let long = "a".repeat(200);
        let encoded = quoted_printable(&long);
        assert!(encoded.split("\r\n").all(|l| l.len() <= 76));
        assert_eq!(encoded.replace("=\r\n", ""), long);
        // An escape is never split by a soft break.
        let mixed = "é".repeat(60);
        for line in quoted_printable(&mixed).split("\r\n") {
            assert!(line.len() <= 76);
            let body = line.strip_suffix('=').unwrap_or(line);
            assert_eq!(body.len() % 3, 0, "{line}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(rfc5322_date(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(
            rfc5322_date(1_700_000_000),
            "Tue, 14 Nov 2023 22:13:20 +0000"
        );
        assert_eq!(rfc5322_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 +0000");
        assert_eq!(
            rfc5322_date(4_102_444_799),
            "Thu, 31 Dec 2099 23:59:59 +0000"
        );
        assert_eq!(rfc5322_date(u64::MAX), "Fri, 31 Dec 9999 23:59:59 +0000");
    }

    #[test]
    fn message_layout() {
        let msg = message(SmtpTls::StartTlsIfOffered, false);
        let text = String::from_utf8(format_message(&msg, &stamp()).unwrap()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            head,
            "Date: Tue, 14 Nov 2023 22:13:20 +0000\r\n\
             From: \"Two Factor\" <no-reply@example.com>\r\n\
             To: alice@example.org\r\n\
             Subject: Your code\r\n\
             Message-ID: <000102030405060708090a0b0c0d0e0f@example.com>\r\n\
             MIME-Version: 1.0\r\n\
             Content-Type: multipart/alternative;\r\n boundary=\"=_tfa_101112131415161718191a1b1c1d1e1f\""
        );
        let b = "--=_tfa_101112131415161718191a1b1c1d1e1f";
        assert!(body.starts_with(&format!(
            "{b}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        )));
        assert!(body.contains("Your code is 123456.\r\n.\r\nBye\r\n"));
        assert!(body.contains(&format!(
            "{b}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n<p>Your code is <b>123456</b>.</p>\r\n"
        )));
        assert!(body.ends_with(&format!("{b}--\r\n")));
        assert!(text.is_ascii());
        assert!(text.split("\r\n").all(|l| l.len() <= 78));
    }

    #[test]
    fn non_ascii_subject_and_name_are_encoded_words() {
        let mut msg = message(SmtpTls::StartTlsIfOffered, false);
        msg.subject = "Votre code de vérification — ne le partagez avec personne, jamais".into();
        msg.from = "Sécurité <no-reply@example.com>".into();
        let text = String::from_utf8(format_message(&msg, &stamp()).unwrap()).unwrap();
        assert!(text.is_ascii());
        assert!(text.contains("From: =?UTF-8?B?U8OpY3VyaXTDqQ==?= <no-reply@example.com>\r\n"));
        let subject_start = text.find("Subject: ").unwrap();
        let subject_end = text[subject_start..].find("\r\nMessage-ID").unwrap();
        let subject = &text[subject_start + 9..subject_start + subject_end];
        let decoded: String = subject
            .split("\r\n ")
            .map(|w| {
                let b64 = w
                    .strip_prefix("=?UTF-8?B?")
                    .unwrap()
                    .strip_suffix("?=")
                    .unwrap();
                assert!(w.len() <= 64);
                String::from_utf8(B64.decode(b64).unwrap()).unwrap()
            })
            .collect();
        assert_eq!(decoded, msg.subject);
        // Looks like an encoded word: encoded too, so it reads back as typed.
        msg.subject = "=?UTF-8?B?eA==?=".into();
        let text = String::from_utf8(format_message(&msg, &stamp()).unwrap()).unwrap();
        assert!(text.contains("Subject: =?UTF-8?B?PT9VVEYtOD9CP2VBPT0/PQ==?=\r\n"));
        // Quotes in a plain name are escaped.
        msg.from = "\"A \\\"B\\\"\" <a@b.c>".into();
        let text = String::from_utf8(format_message(&msg, &stamp()).unwrap()).unwrap();
        assert!(text.contains("From: \"A \\\"B\\\"\" <a@b.c>\r\n"), "{text}");
    }

    #[test]
    fn header_injection_and_bad_addresses_are_refused() {
        let base = message(SmtpTls::StartTlsIfOffered, false);
        let mut cases = Vec::new();
        let mut m = base.clone();
        m.subject = "hi\r\nBcc: eve@example.com".into();
        cases.push(m);
        for bad in [
            "eve@example.com\r\nBcc: x@y.z",
            "a@b.c>\r\nRCPT TO:<eve@x.y",
            "Name\n <a@b.c>",
            "no-at-sign",
            "@example.com",
            "a@",
            "a..b@example.com",
            ".a@example.com",
            "a b@example.com",
            "\"quoted\"@example.com",
            "a@-bad.com",
            "a@exa_mple.com",
            "é@example.com",
            "a@exämple.com",
            "<a@b.c",
            "Name <a@b.c",
            "a@b.c>",
        ] {
            let mut m = base.clone();
            m.to = bad.into();
            cases.push(m.clone());
            let mut m = base.clone();
            m.from = bad.into();
            cases.push(m);
        }
        let mut m = base.clone();
        m.auth = Some(("u\0".into(), "p".into()));
        cases.push(m);
        for m in cases {
            let e = SmtpClient::new(&m, &stamp(), &ClientOptions::default()).unwrap_err();
            assert_eq!(e.stage, Stage::Message, "{m:?}");
        }
        for good in [
            "a.b+tag@example.com",
            "x@localhost",
            "Name <x@sub.example.co.uk>",
            "<x@y.z>",
        ] {
            let mut m = base.clone();
            m.to = good.into();
            assert!(
                SmtpClient::new(&m, &stamp(), &ClientOptions::default()).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn body_line_ends_are_normalised_in_data() {
        let mut msg = message(SmtpTls::StartTlsIfOffered, false);
        msg.text = "one\rtwo\nthree\r\n.four".into();
        let mut c = client(&msg);
        feed(&mut c, "220 hi\r\n");
        feed(&mut c, "250 hi\r\n");
        feed(&mut c, "250 ok\r\n");
        feed(&mut c, "250 ok\r\n");
        let data = feed(&mut c, "354 go\r\n");
        assert!(data.contains("one\r\ntwo\r\nthree\r\n..four\r\n"), "{data}");
        // No bare CR or LF anywhere.
        let bytes = data.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'\n' {
                assert_eq!(bytes[i - 1], b'\r');
            }
            if *b == b'\r' {
                assert_eq!(bytes[i + 1], b'\n');
            }
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn arbitrary_server_input_never_panics(
                chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
                tls in any::<bool>(),
            ) {
                let mut c = client(&message(SmtpTls::StartTlsIfOffered, true));
                let mut written = 0usize;
                for chunk in chunks {
                    c.handle_input(&chunk);
                    if tls && c.wants_tls() {
                        c.tls_established();
                    }
                    while let Some(out) = c.poll_output() {
                        written += out.len();
                    }
                }
                c.handle_eof();
                prop_assert!(c.is_done());
                prop_assert!(written < 100_000);
            }

            #[test]
            fn plausible_replies_never_panic(
                replies in proptest::collection::vec(
                    (prop_oneof![Just(220u16), Just(235), Just(250), Just(334), Just(354), Just(421), Just(535), Just(550)],
                     any::<bool>(), "[ -~]{0,20}"),
                    0..30),
            ) {
                let mut msg = message(SmtpTls::StartTlsIfOffered, true);
                msg.host = "127.0.0.1".into();
                let mut c = client(&msg);
                for (code, more, text) in replies {
                    let sep = if more { '-' } else { ' ' };
                    c.handle_input(format!("{code}{sep}{text}\r\n").as_bytes());
                    if c.wants_tls() {
                        c.tls_established();
                    }
                    while c.poll_output().is_some() {}
                }
                c.handle_eof();
                prop_assert!(c.is_done());
            }

            #[test]
            fn any_text_survives_quoted_printable(text in "\\PC{0,300}") {
                let encoded = quoted_printable(&text);
                prop_assert!(encoded.is_ascii());
                prop_assert!(encoded.split("\r\n").all(|l| l.len() <= 76));
            }

            #[test]
            fn stuffed_data_has_one_terminator(body in proptest::collection::vec(any::<u8>(), 0..500)) {
                let out = dot_stuff(&body);
                let text = out.as_slice();
                let terminators = text.windows(5).filter(|w| w == b"\r\n.\r\n").count()
                    + usize::from(text.starts_with(b".\r\n"));
                prop_assert_eq!(terminators, 1);
                prop_assert!(text.ends_with(b".\r\n"));
            }
        }
    }
}
