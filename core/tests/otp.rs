//! SMS and e-mail codes: setup, verify-setup, send-code / resend, login,
//! expiry, tries, gateways missing or failing.

mod common;

use common::*;
use serde_json::json;
use tfa_core::contract::outbox::{Delivery, SmtpTls};
use tfa_core::testing::{test_config, DeliveryMode, Harness, MemoryStore};

fn enable_sms(h: &mut Harness, u: &User) {
    let resp = h.call(bearer(
        post(
            "/2fa/sms/setup",
            json!({ "phoneNumber": "+1 (555) 123-4567" }),
        ),
        &u.access,
    ));
    assert_eq!(
        data(&resp),
        json!({ "phoneNumber": "+155****4567", "codeSent": true, "message": "Verification code sent to +155****4567" })
    );
    let code = h.last_code().unwrap();
    let resp = h.call(bearer(
        post("/2fa/sms/verify-setup", json!({ "code": code })),
        &u.access,
    ));
    assert_eq!(
        data(&resp),
        json!({ "enabled": true, "method": "sms", "phoneNumber": "+155****4567" })
    );
}

#[test]
fn sms_setup_sends_a_twilio_request() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    enable_sms(&mut h, &u);
    let Delivery::Sms(call) = &h.deliveries[0] else {
        panic!("expected an SMS")
    };
    assert_eq!(call.method, "POST");
    assert_eq!(
        call.url,
        "http://127.0.0.1:9/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Messages.json"
    );
    let header = |n: &str| {
        call.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(header("content-length"), Some(call.body.len().to_string()));
    // Basic base64("AC0123456789abcdef0123456789abcdef:twilio-token")
    assert_eq!(
        header("authorization").as_deref(),
        Some("Basic QUMwMTIzNDU2Nzg5YWJjZGVmMDEyMzQ1Njc4OWFiY2RlZjp0d2lsaW8tdG9rZW4=")
    );
    let body = String::from_utf8(call.body.clone()).unwrap();
    assert!(body.starts_with("To=%2B15551234567&From=%2B15550000000&Body=Your%20TwoFactorAuth%20verification%20code%20is%20"), "{body}");
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["methods"], json!(["sms"]));
    let methods = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    assert_eq!(methods["methods"][0]["phoneNumber"], "+155****4567");
}

#[test]
fn email_setup_and_login_by_email_code() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    let resp = h.call(bearer(
        post(
            "/2fa/email/setup",
            json!({ "email": "Bob.Second@Example.org" }),
        ),
        &u.access,
    ));
    assert_eq!(data(&resp)["email"], "bob***@example.org");
    let Delivery::Email(m) = h.deliveries.last().unwrap().clone() else {
        panic!("expected e-mail")
    };
    assert_eq!(
        (m.host.as_str(), m.port, m.tls.clone()),
        ("127.0.0.1", 2525, SmtpTls::StartTlsIfOffered)
    );
    assert_eq!(m.to, "bob.second@example.org");
    assert_eq!(m.from, "noreply@example.com");
    assert!(m.html.contains(&h.last_code().unwrap()));
    let resp = h.call(bearer(
        post(
            "/2fa/email/verify-setup",
            json!({ "code": h.last_code().unwrap() }),
        ),
        &u.access,
    ));
    assert_eq!(
        data(&resp),
        json!({ "enabled": true, "method": "email", "email": "bob***@example.org" })
    );

    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let resp = h.call(post(
        "/2fa/send-code",
        json!({ "tempToken": temp, "method": "email" }),
    ));
    assert_eq!(
        data(&resp),
        json!({ "codeSent": true, "method": "email", "expiresIn": 300 })
    );
    let code = h.last_code().unwrap();
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": code }),
    ));
    assert!(data(&resp)["accessToken"].is_string());
    // Single use.
    let temp = temp_token(&mut h, &u, "192.0.2.2");
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code }),
        )),
        400,
        "Invalid verification code",
    );
}

#[test]
fn sms_login_resend_and_expiry() {
    let mut h = Harness::new();
    let u = register(&mut h, "carol");
    enable_sms(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let resp = h.call(post(
        "/2fa/send-code",
        json!({ "tempToken": temp, "method": "sms" }),
    ));
    assert_eq!(resp.status, 200);
    let first = h.last_code().unwrap();
    let resp = h.call(post(
        "/2fa/resend",
        json!({ "tempToken": temp, "method": "sms" }),
    ));
    assert_eq!(
        data(&resp),
        json!({ "codeSent": true, "method": "sms", "expiresIn": 300 })
    );
    let second = h.last_code().unwrap();
    if first != second {
        // A resend replaces the earlier code.
        assert_error(
            &h.call(post(
                "/2fa/verify",
                json!({ "tempToken": temp, "code": first, "method": "sms" }),
            )),
            400,
            "Invalid verification code",
        );
    }
    // Expired at 300 s.
    h.advance_secs(299);
    let temp2 = temp_token(&mut h, &u, "192.0.2.2");
    h.call(post(
        "/2fa/send-code",
        json!({ "tempToken": temp2, "method": "sms" }),
    ));
    let fresh = h.last_code().unwrap();
    h.advance_secs(300);
    let temp3 = temp_token(&mut h, &u, "192.0.2.3");
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp3, "code": fresh }),
        )),
        400,
        "Invalid verification code",
    );
    // Within 300 s it works.
    h.call(post(
        "/2fa/send-code",
        json!({ "tempToken": temp3, "method": "sms" }),
    ));
    let code = h.last_code().unwrap();
    h.advance_secs(299);
    assert_eq!(
        h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp3, "code": code, "method": "sms" })
        ))
        .status,
        200
    );
    // An exchanged temp token sends no more codes.
    assert_error(
        &h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp3, "method": "sms" }),
        )),
        400,
        "Invalid temp token",
    );
}

#[test]
fn a_code_allows_five_wrong_tries() {
    let mut h = Harness::new();
    let u = register(&mut h, "dan");
    let resp = h.call(bearer(
        post("/2fa/sms/setup", json!({ "phoneNumber": "+447700900123" })),
        &u.access,
    ));
    assert_eq!(resp.status, 200);
    let code = h.last_code().unwrap();
    let wrong = wrong_code(&code);
    for _ in 0..5 {
        let resp = h.call(bearer(
            post("/2fa/sms/verify-setup", json!({ "code": wrong })),
            &u.access,
        ));
        assert_error(&resp, 400, "Invalid verification code");
    }
    // The code is gone after 5 wrong tries.
    let resp = h.call(bearer(
        post("/2fa/sms/verify-setup", json!({ "code": code })),
        &u.access,
    ));
    assert_error(&resp, 400, "2FA setup not initiated");
}

#[test]
fn setup_and_send_errors() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    assert_error(
        &h.call(bearer(
            post("/2fa/sms/verify-setup", json!({ "code": "123456" })),
            &u.access,
        )),
        400,
        "2FA setup not initiated",
    );
    assert_error(
        &h.call(bearer(
            post("/2fa/email/verify-setup", json!({ "code": "123456" })),
            &u.access,
        )),
        400,
        "2FA setup not initiated",
    );
    assert_error(
        &h.call(bearer(post("/2fa/sms/setup", json!({})), &u.access)),
        400,
        "Validation error: phoneNumber is required",
    );
    assert_error(
        &h.call(bearer(
            post("/2fa/sms/setup", json!({ "phoneNumber": "5551234567" })),
            &u.access,
        )),
        400,
        "Validation error: phoneNumber must be in international format, e.g. +15551234567",
    );
    assert_error(
        &h.call(bearer(
            post("/2fa/email/setup", json!({ "email": "nope" })),
            &u.access,
        )),
        400,
        "Validation error: email must be a valid e-mail address",
    );
    assert_error(
        &h.call(post(
            "/2fa/sms/setup",
            json!({ "phoneNumber": "+15551234567" }),
        )),
        401,
        "Invalid or expired token",
    );

    // send-code for a method the user has not enabled.
    let (_, _) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    assert_error(
        &h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "sms" }),
        )),
        400,
        "No 2FA method available",
    );
    assert_error(
        &h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "fax" }),
        )),
        400,
        "Validation error: method must be sms or email",
    );
    assert_error(
        &h.call(post("/2fa/send-code", json!({ "tempToken": temp }))),
        400,
        "Validation error: method is required",
    );
    assert_error(
        &h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": "bad", "method": "sms" }),
        )),
        400,
        "Invalid temp token",
    );
}

#[test]
fn gateways_not_configured_give_503() {
    let mut h = Harness::with(
        test_config(&[
            ("TWILIO_ACCOUNT_SID", ""),
            ("TWILIO_AUTH_TOKEN", ""),
            ("TWILIO_PHONE_NUMBER", ""),
            ("EMAIL_HOST", ""),
        ]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "fay");
    assert_error(
        &h.call(bearer(
            post("/2fa/sms/setup", json!({ "phoneNumber": "+15551234567" })),
            &u.access,
        )),
        503,
        "SMS service not configured",
    );
    assert_error(
        &h.call(bearer(
            post("/2fa/email/setup", json!({ "email": "fay@example.com" })),
            &u.access,
        )),
        503,
        "Email service not configured",
    );
    assert!(h.deliveries.is_empty());
}

#[test]
fn failed_delivery_withdraws_the_code_and_refunds_the_slot() {
    let mut h = Harness::new();
    let u = register(&mut h, "gil");
    enable_sms(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    h.delivery_mode = DeliveryMode::Fail;
    for _ in 0..7 {
        let resp = h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "sms" }),
        ));
        assert_error(&resp, 503, "Failed to send verification code");
    }
    let withdrawn = h.last_code().unwrap();
    assert!(h.log.iter().any(|l| l.contains("sms delivery failed")));
    h.delivery_mode = DeliveryMode::Succeed;
    // Failures did not use up the 5-per-hour allowance.
    let resp = h.call(post(
        "/2fa/send-code",
        json!({ "tempToken": temp, "method": "sms" }),
    ));
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header_value("x-ratelimit-remaining"), Some("4"));
    let code = h.last_code().unwrap();
    if code != withdrawn {
        let resp = h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": withdrawn }),
        ));
        assert_error(&resp, 400, "Invalid verification code");
    }
    assert_eq!(
        h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code })
        ))
        .status,
        200
    );
}

#[test]
fn failed_resend_keeps_the_code_already_sent() {
    let mut h = Harness::new();
    let u = register(&mut h, "gwen");
    enable_sms(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let send = |h: &mut Harness| {
        h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "sms" }),
        ))
    };
    assert_eq!(send(&mut h).status, 200);
    let first = h.last_code().unwrap();
    h.delivery_mode = DeliveryMode::Fail;
    assert_error(&send(&mut h), 503, "Failed to send verification code");
    let undelivered = h.last_code().unwrap();
    h.delivery_mode = DeliveryMode::Succeed;
    if undelivered != first {
        assert_error(
            &h.call(post(
                "/2fa/verify",
                json!({ "tempToken": temp, "code": undelivered }),
            )),
            400,
            "Invalid verification code",
        );
    }
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": first }),
    ));
    assert_eq!(resp.status, 200, "{:?}", resp.json());
}

#[test]
fn sms_send_limit_is_five_per_hour_per_user() {
    let mut h = Harness::new();
    let u = register(&mut h, "hank");
    enable_sms(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    for i in 0..5 {
        let resp = h.call(
            post(
                "/2fa/send-code",
                json!({ "tempToken": temp, "method": "sms" }),
            )
            .peer(&format!("192.0.2.{i}")),
        );
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header_value("x-ratelimit-limit"), Some("5"));
    }
    let resp = h.call(
        post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "sms" }),
        )
        .peer("192.0.2.99"),
    );
    assert_error(&resp, 429, "Too many requests. Please try again later.");
    assert_eq!(resp.header_value("x-ratelimit-remaining"), Some("0"));
    h.advance_secs(3600);
    let temp = temp_token(&mut h, &u, "192.0.2.100");
    assert_eq!(
        h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": temp, "method": "sms" })
        ))
        .status,
        200
    );
}

#[test]
fn delete_method_by_id_keeps_the_last_one() {
    let mut h = Harness::new();
    let u = register(&mut h, "ivy");
    enable_sms(&mut h, &u);
    enable_totp(&mut h, &u);
    let methods = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    let list = methods["methods"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    let sms_id = list.iter().find(|m| m["type"] == "sms").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let totp_id = list.iter().find(|m| m["type"] == "totp").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        data(&h.call(bearer(delete(&format!("/2fa/methods/{sms_id}")), &u.access)))["message"],
        "2FA method removed"
    );
    assert_error(
        &h.call(bearer(
            delete(&format!("/2fa/methods/{totp_id}")),
            &u.access,
        )),
        400,
        "Cannot remove the last 2FA method while 2FA is enabled",
    );
    assert_eq!(
        data(&h.call(bearer(get("/auth/me"), &u.access)))["methods"],
        json!(["totp"])
    );
}
