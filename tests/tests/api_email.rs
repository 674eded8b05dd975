//! E-mail codes through the real components: the API component hands each
//! message to the mailer component (`POST http://tfa-mailer.spin.internal/send`,
//! local service chaining), whose `.wasm` opens a TCP connection with
//! `wasi:sockets` (allowed as `tcp://…` in its outbound allow-list), runs TLS
//! with rustls inside the component, and talks SMTP to a real server
//! (aiosmtpd from `tests/smtp/server.py`) that the test starts and stops.
//! Also what happens when the server refuses or never answers, and that no
//! one but the API reaches the mailer.

use std::net::TcpListener;
use std::time::Duration;

use e2e::api::*;
use e2e::procs::{Host, HostOptions};
use e2e::smtp::SmtpServer;
use serde_json::{json, Value};
use tfa_core::plumbing::ratelimit;

/// Settings that point the service at `port` on 127.0.0.1.
fn email_settings(port: u16, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("EMAIL_HOST".to_string(), "127.0.0.1".to_string()),
        ("EMAIL_PORT".to_string(), port.to_string()),
        (
            "EMAIL_FROM".to_string(),
            "Example 2FA <no-reply@example.com>".to_string(),
        ),
        (
            "ALLOWED_OUTBOUND_HOSTS".to_string(),
            format!("tcp://127.0.0.1:{port}"),
        ),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// The six-digit code in a message body.
fn code_in(body: &str) -> String {
    body.split("verification code is ")
        .nth(1)
        .and_then(|rest| rest.get(..6))
        .unwrap_or_else(|| panic!("no code in {body:?}"))
        .to_string()
}

/// Message `n` as the server got it: the code of its text part, after the
/// checks every code e-mail must pass.
fn received_code(server: &SmtpServer, n: usize, to: &str) -> (String, Value) {
    let (parsed, meta, raw) = server.message(n);
    assert_eq!(parsed["defects"], json!([]), "{raw}");
    assert_eq!(parsed["to"], to);
    assert_eq!(parsed["from"], "Example 2FA <no-reply@example.com>");
    assert_eq!(parsed["content_type"], "multipart/alternative");
    let parts = parsed["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 2, "{raw}");
    assert_eq!(parts[0]["content_type"], "text/plain");
    assert_eq!(parts[1]["content_type"], "text/html");
    let text = parts[0]["body"].as_str().expect("text part");
    let code = code_in(text);
    assert!(
        parts[1]["body"]
            .as_str()
            .is_some_and(|h| h.contains(&format!("<strong>{code}</strong>"))),
        "the HTML part carries the same code: {raw}"
    );
    assert_eq!(meta["rcpt_tos"], json!([to]));
    assert_eq!(meta["mail_from"], "no-reply@example.com");
    (code, meta)
}

/// Enrols e-mail as the second factor, then logs in with an e-mailed code.
fn enrol_and_log_in(host: &Host, server: &SmtpServer, name: &str) -> Value {
    let c = &host.client;
    let u = register(c, name);
    let r = c.post(
        "/api/2fa/email/setup",
        &json!({ "email": u.email }),
        Some(&u.access),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.json(), host.output());
    assert_eq!(r.data()["codeSent"], true);
    let (code, meta) = received_code(server, 1, &u.email);
    let r = c.post(
        "/api/2fa/email/verify-setup",
        &json!({ "code": code }),
        Some(&u.access),
    );
    assert_eq!(r.data()["method"], "email");

    let temp = temp_token(c, &u);
    let r = c.post(
        "/api/2fa/send-code",
        &json!({ "tempToken": temp, "method": "email" }),
        None,
    );
    assert_eq!(r.data()["codeSent"], true);
    let (code, _) = received_code(server, 2, &u.email);
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": code }),
        None,
    );
    assert!(r.data()["accessToken"].is_string(), "{}", r.json());
    meta
}

#[test]
fn email_codes_over_starttls_with_auth() {
    let server = SmtpServer::start(&["--tls", "starttls", "--auth", "mailer:s3cret pass"]);
    let ca = server.ca_pem();
    let host = Host::start(HostOptions {
        env: email_settings(
            server.port,
            &[
                ("EMAIL_USER", "mailer"),
                ("EMAIL_PASSWORD", "s3cret pass"),
                ("EMAIL_TLS_CA_PEM", &ca),
            ],
        ),
        ..Default::default()
    });
    let meta = enrol_and_log_in(&host, &server, "tess");
    assert_eq!(meta["tls"], true, "STARTTLS was used");
    assert_eq!(meta["auth_user"], "mailer");
}

#[test]
fn email_codes_over_plain_smtp() {
    let server = SmtpServer::start(&["--tls", "none"]);
    let host = Host::start(HostOptions {
        env: email_settings(server.port, &[]),
        ..Default::default()
    });
    let meta = enrol_and_log_in(&host, &server, "pam");
    assert_eq!(meta["tls"], false);
    assert_eq!(meta["auth_user"], Value::Null);
}

#[test]
fn an_untrusted_certificate_is_a_failed_delivery_not_plain_text() {
    // The server offers STARTTLS with a certificate of a CA the component
    // does not trust: the delivery fails; nothing goes out in the clear.
    let server = SmtpServer::start(&["--tls", "starttls", "--auth", "mailer:secret"]);
    let host = Host::start(HostOptions {
        env: email_settings(
            server.port,
            &[("EMAIL_USER", "mailer"), ("EMAIL_PASSWORD", "secret")],
        ),
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "una");
    c.post(
        "/api/2fa/email/setup",
        &json!({ "email": u.email }),
        Some(&u.access),
    )
    .assert_error(503, "Failed to send verification code");
    assert_eq!(server.count(), 0);
    assert!(host.wait_output("SMTP 127.0.0.1", Duration::from_secs(5)));
}

/// A server that refuses or never answers: a clear 503, the send allowance
/// untouched, the earlier code still good; then the real server works.
#[test]
fn refused_and_silent_smtp_servers_fail_cleanly_and_cost_nothing() {
    // Counts the hourly send allowance from start to end.
    within_one_rate_window(ratelimit::SEND_EMAIL, 90);
    // A port with nothing listening (bound, then closed).
    let refused_port = e2e::free_port();
    // A server that accepts and never sends its greeting.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();

    // Enrol with the real server first.
    let server = SmtpServer::start(&["--tls", "none"]);
    let host = Host::start(HostOptions {
        env: email_settings(server.port, &[]),
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "ray");
    c.post(
        "/api/2fa/email/setup",
        &json!({ "email": u.email }),
        Some(&u.access),
    );
    let (code, _) = received_code(&server, 1, &u.email);
    c.post(
        "/api/2fa/email/verify-setup",
        &json!({ "code": code }),
        Some(&u.access),
    );
    let temp = temp_token(c, &u);
    let r = c.post(
        "/api/2fa/send-code",
        &json!({ "tempToken": temp, "method": "email" }),
        None,
    );
    let remaining: u32 = r.header("x-ratelimit-remaining").unwrap().parse().unwrap();
    let (code, _) = received_code(&server, 2, &u.email);
    let data_dir = host.data_dir.clone();
    host.stop();

    for (port, what) in [(refused_port, "refused"), (silent_port, "silent")] {
        let mut env = email_settings(port, &[]);
        env.retain(|(k, _)| k != "ALLOWED_OUTBOUND_HOSTS");
        env.push((
            "ALLOWED_OUTBOUND_HOSTS".into(),
            format!("tcp://127.0.0.1:{port}"),
        ));
        let host = Host::start(HostOptions {
            data_dir: Some(data_dir.clone()),
            env,
            ..Default::default()
        });
        host.client
            .post(
                "/api/2fa/send-code",
                &json!({ "tempToken": temp, "method": "email" }),
                None,
            )
            .assert_error(503, "Failed to send verification code");
        assert!(
            host.wait_output("SMTP 127.0.0.1", Duration::from_secs(5)),
            "{what}: the reason is logged\n{}",
            host.output()
        );
        host.stop();
    }
    drop(silent);

    // Back on the real server: the code sent before the failures still logs
    // in, and the failures cost no allowance.
    let host = Host::start(HostOptions {
        data_dir: Some(data_dir),
        env: email_settings(server.port, &[]),
        ..Default::default()
    });
    let c = &host.client;
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": code }),
        None,
    );
    assert!(r.data()["accessToken"].is_string(), "{}", r.json());
    let temp = temp_token(c, &u);
    let r = c.post(
        "/api/2fa/send-code",
        &json!({ "tempToken": temp, "method": "email" }),
        None,
    );
    assert_eq!(r.data()["codeSent"], true);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some((remaining - 1).to_string().as_str())
    );
    let (code, _) = received_code(&server, 3, &u.email);
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": code }),
        None,
    );
    assert!(r.data()["accessToken"].is_string(), "{}", r.json());
}

/// Issue #14: the server's own settings alone are enough, no
/// `ALLOWED_OUTBOUND_HOSTS`. Local host: `EMAIL_HOST`/`EMAIL_PORT`/
/// `EMAIL_FROM`; it adds `tcp://EMAIL_HOST:EMAIL_PORT` to its allow-list and
/// logs the effective list at start. Spin: the manifest's one SMTP variable
/// `email_outbound_host` (`tcp://IP:PORT`, which is also the allow-list
/// entry) plus `EMAIL_FROM`; the component takes the server from it.
#[test]
fn email_codes_with_only_the_email_settings() {
    let server = SmtpServer::start(&["--tls", "none"]);
    let from = (
        "EMAIL_FROM".to_string(),
        "Example 2FA <no-reply@example.com>".to_string(),
    );
    let env = match e2e::procs::runtime() {
        e2e::procs::Runtime::Local => {
            let mut env = email_settings(server.port, &[]);
            env.retain(|(k, _)| k != "ALLOWED_OUTBOUND_HOSTS");
            env
        }
        // The harness passes a tcp:// entry as `email_outbound_host`.
        e2e::procs::Runtime::Spin => vec![
            (
                "ALLOWED_OUTBOUND_HOSTS".to_string(),
                format!("tcp://127.0.0.1:{}", server.port),
            ),
            from,
        ],
    };
    let host = Host::start(HostOptions {
        env,
        ..Default::default()
    });
    if e2e::procs::runtime() == e2e::procs::Runtime::Local {
        assert!(
            host.output()
                .contains(&format!("tcp://127.0.0.1:{}", server.port)),
            "the effective allow-list is logged at start:\n{}",
            host.output()
        );
    }
    enrol_and_log_in(&host, &server, "emil");
}

/// Issue #14: a server known by name, over STARTTLS. Spin 4.x gives the
/// component no name lookup, so there the component connects to the IP of
/// `email_outbound_host` and checks the certificate against `EMAIL_HOST`;
/// the local host resolves the name itself. The same settings work on both.
#[test]
fn email_to_a_server_known_by_name() {
    let server = SmtpServer::start(&["--tls", "starttls"]);
    let ca = server.ca_pem();
    let mut env = email_settings(server.port, &[("EMAIL_TLS_CA_PEM", &ca)]);
    for (k, v) in env.iter_mut() {
        if k == "EMAIL_HOST" {
            *v = "localhost".into();
        }
    }
    let host = Host::start(HostOptions {
        env,
        ..Default::default()
    });
    let meta = enrol_and_log_in(&host, &server, "nomen");
    assert_eq!(meta["tls"], true, "STARTTLS was used");
}

/// A fresh access token of `u`, who has no second factor yet.
fn access_token(c: &e2e::client::Client, u: &User) -> String {
    let r = login(c, &u.email);
    r.data()["accessToken"]
        .as_str()
        .unwrap_or_else(|| panic!("no 2FA yet: {}", r.json()))
        .to_string()
}

/// The mailer's one route is not the client's: `POST /send` (and the same
/// under the API base path, or with the chaining host name as `Host`) is
/// the API component's 404, and nothing is sent. Without the mailer
/// component (`MAILER_PATH` names no file; local host only) e-mail fails
/// as any failed delivery does (503, the reason in the log) and the host
/// says so at start; the code e-mailed before still works afterwards.
#[test]
fn only_the_api_reaches_the_mailer() {
    let server = SmtpServer::start(&["--tls", "none"]);
    let host = Host::start(HostOptions {
        env: email_settings(server.port, &[]),
        ..Default::default()
    });
    let c = &host.client;
    let relay = json!({ "message": {
        "host": "127.0.0.1", "port": server.port, "tls": "StartTlsIfOffered",
        "auth": null, "from": "no-reply@example.com", "to": "eve@example.org",
        "subject": "spam", "text": "spam", "html": "spam"
    }})
    .to_string();
    for (path, host_header) in [
        ("/send", None),
        ("/api/send", None),
        ("/send", Some("tfa-mailer.spin.internal")),
    ] {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(host_header.map(|h| ("host", h)));
        c.send("POST", path, &headers, relay.as_bytes())
            .assert_error(404, "Resource not found");
    }
    // The API's own e-mail still goes through.
    let u = register(c, "mia");
    let r = c.post(
        "/api/2fa/email/setup",
        &json!({ "email": u.email }),
        Some(&u.access),
    );
    assert_eq!(r.data()["codeSent"], true, "{}", r.json());
    let (code, _) = received_code(&server, 1, &u.email);
    assert_eq!(
        server.count(),
        1,
        "the client's relay requests sent nothing"
    );
    let data_dir = host.data_dir.clone();
    host.stop();

    if e2e::procs::runtime() == e2e::procs::Runtime::Spin {
        return;
    }
    let mut env = email_settings(server.port, &[]);
    env.push(("MAILER_PATH".into(), "/nonexistent/tfa_mailer.wasm".into()));
    let host = Host::start(HostOptions {
        data_dir: Some(data_dir.clone()),
        env,
        ..Default::default()
    });
    assert!(
        host.wait_output("no mailer component", Duration::from_secs(5)),
        "{}",
        host.output()
    );
    let c = &host.client;
    let access = access_token(c, &u);
    c.post(
        "/api/2fa/email/setup",
        &json!({ "email": u.email }),
        Some(&access),
    )
    .assert_error(503, "Failed to send verification code");
    assert!(
        host.wait_output(
            "no component answers tfa-mailer.spin.internal",
            Duration::from_secs(5)
        ),
        "{}",
        host.output()
    );
    assert_eq!(server.count(), 1);
    host.stop();

    // With the mailer back, the code sent at first still enables e-mail.
    let host = Host::start(HostOptions {
        data_dir: Some(data_dir),
        env: email_settings(server.port, &[]),
        ..Default::default()
    });
    let c = &host.client;
    let access = access_token(c, &u);
    let r = c.post(
        "/api/2fa/email/verify-setup",
        &json!({ "code": code }),
        Some(&access),
    );
    assert_eq!(r.data()["method"], "email", "{}", r.json());
}
