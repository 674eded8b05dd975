//! Rate limits, their headers, and the per-account second-factor lock.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::{test_config, Harness, MemoryStore};
use tfa_core::Request;

#[test]
fn login_limit_is_five_per_fifteen_minutes_per_ip_with_headers() {
    let mut h = Harness::new();
    register(&mut h, "alice");
    for i in 1..=5u32 {
        let resp = login(&mut h, "alice", "192.0.2.10");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header_value("x-ratelimit-limit"), Some("5"));
        assert_eq!(
            resp.header_value("x-ratelimit-remaining"),
            Some((5 - i).to_string().as_str())
        );
        let reset: u64 = resp
            .header_value("x-ratelimit-reset")
            .unwrap()
            .parse()
            .unwrap();
        assert!(reset > now_secs(&h) && reset <= now_secs(&h) + 900);
    }
    let resp = login(&mut h, "alice", "192.0.2.10");
    assert_error(&resp, 429, "Too many requests. Please try again later.");
    assert_eq!(resp.header_value("x-ratelimit-remaining"), Some("0"));
    let retry: u64 = resp.header_value("retry-after").unwrap().parse().unwrap();
    assert!((1..=900).contains(&retry));
    // Another IP is counted apart.
    assert_eq!(login(&mut h, "alice", "192.0.2.11").status, 200);
    // The window ends.
    h.advance_secs(retry);
    assert_eq!(login(&mut h, "alice", "192.0.2.10").status, 200);
}

#[test]
fn register_limit_and_x_forwarded_for_only_with_trust_proxy() {
    let mut h = Harness::new();
    for i in 0..5 {
        let resp = h.call(
            post("/auth/register", json!({ "email": format!("u{i}@example.com"), "username": format!("user{i}"), "password": PASSWORD }))
                .peer("192.0.2.1")
                .header("X-Forwarded-For", &format!("10.0.0.{i}")),
        );
        assert_eq!(resp.status, 201);
    }
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": "u9@example.com", "username": "user9", "password": PASSWORD }),
        )
        .peer("192.0.2.1")
        .header("X-Forwarded-For", "10.0.0.9"),
    );
    assert_error(&resp, 429, "Too many requests. Please try again later.");

    // Behind a trusted proxy (peer 192.0.2.1), which appends the address it
    // saw: each real client has its own window…
    let mut h = Harness::with(test_config(&[("TRUST_PROXY", "true")]), MemoryStore::new());
    for i in 0..6 {
        let resp = h.call(
            post("/auth/register", json!({ "email": format!("u{i}@example.com"), "username": format!("user{i}"), "password": PASSWORD }))
                .peer("192.0.2.1")
                .header("X-Forwarded-For", &format!("203.0.113.{i}")),
        );
        assert_eq!(resp.status, 201, "each forwarded client has its own window");
    }
    // …and one client cannot make up new ones by sending its own
    // X-Forwarded-For (the proxy appends the real address), in one header
    // line or several.
    for i in 0..6 {
        let mut req = post("/auth/register", json!({ "email": format!("s{i}@example.com"), "username": format!("spoof{i}"), "password": PASSWORD }))
            .peer("192.0.2.1");
        req = if i % 2 == 0 {
            req.header("X-Forwarded-For", &format!("10.0.0.{i}, 198.51.100.7"))
        } else {
            req.header("X-Forwarded-For", &format!("10.0.0.{i}"))
                .header("X-Forwarded-For", "198.51.100.7")
        };
        let resp = h.call(req);
        if i < 5 {
            assert_eq!(resp.status, 201);
        } else {
            assert_error(&resp, 429, "Too many requests. Please try again later.");
        }
    }
}

#[test]
fn verify_limit_is_ten_per_ip() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    enable_totp(&mut h, &u);
    for i in 0..10 {
        let temp = temp_token(&mut h, &u, &format!("192.0.2.{i}"));
        let resp = h.call(
            post(
                "/2fa/verify",
                json!({ "tempToken": temp, "code": "000000" }),
            )
            .peer("198.51.100.1"),
        );
        assert_eq!(resp.header_value("x-ratelimit-limit"), Some("10"));
        assert_ne!(resp.status, 429);
    }
    let resp = h.call(
        post("/2fa/verify", json!({ "tempToken": "x", "code": "000000" })).peer("198.51.100.1"),
    );
    assert_error(&resp, 429, "Too many requests. Please try again later.");
}

#[test]
fn refresh_limit_is_per_user() {
    let mut h = Harness::new();
    let u = register(&mut h, "carol");
    let mut token = u.refresh.clone();
    for i in 0..10 {
        let resp = h.call(
            post("/auth/refresh", json!({ "refreshToken": token })).peer(&format!("192.0.2.{i}")),
        );
        assert_eq!(resp.status, 200);
        token = data(&resp)["refreshToken"].as_str().unwrap().to_string();
    }
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": token })).peer("192.0.2.200"));
    assert_error(&resp, 429, "Too many requests. Please try again later.");
}

#[test]
fn account_locks_after_twenty_failed_second_factors() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    let (secret, _) = enable_totp(&mut h, &u);
    let mut n = 0;
    for _ in 0..4 {
        for _ in 0..5 {
            n += 1;
            let temp = temp_token(&mut h, &u, &format!("192.0.2.{n}"));
            let resp = h.call(
                post(
                    "/2fa/verify",
                    json!({ "tempToken": temp, "code": "000000" }),
                )
                .peer(&format!("198.51.100.{n}")),
            );
            if totp_code(&secret, now_secs(&h)) != "000000" {
                assert_error(&resp, 400, "Invalid verification code");
            }
        }
    }
    // 20 failures: locked, even with the right code, from a fresh IP.
    let temp = temp_token(&mut h, &u, "192.0.2.250");
    let resp = h.call(
        post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)) }),
        )
        .peer("203.0.113.250"),
    );
    assert_error(&resp, 429, "Too many requests. Please try again later.");
    h.advance_secs(15 * 60);
    let temp = temp_token(&mut h, &u, "192.0.2.251");
    let resp = h.call(
        post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)) }),
        )
        .peer("203.0.113.251"),
    );
    assert_eq!(resp.status, 200);
}

#[test]
fn rate_limits_can_be_switched_off_for_benchmarks() {
    let mut h = Harness::with(
        test_config(&[("RATE_LIMIT_ENABLED", "false")]),
        MemoryStore::new(),
    );
    register(&mut h, "erin");
    for _ in 0..20 {
        let resp = login(&mut h, "erin", "192.0.2.1");
        assert_eq!(resp.status, 200);
        assert!(resp.header_value("x-ratelimit-limit").is_none());
    }
}

#[test]
fn default_limit_applies_to_other_endpoints() {
    let mut h = Harness::new();
    let u = register(&mut h, "fred");
    for _ in 0..100 {
        assert_eq!(
            h.call(bearer(get("/auth/me"), &u.access).peer("192.0.2.9"))
                .status,
            200
        );
    }
    let resp = h.call(bearer(get("/auth/me"), &u.access).peer("192.0.2.9"));
    assert_error(&resp, 429, "Too many requests. Please try again later.");
    // Health is not limited (probes).
    for _ in 0..150 {
        assert_eq!(
            h.call(Request::new("GET", "/api/health").peer("192.0.2.9"))
                .status,
            200
        );
    }
}
