//! Webhooks: registration rules, events, signed deliveries, retries on the
//! back-off schedule, the delivery log, signature verification.

mod common;

use common::*;
use serde_json::{json, Value};
use tfa_core::signature;
use tfa_core::testing::{test_config, Harness, MemoryStore};

#[test]
fn events_list_is_public() {
    let mut h = Harness::new();
    let d = data(&h.call(get("/webhooks/events")));
    assert_eq!(d["events"].as_array().unwrap().len(), 15);
    assert!(d["events"]
        .as_array()
        .unwrap()
        .contains(&json!("2fa.verified")));
}

#[test]
fn registration_rules() {
    let mut h = Harness::with(
        test_config(&[("NODE_ENV", "production")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "alice");
    let bad_urls = [
        ("http://hooks.example.com/x", "url must use https"),
        ("ftp://hooks.example.com/x", "url must use https"),
        (
            "https://localhost/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://127.0.0.1/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://10.1.2.3/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://192.168.0.10:8443/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://169.254.169.254/latest/meta-data",
            "url must not point at a private or internal address",
        ),
        (
            "https://[::1]/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://[::ffff:10.0.0.1]/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://[fd00::1]/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://metadata.google.internal/x",
            "url must not point at a private or internal address",
        ),
        (
            "https://intranet/x",
            "url must not point at a private or internal address",
        ),
        ("https://2130706433/x", "url must be a valid URL"),
        ("https://0x7f.0.0.1/x", "url must be a valid URL"),
        (
            "https://user:pw@hooks.example.com/x",
            "url must not contain credentials",
        ),
        (
            "https://hooks.example.com:99999/x",
            "url must be a valid URL",
        ),
        ("not a url", "url must be a valid URL"),
    ];
    for (url, detail) in bad_urls {
        let resp = h.call(bearer(
            post("/webhooks", json!({ "url": url, "events": ["user.login"] })),
            &u.access,
        ));
        assert_error(&resp, 400, &format!("Validation error: {detail}"));
    }
    let events_detail = "events must be a non-empty array of: user.registered, user.login, user.logout, 2fa.enabled, 2fa.disabled, 2fa.verified, 2fa.failed, backup_code.used, device.trusted, device.removed, session.revoked, webhook.test, passkey.registered, passkey.removed, passkey.counter_regression";
    for events in [
        json!([]),
        json!(["user.hacked"]),
        json!("user.login"),
        json!([1]),
    ] {
        let resp = h.call(bearer(
            post(
                "/webhooks",
                json!({ "url": "https://hooks.example.com/x", "events": events }),
            ),
            &u.access,
        ));
        assert_error(&resp, 400, &format!("Validation error: {events_detail}"));
    }
    let created = create_hook(
        &mut h,
        &u,
        json!(["user.login", "user.login", "2fa.failed"]),
    );
    assert_eq!(created["events"], json!(["user.login", "2fa.failed"]));
    let secret = created["secret"].as_str().unwrap();
    assert_eq!(secret.len(), 64);
    assert!(secret.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(created["active"], true);
    let id = created["id"].as_str().unwrap();
    let got = data(&h.call(bearer(get(&format!("/webhooks/{id}")), &u.access)));
    assert!(
        got.get("secret").is_none(),
        "the secret is shown only at creation"
    );
    let list = data(&h.call(bearer(get("/webhooks"), &u.access)));
    assert_eq!(list["webhooks"].as_array().unwrap().len(), 1);
    // Private targets are allowed when the operator says so.
    let mut h = Harness::with(
        test_config(&[("WEBHOOK_ALLOW_PRIVATE", "true")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "bob");
    let resp = h.call(bearer(
        post(
            "/webhooks",
            json!({ "url": "http://127.0.0.1:9000/hook", "events": ["user.login"] }),
        ),
        &u.access,
    ));
    assert_eq!(resp.status, 201);
}

#[test]
fn events_become_signed_deliveries() {
    let mut h = Harness::new();
    let u = register(&mut h, "carol");
    let hook = create_hook(&mut h, &u, json!(["user.login", "2fa.enabled"]));
    let secret = hook["secret"].as_str().unwrap().to_string();
    assert!(h.webhook_calls.is_empty());
    login(&mut h, "carol", "192.0.2.1");
    assert_eq!(h.webhook_calls.len(), 1);
    let call = h.webhook_calls[0].clone();
    assert_eq!(call.call.method, "POST");
    assert_eq!(call.call.url, "https://hooks.example.com/tfa");
    assert_eq!(header(&call, "content-type"), "application/json");
    assert_eq!(header(&call, "x-webhook-event"), "user.login");
    let body: Value = serde_json::from_slice(&call.call.body).unwrap();
    assert_eq!(body["event"], "user.login");
    assert_eq!(body["id"], header(&call, "x-webhook-id"));
    assert_eq!(body["timestamp"], header(&call, "x-webhook-timestamp"));
    assert_eq!(body["data"]["userId"], u.id.as_str());
    // Signature: HMAC-SHA-256 keyed by the secret's 64 characters as bytes.
    let sig = header(&call, "x-webhook-signature");
    assert_eq!(
        sig,
        signature::sign_payload(secret.as_bytes(), &call.call.body)
    );
    assert!(signature::verify_signature(
        secret.as_bytes(),
        &call.call.body,
        sig
    ));
    // Nothing for unsubscribed events.
    h.call(bearer(post("/auth/logout", json!({})), &u.access));
    assert_eq!(h.webhook_calls.len(), 1);
    // 2fa.enabled fires on verify-setup.
    let v = data(&login(&mut h, "carol", "192.0.2.2"));
    let access = v["accessToken"].as_str().unwrap().to_string();
    let u2 = User { access, ..u };
    enable_totp(&mut h, &u2);
    assert_eq!(
        h.webhook_calls
            .last()
            .map(|c| header(c, "x-webhook-event").to_string()),
        Some("2fa.enabled".into())
    );
    let id = hook["id"].as_str().unwrap();
    let log = data(&h.call(bearer(
        get(&format!("/webhooks/{id}/deliveries")),
        &u2.access,
    )));
    let deliveries = log["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 3);
    assert_eq!(deliveries[0]["event"], "2fa.enabled");
    assert_eq!(deliveries[0]["status"], "succeeded");
    assert_eq!(deliveries[0]["attempts"][0]["statusCode"], 200);
}

#[test]
fn failed_deliveries_are_retried_on_the_back_off_schedule() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    let hook = create_hook(&mut h, &u, json!(["webhook.test"]));
    let id = hook["id"].as_str().unwrap().to_string();
    h.webhook_answers
        .extend([Ok(500), Err("connection refused".to_string())]);
    let resp = h.call(bearer(
        post(&format!("/webhooks/{id}/test"), json!({})),
        &u.access,
    ));
    assert_eq!(data(&resp)["message"], "Test event queued");
    assert_eq!(h.webhook_calls.len(), 1);
    // Not due before 30 s; due within one 30 s queue bucket after.
    h.advance_secs(20);
    h.call(get("/health/live"));
    assert_eq!(h.webhook_calls.len(), 1);
    h.advance_secs(40);
    h.call(get("/health/live"));
    assert_eq!(h.webhook_calls.len(), 2);
    // Second retry 2 minutes after the first retry: succeeds.
    h.advance_secs(100);
    h.call(get("/health/live"));
    assert_eq!(h.webhook_calls.len(), 2);
    h.advance_secs(50);
    h.call(get("/health/live"));
    assert_eq!(h.webhook_calls.len(), 3);
    // The same event id and a valid signature every time.
    let ids: Vec<&str> = h
        .webhook_calls
        .iter()
        .map(|c| header(c, "x-webhook-id"))
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]));
    let secret = hook["secret"].as_str().unwrap();
    for c in &h.webhook_calls {
        assert!(signature::verify_signature(
            secret.as_bytes(),
            &c.call.body,
            header(c, "x-webhook-signature")
        ));
    }
    let log = data(&h.call(bearer(
        get(&format!("/webhooks/{id}/deliveries")),
        &u.access,
    )));
    let d = &log["deliveries"][0];
    assert_eq!(d["status"], "succeeded");
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[0]["statusCode"], 500);
    assert_eq!(attempts[1]["error"], "connection refused");
    assert_eq!(attempts[2]["statusCode"], 200);
    // Nothing more is sent.
    h.advance_secs(7 * 3600);
    for _ in 0..50 {
        h.advance_secs(600);
        h.call(get("/health/live"));
    }
    assert_eq!(h.webhook_calls.len(), 3);
}

#[test]
fn a_delivery_is_given_up_after_five_retries_and_hooks_disable_after_twenty_failures() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    let hook = create_hook(&mut h, &u, json!(["webhook.test"]));
    let id = hook["id"].as_str().unwrap().to_string();
    h.webhook_answers.extend(std::iter::repeat_n(Ok(503), 100));
    let mut n = 0;
    let mut fresh_access = |h: &mut Harness| {
        n += 1;
        data(&login(h, "erin", &format!("192.0.2.{n}")))["accessToken"]
            .as_str()
            .unwrap()
            .to_string()
    };
    h.call(bearer(
        post(&format!("/webhooks/{id}/test"), json!({})),
        &u.access,
    ));
    for _ in 0..(8 * 60) {
        h.advance_secs(60);
        h.call(get("/health/live"));
    }
    assert_eq!(h.webhook_calls.len(), 6, "first attempt and five retries");
    assert!(h
        .log
        .iter()
        .any(|l| l.contains("given up after 6 attempts")));
    let access = fresh_access(&mut h);
    let log = data(&h.call(bearer(get(&format!("/webhooks/{id}/deliveries")), &access)));
    assert_eq!(log["deliveries"][0]["status"], "failed");
    // Three more failing test events (18 more attempts) pass 20 failures in a row.
    for _ in 0..3 {
        let access = fresh_access(&mut h);
        h.call(bearer(
            post(&format!("/webhooks/{id}/test"), json!({})),
            &access,
        ));
        for _ in 0..(8 * 60) {
            h.advance_secs(60);
            h.call(get("/health/live"));
        }
    }
    let access = fresh_access(&mut h);
    let got = data(&h.call(bearer(get(&format!("/webhooks/{id}")), &access)));
    assert_eq!(got["active"], false);
    assert!(h
        .log
        .iter()
        .any(|l| l.contains("disabled after 20 consecutive failures")));
}

#[test]
fn verify_signature_endpoint_and_deletion() {
    let mut h = Harness::new();
    let u = register(&mut h, "fay");
    let hook = create_hook(&mut h, &u, json!(["user.login"]));
    let id = hook["id"].as_str().unwrap().to_string();
    let secret = hook["secret"].as_str().unwrap().to_string();
    let payload = r#"{"id":"1","event":"user.login"}"#;
    let sig = signature::sign_payload(secret.as_bytes(), payload.as_bytes());
    for s in [
        sig.clone(),
        sig.trim_start_matches("sha256=").to_string(),
        sig.to_uppercase().replace("SHA256=", ""),
    ] {
        let resp = h.call(bearer(
            post(
                "/webhooks/verify-signature",
                json!({ "webhookId": id, "payload": payload, "signature": s }),
            ),
            &u.access,
        ));
        assert_eq!(data(&resp), json!({ "valid": true }));
    }
    for s in ["sha256=00", "", "sha1=abc"] {
        let resp = h.call(bearer(
            post(
                "/webhooks/verify-signature",
                json!({ "webhookId": id, "payload": payload, "signature": s }),
            ),
            &u.access,
        ));
        if s.is_empty() {
            assert_error(&resp, 400, "Validation error: signature is required");
        } else {
            assert_error(&resp, 400, "Invalid webhook signature");
        }
    }
    let resp = h.call(bearer(
        post(
            "/webhooks/verify-signature",
            json!({ "webhookId": id, "payload": format!("{payload} "), "signature": sig }),
        ),
        &u.access,
    ));
    assert_error(&resp, 400, "Invalid webhook signature");
    login(&mut h, "fay", "192.0.2.1");
    assert_eq!(
        data(&h.call(bearer(delete(&format!("/webhooks/{id}")), &u.access)))["message"],
        "Webhook deleted"
    );
    assert_error(
        &h.call(bearer(get(&format!("/webhooks/{id}")), &u.access)),
        404,
        "Resource not found",
    );
    assert!(
        !h.store.keys().iter().any(|k| k.starts_with("whd:")),
        "deliveries deleted with the hook"
    );
    login(&mut h, "fay", "192.0.2.2");
    assert_eq!(h.webhook_calls.len(), 1);
    // Another user's hook is not found.
    let v = register(&mut h, "gus");
    let other = create_hook(&mut h, &v, json!(["user.login"]));
    let other_id = other["id"].as_str().unwrap();
    assert_error(
        &h.call(bearer(get(&format!("/webhooks/{other_id}")), &u.access)),
        404,
        "Resource not found",
    );
}

#[test]
fn a_retry_interrupted_by_a_store_failure_is_not_lost() {
    use tfa_core::testing::FailingStore;
    // Fail the n-th store operation of the request during which the retry
    // comes due, for every n; once the store is back, the retry still goes out.
    for n in 1..40 {
        let mut h = Harness::with(test_config(&[]), FailingStore::new(MemoryStore::new()));
        let u = register(&mut h, "rita");
        let resp = h.call(bearer(
            post(
                "/webhooks",
                json!({ "url": "https://hooks.example.com/tfa", "events": ["webhook.test"] }),
            ),
            &u.access,
        ));
        let id = data(&resp)["id"].as_str().unwrap().to_string();
        h.webhook_answers.push_back(Ok(500));
        h.call(bearer(
            post(&format!("/webhooks/{id}/test"), json!({})),
            &u.access,
        ));
        assert_eq!(h.webhook_calls.len(), 1);
        h.advance_secs(60);
        h.store.fail_after(n);
        h.call(get("/health/live"));
        h.store.disarm();
        for _ in 0..3 {
            h.advance_secs(30);
            h.call(get("/health/live"));
        }
        assert_eq!(
            h.webhook_calls.len(),
            2,
            "failure at op {n}: the retry was lost or doubled"
        );
    }
}

/// `pending_deliveries` (what hosts export as a metric): a failing
/// delivery stays pending through its retries, leaves on success or when
/// given up, and pending deliveries removed with their hook or by the
/// retention limit leave too, each counted once.
#[test]
fn pending_deliveries_are_counted_until_they_settle() {
    use tfa_core::api::webhooks::{pending_deliveries, KEEP_DELIVERIES};
    use tfa_core::Store as _;
    let mut h = Harness::with(
        test_config(&[("RATE_LIMIT_ENABLED", "false")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "pam");
    let hook = create_hook(&mut h, &u, json!(["webhook.test"]));
    let id = hook["id"].as_str().unwrap().to_string();
    let pending = |h: &Harness| pending_deliveries(|k| h.store.increment(k, 0)).unwrap();
    let access = |h: &mut Harness| {
        data(&login(h, "pam", "192.0.2.9"))["accessToken"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let test_event = |h: &mut Harness| {
        let token = access(h);
        let resp = h.call(bearer(
            post(&format!("/webhooks/{id}/test"), json!({})),
            &token,
        ));
        assert_eq!(resp.status, 200);
    };
    assert_eq!(pending(&h), 0);

    // Fails once (pending, queued for 30 s), then succeeds.
    h.webhook_answers.push_back(Ok(500));
    test_event(&mut h);
    assert_eq!(pending(&h), 1);
    h.advance_secs(60);
    h.call(get("/health/live"));
    assert_eq!(h.webhook_calls.len(), 2);
    assert_eq!(pending(&h), 0);

    // Given up after six failed attempts.
    h.webhook_answers.extend(std::iter::repeat_n(Ok(503), 6));
    test_event(&mut h);
    assert_eq!(pending(&h), 1);
    for _ in 0..(8 * 60) {
        h.advance_secs(60);
        h.call(get("/health/live"));
    }
    assert_eq!(h.webhook_calls.len(), 8);
    assert_eq!(pending(&h), 0);

    // Three pending, then the retention limit pushes out the oldest ones
    // (the rest succeed at once): each left once.
    h.webhook_answers.extend(std::iter::repeat_n(Ok(503), 3));
    for _ in 0..3 {
        test_event(&mut h);
    }
    assert_eq!(pending(&h), 3);
    for _ in 0..KEEP_DELIVERIES {
        test_event(&mut h);
    }
    assert_eq!(pending(&h), 0);

    // Two pending, then the hook is deleted with its delivery log.
    h.webhook_answers.extend(std::iter::repeat_n(Ok(503), 2));
    test_event(&mut h);
    test_event(&mut h);
    assert_eq!(pending(&h), 2);
    let token = access(&mut h);
    let resp = h.call(bearer(delete(&format!("/webhooks/{id}")), &token));
    assert_eq!(resp.status, 200);
    assert_eq!(pending(&h), 0);
    // A late result for a removed delivery changes nothing.
    h.service.webhook_result(
        &mut tfa_core::Env {
            store: &h.store,
            rng: &mut tfa_core::testing::SeededRng::new(1),
            now_ms: h.now_ms,
        },
        "00000000-0000-4000-8000-000000000000",
        Ok(200),
    );
    assert_eq!(pending(&h), 0);
}
