//! The session: a state machine fed with the server's bytes.

use std::collections::VecDeque;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use crate::message::{check_client_name, dot_stuff, format_message, parse_mailbox};
use crate::{
    ClientOptions, EmailMessage, SmtpError, SmtpTls, Stage, Stamp, Status, MAX_ERROR_TEXT,
    MAX_LINE, MAX_REPLIES, MAX_REPLY_LINES,
};

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
    #[cfg(test)]
    pub(crate) fn wants_tls(&self) -> bool {
        self.state == State::AwaitTls
    }

    /// Whether the session is over (write remaining output, then close).
    #[cfg(test)]
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Whether the connection is encrypted (implicit TLS, or after
    /// `STARTTLS`).
    #[cfg(test)]
    pub(crate) fn is_secure(&self) -> bool {
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

    /// The TLS handshake asked for by [`Status::StartTls`] succeeded:
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
    #[cfg(test)]
    pub(crate) fn auth_mechanism(&self) -> Option<&'static str> {
        if self.caps.auth_plain {
            Some("PLAIN")
        } else if self.caps.auth_login {
            Some("LOGIN")
        } else {
            None
        }
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
