//! `tfa_smtp` against a real SMTP server: aiosmtpd, started by each
//! test from `tests/smtp/server.py` on 127.0.0.1 ([`SmtpServer`]) and stopped
//! when the test ends. The test owns the socket (`std::net::TcpStream`) and TLS (`rustls`
//! with the RustCrypto provider, trusting the test CA the script makes).
//!
//! These tests FAIL, never skip, when Python (`$TFA_PYTHON`, default
//! `python3`), `aiosmtpd` or `openssl` is missing: `scripts/test-smtp.sh`
//! installs them and runs this file.

#![allow(clippy::disallowed_types)] // the test is the host: it owns the TcpStream.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use e2e::smtp::SmtpServer;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::Value;
use tfa_smtp::{ClientOptions, EmailMessage, SmtpClient, SmtpError, SmtpTls, Stage, Stamp, Status};

const STEP: Duration = Duration::from_secs(10);

// ------------------------------------------------------------- the "host"

enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

#[derive(Debug)]
enum Failure {
    Smtp(SmtpError),
    Io(String),
}

fn tls_config(ca_pem: Option<&str>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.expect("PEM")).expect("CA");
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(rustls_rustcrypto::provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

fn handshake(
    sock: TcpStream,
    config: &Arc<ClientConfig>,
    host: &str,
) -> Result<Box<StreamOwned<ClientConnection, TcpStream>>, Failure> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| Failure::Io(e.to_string()))?;
    let conn = ClientConnection::new(config.clone(), name)
        .map_err(|e| Failure::Io(format!("TLS: {e}")))?;
    let mut stream = StreamOwned::new(conn, sock);
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| Failure::Io(format!("TLS handshake: {e}")))?;
    }
    Ok(Box::new(stream))
}

/// Sends `msg` through 127.0.0.1:`port` (the message's `host` is the TLS
/// server name and decides whether plain-text AUTH is allowed).
fn send(msg: &EmailMessage, port: u16, ca_pem: Option<&str>) -> Result<(), Failure> {
    let stamp = Stamp {
        unix_secs: 1_700_000_000,
        random: [7u8; 32],
    };
    let mut client =
        SmtpClient::new(msg, &stamp, &ClientOptions::default()).map_err(Failure::Smtp)?;
    let config = tls_config(ca_pem);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let sock = TcpStream::connect_timeout(&addr, STEP).map_err(|e| Failure::Io(e.to_string()))?;
    sock.set_read_timeout(Some(STEP)).expect("timeout");
    sock.set_write_timeout(Some(STEP)).expect("timeout");
    let mut conn = Some(match msg.tls {
        SmtpTls::Implicit => Conn::Tls(handshake(sock, &config, &msg.host)?),
        SmtpTls::StartTlsIfOffered => Conn::Plain(sock),
    });
    let mut buf = [0u8; 4096];
    for _ in 0..1000 {
        let c = conn.as_mut().expect("connection");
        while let Some(out) = client.poll_output() {
            c.write_all(&out).map_err(|e| Failure::Io(e.to_string()))?;
        }
        c.flush().map_err(|e| Failure::Io(e.to_string()))?;
        match client.status() {
            Status::Done(Ok(())) => return Ok(()),
            Status::Done(Err(e)) => return Err(Failure::Smtp(e)),
            Status::StartTls => {
                let Some(Conn::Plain(sock)) = conn.take() else {
                    return Err(Failure::Io("STARTTLS twice".into()));
                };
                conn = Some(Conn::Tls(handshake(sock, &config, &msg.host)?));
                client.tls_established();
                continue;
            }
            Status::Running => {}
        }
        match c.read(&mut buf) {
            Ok(0) => client.handle_eof(),
            Ok(n) => client.handle_input(&buf[..n]),
            Err(e) => return Err(Failure::Io(format!("read: {e}"))),
        }
    }
    Err(Failure::Io("the session did not finish".into()))
}

fn message(tls: SmtpTls, auth: Option<(&str, &str)>) -> EmailMessage {
    EmailMessage {
        host: "127.0.0.1".into(),
        port: 0,
        tls,
        auth: auth.map(|(u, p)| (u.to_string(), p.to_string())),
        from: "Sécurité TFA <no-reply@tfa.test>".into(),
        to: "alice@example.test".into(),
        subject: "Votre code de vérification : 493027".into(),
        text: "Your verification code is 493027.\n.\nIt expires in 5 minutes.\n".into(),
        html: "<p>Your verification code is <strong>493027</strong>.</p>\n.\n<p>Ünïcode ✓</p>"
            .into(),
    }
}

/// The checks every delivered message must pass.
fn assert_delivered(server: &SmtpServer, msg: &EmailMessage) -> Value {
    let (parsed, meta, raw) = server.message(1);
    assert_eq!(parsed["defects"], serde_json::json!([]), "{raw}");
    assert_eq!(parsed["subject"], msg.subject.as_str());
    assert_eq!(parsed["from"], "Sécurité TFA <no-reply@tfa.test>");
    assert_eq!(parsed["to"], "alice@example.test");
    assert_eq!(parsed["content_type"], "multipart/alternative");
    let headers = &parsed["headers"];
    assert_eq!(headers["Date"], "Tue, 14 Nov 2023 22:13:20 +0000");
    assert_eq!(headers["MIME-Version"], "1.0");
    assert_eq!(
        headers["Message-ID"],
        "<07070707070707070707070707070707@tfa.test>"
    );
    let parts = parsed["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 2, "{raw}");
    assert_eq!(parts[0]["content_type"], "text/plain");
    assert_eq!(parts[0]["charset"], "utf-8");
    assert_eq!(
        parts[0]["body"],
        "Your verification code is 493027.\n.\nIt expires in 5 minutes.\n"
    );
    assert_eq!(parts[1]["content_type"], "text/html");
    assert_eq!(parts[1]["charset"], "utf-8");
    assert_eq!(
        parts[1]["body"].as_str().map(|b| b.trim_end()),
        Some("<p>Your verification code is <strong>493027</strong>.</p>\n.\n<p>Ünïcode ✓</p>")
    );
    assert_eq!(meta["mail_from"], "no-reply@tfa.test");
    assert_eq!(meta["rcpt_tos"], serde_json::json!(["alice@example.test"]));
    meta
}

#[test]
fn plain_session_without_auth() {
    let server = SmtpServer::start(&["--tls", "none"]);
    let msg = message(SmtpTls::StartTlsIfOffered, None);
    send(&msg, server.port, None).expect("sent");
    let meta = assert_delivered(&server, &msg);
    assert_eq!(meta["tls"], false);
    assert_eq!(meta["auth_user"], Value::Null);
}

#[test]
fn starttls_then_auth() {
    let server = SmtpServer::start(&["--tls", "starttls", "--auth", "mailer:pa ss:wörd"]);
    // A host name this time: the certificate names both.
    let mut msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "pa ss:wörd")));
    msg.host = "localhost".into();
    send(&msg, server.port, Some(&server.ca_pem())).expect("sent");
    let meta = assert_delivered(&server, &msg);
    assert_eq!(meta["tls"], true);
    assert_eq!(meta["auth_user"], "mailer");
}

#[test]
fn starttls_with_auth_login_only() {
    let server = SmtpServer::start(&[
        "--tls",
        "starttls",
        "--auth",
        "mailer:secret",
        "--auth-exclude",
        "PLAIN",
    ]);
    let msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "secret")));
    send(&msg, server.port, Some(&server.ca_pem())).expect("sent");
    let meta = assert_delivered(&server, &msg);
    assert_eq!(meta["tls"], true);
    assert_eq!(meta["auth_user"], "mailer");
}

#[test]
fn starttls_without_auth() {
    let server = SmtpServer::start(&["--tls", "starttls"]);
    let msg = message(SmtpTls::StartTlsIfOffered, None);
    send(&msg, server.port, Some(&server.ca_pem())).expect("sent");
    assert_eq!(assert_delivered(&server, &msg)["tls"], true);
}

#[test]
fn implicit_tls_with_auth() {
    let server = SmtpServer::start(&["--tls", "implicit", "--auth", "mailer:secret"]);
    let msg = message(SmtpTls::Implicit, Some(("mailer", "secret")));
    send(&msg, server.port, Some(&server.ca_pem())).expect("sent");
    let meta = assert_delivered(&server, &msg);
    assert_eq!(meta["tls"], true);
    assert_eq!(meta["auth_user"], "mailer");
}

#[test]
fn plain_auth_is_allowed_on_loopback() {
    let server = SmtpServer::start(&["--tls", "none", "--auth", "mailer:secret"]);
    let msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "secret")));
    send(&msg, server.port, None).expect("sent");
    let meta = assert_delivered(&server, &msg);
    assert_eq!(meta["tls"], false);
    assert_eq!(meta["auth_user"], "mailer");
}

#[test]
fn plain_auth_is_refused_for_a_remote_server_name() {
    let server = SmtpServer::start(&["--tls", "none", "--auth", "mailer:secret"]);
    let mut msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "secret")));
    msg.host = "smtp.example.test".into();
    match send(&msg, server.port, None) {
        Err(Failure::Smtp(e)) => {
            assert_eq!((e.stage, e.code), (Stage::Auth, None));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(server.count(), 0);
}

#[test]
fn wrong_password_is_the_servers_535() {
    let server = SmtpServer::start(&["--tls", "starttls", "--auth", "mailer:secret"]);
    let msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "nope")));
    match send(&msg, server.port, Some(&server.ca_pem())) {
        Err(Failure::Smtp(e)) => {
            assert_eq!((e.stage, e.code), (Stage::Auth, Some(535)), "{e}");
            assert!(!e.to_string().contains("nope"));
        }
        other => panic!("expected a 535, got {other:?}"),
    }
    assert_eq!(server.count(), 0);
}

#[test]
fn untrusted_certificate_stops_before_any_credential() {
    let server = SmtpServer::start(&["--tls", "starttls", "--auth", "mailer:secret"]);
    let msg = message(SmtpTls::StartTlsIfOffered, Some(("mailer", "secret")));
    match send(&msg, server.port, None) {
        Err(Failure::Io(e)) => assert!(e.contains("TLS handshake"), "{e}"),
        other => panic!("expected a TLS failure, got {other:?}"),
    }
    assert_eq!(server.count(), 0);
}
