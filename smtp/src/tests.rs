//! The session and the message against scripted servers and properties.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

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
    assert!(c.is_secure(), "secure from the first byte");
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
