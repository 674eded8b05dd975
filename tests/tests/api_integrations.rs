//! Deliveries through the real component: SMS through a fake Twilio at the
//! HTTP boundary (the real API cannot be reached from here), webhooks to a
//! real receiver that checks signatures; gateways that fail, refuse or never
//! answer.

use std::time::Duration;

use base64::Engine;
use e2e::api::*;
use e2e::client::Client;
use e2e::fake::{FakeServer, Received, HANG};
use e2e::procs::{Host, HostOptions};
use serde_json::{json, Value};
use tfa_core::plumbing::ratelimit;

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
    // Counts the hourly send allowance from start to end.
    within_one_rate_window(ratelimit::SEND_SMS, 90);
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

fn twilio_env(base: &str) -> Vec<(String, String)> {
    vec![
        (
            "TWILIO_ACCOUNT_SID".into(),
            "AC0123456789abcdef0123456789abcdef".into(),
        ),
        ("TWILIO_AUTH_TOKEN".into(), "twilio-token".into()),
        ("TWILIO_PHONE_NUMBER".into(), "+15550000000".into()),
        ("TWILIO_API_BASE".into(), base.into()),
        ("ALLOWED_OUTBOUND_HOSTS".into(), base.into()),
    ]
}

fn body_code(req: &Received) -> String {
    code_in(
        &form(&req.body)
            .into_iter()
            .find(|(k, _)| k == "Body")
            .expect("Body field")
            .1,
    )
}

/// A gateway that never answers costs a 10 s wait and a clear 503, not the
/// user's allowance or the code they already have; one that refuses
/// connections fails the setup cleanly.
#[test]
fn sms_gateways_that_time_out_or_refuse_fail_cleanly() {
    // Counts the hourly send allowance from start to end.
    within_one_rate_window(ratelimit::SEND_SMS, 90);
    let twilio = FakeServer::start();
    let host = Host::start(HostOptions {
        env: twilio_env(&twilio.base()),
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "tim");
    c.post(
        "/api/2fa/sms/setup",
        &json!({ "phoneNumber": "+15551234567" }),
        Some(&u.access),
    );
    let got = twilio.wait_for(1, Duration::from_secs(10));
    let r = c.post(
        "/api/2fa/sms/verify-setup",
        &json!({ "code": body_code(&got[0]) }),
        Some(&u.access),
    );
    assert_eq!(r.data()["method"], "sms");
    let temp = temp_token(c, &u);
    let send = || {
        c.post(
            "/api/2fa/send-code",
            &json!({ "tempToken": temp, "method": "sms" }),
            None,
        )
    };
    assert_eq!(send().header("x-ratelimit-remaining"), Some("4"));
    let first = body_code(&twilio.wait_for(2, Duration::from_secs(10))[1]);
    twilio.statuses.lock().unwrap().push_back(HANG);
    send().assert_error(503, "Failed to send verification code");
    assert!(host.wait_output("timed out", Duration::from_secs(5)));
    // The failure was refunded: the next send leaves 3.
    assert_eq!(send().header("x-ratelimit-remaining"), Some("3"));
    let third = body_code(&twilio.wait_for(4, Duration::from_secs(10))[3]);
    assert_ne!(third, first);
    // The newest code logs in.
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": third }),
        None,
    );
    assert!(r.data()["accessToken"].is_string(), "{}", r.json());

    // Nothing listens at the gateway's address: setup fails, nothing pending.
    // A port with nothing listening.
    let refused = format!("http://127.0.0.1:{}", e2e::free_port());
    let host = Host::start(HostOptions {
        env: twilio_env(&refused),
        ..Default::default()
    });
    let c = &host.client;
    let v = register(c, "rita");
    c.post(
        "/api/2fa/sms/setup",
        &json!({ "phoneNumber": "+15557654321" }),
        Some(&v.access),
    )
    .assert_error(503, "Failed to send verification code");
    assert!(host.wait_output("refused", Duration::from_secs(5)));
    c.post(
        "/api/2fa/sms/verify-setup",
        &json!({ "code": "123456" }),
        Some(&v.access),
    )
    .assert_error(400, "2FA setup not initiated");
}

/// The delivery log of hook `id`, once its first delivery has `attempts`
/// attempts (bounded wait: deliveries run after the response).
fn deliveries_after(c: &Client, token: &str, id: &str, attempts: usize) -> Value {
    for _ in 0..60 {
        let log = c
            .get(&format!("/api/webhooks/{id}/deliveries"), Some(token))
            .data();
        if log["deliveries"][0]["attempts"]
            .as_array()
            .is_some_and(|a| a.len() >= attempts)
        {
            return log["deliveries"][0].clone();
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("hook {id}: fewer than {attempts} attempts recorded");
}

/// Sends `GET /health/live` (what an operator's scheduler calls) until the
/// receiver has `n` requests.
fn drive_until(c: &Client, receiver: &FakeServer, n: usize) -> Vec<Received> {
    for _ in 0..150 {
        let got = receiver.wait_for(n, Duration::from_millis(200));
        if got.len() >= n {
            return got;
        }
        assert_eq!(c.get("/api/health/live", None).status, 200);
    }
    panic!("the receiver did not get {n} requests");
}

/// A real receiver fails, then never answers, then succeeds: the same event
/// arrives three times with valid signatures, across two restarts of the
/// host (the retries are in the store), driven by `GET /health/live`. The
/// host's clock hook moves the component's clock past each back-off step
/// (30 s, then 2 min) instead of waiting for it. A second hook whose
/// receiver refuses connections keeps its delivery pending.
#[test]
fn webhook_retries_survive_restarts_until_delivered() {
    let receiver = FakeServer::start();
    // A port with nothing listening.
    let refused = format!("http://127.0.0.1:{}", e2e::free_port());
    let env = |offset_ms: u64| HostOptions {
        env: vec![
            ("WEBHOOK_ALLOW_PRIVATE".into(), "true".into()),
            (
                "ALLOWED_OUTBOUND_HOSTS".into(),
                format!("{},{refused}", receiver.base()),
            ),
            ("TFA_CLOCK_OFFSET_MS".into(), offset_ms.to_string()),
            // The test polls the delivery log; this is not about limits.
            ("RATE_LIMIT_ENABLED".into(), "false".into()),
        ],
        ..Default::default()
    };
    let host = Host::start(env(0));
    let c = &host.client;
    let u = register(c, "wes");
    let hook = c
        .post(
            "/api/webhooks",
            &json!({ "url": format!("{}/hook", receiver.base()), "events": ["user.login"] }),
            Some(&u.access),
        )
        .data();
    let secret = hook["secret"].as_str().unwrap().to_string();
    let id = hook["id"].as_str().unwrap().to_string();
    let dead = c
        .post(
            "/api/webhooks",
            &json!({ "url": format!("{refused}/hook"), "events": ["user.login"] }),
            Some(&u.access),
        )
        .data()["id"]
        .as_str()
        .unwrap()
        .to_string();
    receiver.statuses.lock().unwrap().extend([500, HANG]);

    // Attempt 1: 500, right after the login's response.
    assert_eq!(login(c, "wes").status, 200);
    receiver.wait_for(1, Duration::from_secs(10));
    let d = deliveries_after(c, &u.access, &id, 1);
    assert_eq!(d["status"], "pending");
    assert_eq!(d["attempts"][0]["statusCode"], 500);
    assert!(d["nextAttemptAt"].is_string());
    let d = deliveries_after(c, &u.access, &dead, 1);
    assert_eq!(d["status"], "pending");
    assert!(
        d["attempts"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{d}"
    );
    let data_dir = host.data_dir.clone();
    host.stop();

    // Attempt 2, after a restart and 100 s: the receiver never answers; the
    // component gives up after its 10 s first-byte limit.
    let host = Host::start(HostOptions {
        data_dir: Some(data_dir.clone()),
        ..env(100_000)
    });
    let c = &host.client;
    drive_until(c, &receiver, 2);
    let d = deliveries_after(c, &u.access, &id, 2);
    assert_eq!(d["status"], "pending", "{d}");
    assert!(
        d["attempts"][1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out")),
        "{d}"
    );
    host.stop();

    // Attempt 3, after another restart and the 2-minute step: delivered.
    let host = Host::start(HostOptions {
        data_dir: Some(data_dir),
        ..env(400_000)
    });
    let c = &host.client;
    let got = drive_until(c, &receiver, 3);
    let d = deliveries_after(c, &u.access, &id, 3);
    assert_eq!(d["status"], "succeeded", "{d}");
    assert_eq!(d["attempts"][2]["statusCode"], 201);
    assert!(d["nextAttemptAt"].is_null());

    // One event id, three times, each signed with the hook's secret.
    assert_eq!(got.len(), 3);
    let event_id = got[0].header("x-webhook-id").unwrap().to_string();
    for req in &got {
        assert_eq!(req.path, "/hook");
        assert_eq!(req.header("x-webhook-event"), Some("user.login"));
        assert_eq!(req.header("x-webhook-id"), Some(event_id.as_str()));
        let sig = req.header("x-webhook-signature").unwrap();
        assert!(tfa_core::signature::verify_signature(
            secret.as_bytes(),
            &req.body,
            sig
        ));
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(body["id"], event_id.as_str());
        assert_eq!(body["data"]["userId"], u.id.as_str());
    }
    assert_eq!(d["eventId"], event_id.as_str());
    // The signature endpoint agrees with the receiver.
    let r = c.post(
        "/api/webhooks/verify-signature",
        &json!({ "webhookId": id, "payload": String::from_utf8_lossy(&got[2].body), "signature": got[2].header("x-webhook-signature").unwrap() }),
        Some(&u.access),
    );
    assert_eq!(r.data(), json!({ "valid": true }));
    // The refusing receiver's delivery is still pending, on schedule.
    let d = deliveries_after(c, &u.access, &dead, 1);
    assert_eq!(d["status"], "pending", "{d}");
}

/// Issue #14: the TWILIO_* settings alone are enough, no
/// ALLOWED_OUTBOUND_HOSTS: the local host adds TWILIO_API_BASE to its
/// allow-list; under Spin the variable `twilio_api_base` is itself an entry
/// of `allowed_outbound_hosts`.
#[test]
fn sms_with_only_the_twilio_settings() {
    let twilio = FakeServer::start();
    let mut env = twilio_env(&twilio.base());
    env.retain(|(k, _)| k != "ALLOWED_OUTBOUND_HOSTS");
    let host = Host::start(HostOptions {
        env,
        ..Default::default()
    });
    let c = &host.client;
    let u = register(c, "sly");
    let r = c.post(
        "/api/2fa/sms/setup",
        &json!({ "phoneNumber": "+15551234567" }),
        Some(&u.access),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.json(), host.output());
    let got = twilio.wait_for(1, Duration::from_secs(10));
    assert!(!body_code(&got[0]).is_empty());
}
