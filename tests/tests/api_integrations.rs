//! Deliveries through the real component: SMS through a fake Twilio at the
//! HTTP boundary (the real API cannot be reached from here), webhooks to a
//! real receiver that checks signatures.

use std::time::Duration;

use base64::Engine;
use e2e::api::*;
use e2e::fake::FakeServer;
use e2e::procs::{Host, HostOptions};
use serde_json::json;

fn form(body: &[u8]) -> Vec<(String, String)> {
    let s = String::from_utf8_lossy(body).to_string();
    s.split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

fn code_in(text: &str) -> String {
    let after = text
        .split("verification code is ")
        .nth(1)
        .expect("a code in the message");
    after.chars().take(6).collect()
}

#[test]
fn sms_codes_through_the_twilio_api() {
    let twilio = FakeServer::start();
    let host = Host::start(HostOptions {
        env: vec![
            (
                "TWILIO_ACCOUNT_SID".into(),
                "AC0123456789abcdef0123456789abcdef".into(),
            ),
            ("TWILIO_AUTH_TOKEN".into(), "twilio-token".into()),
            ("TWILIO_PHONE_NUMBER".into(), "+15550000000".into()),
            ("TWILIO_API_BASE".into(), twilio.base()),
            ("ALLOWED_OUTBOUND_HOSTS".into(), twilio.base()),
        ],
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "sam");
    let r = c.post(
        "/api/2fa/sms/setup",
        &json!({ "phoneNumber": "+15551234567" }),
        Some(&u.access),
    );
    assert_eq!(r.data()["phoneNumber"], "+155****4567");
    let got = twilio.wait_for(1, Duration::from_secs(10));
    let req = &got[0];
    // Exactly as Twilio documents the Messages resource.
    assert_eq!(req.method, "POST");
    assert_eq!(
        req.path,
        "/2010-04-01/Accounts/AC0123456789abcdef0123456789abcdef/Messages.json"
    );
    assert_eq!(
        req.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(
        req.header("content-length"),
        Some(req.body.len().to_string().as_str())
    );
    assert!(req.header("transfer-encoding").is_none(), "not chunked");
    let basic = base64::engine::general_purpose::STANDARD
        .encode("AC0123456789abcdef0123456789abcdef:twilio-token");
    assert_eq!(
        req.header("authorization"),
        Some(format!("Basic {basic}").as_str())
    );
    let f = form(&req.body);
    let field = |k: &str| {
        f.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(field("To"), "+15551234567");
    assert_eq!(field("From"), "+15550000000");
    let code = code_in(&field("Body"));
    let r = c.post(
        "/api/2fa/sms/verify-setup",
        &json!({ "code": code }),
        Some(&u.access),
    );
    assert_eq!(r.data()["method"], "sms");

    // Login with an SMS code; a gateway failure is a clear 503 and does not
    // use up the allowance.
    let temp = temp_token(c, &u);
    twilio.statuses.lock().unwrap().push_back(500);
    c.post(
        "/api/2fa/send-code",
        &json!({ "tempToken": temp, "method": "sms" }),
        None,
    )
    .assert_error(503, "Failed to send verification code");
    let r = c.post(
        "/api/2fa/send-code",
        &json!({ "tempToken": temp, "method": "sms" }),
        None,
    );
    assert_eq!(
        r.data(),
        json!({ "codeSent": true, "method": "sms", "expiresIn": 300 })
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    let got = twilio.wait_for(3, Duration::from_secs(10));
    let code = code_in(
        &form(&got[2].body)
            .into_iter()
            .find(|(k, _)| k == "Body")
            .unwrap()
            .1,
    );
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": code }),
        None,
    );
    assert!(r.data()["accessToken"].is_string());
}

#[test]
fn webhooks_are_signed_and_delivered_after_the_response() {
    let receiver = FakeServer::start();
    let host = Host::start(HostOptions {
        env: vec![
            ("WEBHOOK_ALLOW_PRIVATE".into(), "true".into()),
            ("ALLOWED_OUTBOUND_HOSTS".into(), receiver.base()),
        ],
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "wes");
    let hook = c
        .post("/api/webhooks", &json!({ "url": format!("{}/hook", receiver.base()), "events": ["user.login", "webhook.test"] }), Some(&u.access))
        .data();
    let secret = hook["secret"].as_str().unwrap().to_string();
    // The receiver fails the first attempt; the delivery log shows it.
    receiver.statuses.lock().unwrap().push_back(500);
    assert_eq!(login(c, "wes").status, 200);
    let got = receiver.wait_for(1, Duration::from_secs(10));
    let req = &got[0];
    assert_eq!(req.path, "/hook");
    assert_eq!(req.header("x-webhook-event"), Some("user.login"));
    let sig = req.header("x-webhook-signature").unwrap();
    assert!(tfa_core::signature::verify_signature(
        secret.as_bytes(),
        &req.body,
        sig
    ));
    let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["id"], req.header("x-webhook-id").unwrap());
    assert_eq!(body["data"]["userId"], u.id.as_str());
    let id = hook["id"].as_str().unwrap();
    let log = c
        .get(&format!("/api/webhooks/{id}/deliveries"), Some(&u.access))
        .data();
    let d = &log["deliveries"][0];
    assert_eq!(d["status"], "pending");
    assert_eq!(d["attempts"][0]["statusCode"], 500);
    assert!(d["nextAttemptAt"].is_string());
    // The signature endpoint agrees with the receiver.
    let r = c.post(
        "/api/webhooks/verify-signature",
        &json!({ "webhookId": id, "payload": String::from_utf8_lossy(&req.body), "signature": sig }),
        Some(&u.access),
    );
    assert_eq!(r.data(), json!({ "valid": true }));
}
