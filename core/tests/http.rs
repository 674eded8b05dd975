//! The HTTP surface: routing, 404/405/413, the envelope, security headers,
//! CORS, malformed bodies, health, the base path, store failures.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::{test_config, FailingStore, Harness, MemoryStore};
use tfa_core::Request;

#[test]
fn unknown_routes_and_wrong_methods() {
    let mut h = Harness::new();
    for path in [
        "/api/nope",
        "/api",
        "/api/",
        "/auth/login",
        "/api/auth/login/x",
        "/api//auth/login",
        "/",
    ] {
        assert_error(
            &h.call(Request::new("POST", path).json("{}")),
            404,
            "Resource not found",
        );
    }
    let resp = h.call(get("/auth/login"));
    assert_error(&resp, 405, "Method not allowed");
    assert_eq!(resp.header_value("allow"), Some("POST"));
    let resp = h.call(Request::new("PUT", "/api/2fa/devices"));
    assert_eq!(resp.header_value("allow"), Some("GET, DELETE"));
    // A trailing slash and a query string are fine.
    assert_eq!(h.call(Request::new("GET", "/api/health/?x=1")).status, 200);
}

#[test]
fn every_response_carries_security_headers() {
    let mut h = Harness::new();
    for resp in [
        h.call(get("/health")),
        h.call(get("/nope")),
        h.call(post("/auth/login", json!({}))),
    ] {
        assert_eq!(resp.header_value("x-content-type-options"), Some("nosniff"));
        assert_eq!(resp.header_value("x-frame-options"), Some("DENY"));
        assert_eq!(resp.header_value("referrer-policy"), Some("no-referrer"));
        assert_eq!(
            resp.header_value("content-security-policy"),
            Some("default-src 'none'; frame-ancestors 'none'")
        );
        assert_eq!(resp.header_value("cache-control"), Some("no-store"));
        assert!(resp.header_value("strict-transport-security").is_none());
        assert!(resp
            .header_value("content-type")
            .is_none_or(|c| c.starts_with("application/json")));
    }
}

#[test]
fn production_adds_hsts_and_secure_cookies() {
    let mut h = Harness::with(
        test_config(&[("NODE_ENV", "production")]),
        MemoryStore::new(),
    );
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": "a@example.com", "username": "abc", "password": PASSWORD }),
    ));
    assert_eq!(resp.status, 201);
    assert!(resp
        .header_value("strict-transport-security")
        .unwrap()
        .starts_with("max-age="));
    assert!(resp
        .header_value("set-cookie")
        .unwrap()
        .ends_with("; Secure"));
}

#[test]
fn body_limits_and_malformed_bodies() {
    let mut h = Harness::new();
    let big = format!("{{\"email\":\"{}\"}}", "a".repeat(64 * 1024));
    assert_error(
        &h.call(Request::new("POST", "/api/auth/register").json(&big)),
        413,
        "Request body too large",
    );
    let bad_bodies: Vec<Vec<u8>> = vec![
        b"[]".to_vec(),
        b"\"str\"".to_vec(),
        b"{".to_vec(),
        b"null".to_vec(),
        vec![0xff, 0xfe, b'{', b'}'],
        format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        b"{\"a\": 1e999999}".to_vec(),
    ];
    for (i, body) in bad_bodies.into_iter().enumerate() {
        let mut req = Request::new("POST", "/api/auth/login")
            .header("content-type", "application/json")
            .peer(&format!("192.0.2.{i}"));
        req.body = body;
        assert_error(
            &h.call(req),
            400,
            "Validation error: body must be a JSON object",
        );
    }
    let req = Request::new("POST", "/api/auth/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .peer("192.0.2.50");
    let mut req = req;
    req.body = b"emailOrUsername=a&password=b".to_vec();
    assert_error(
        &h.call(req),
        400,
        "Validation error: body must be a JSON object",
    );
    // Wrong types.
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": ["a"], "password": "x" }),
        )
        .peer("192.0.2.51"),
    );
    assert_error(
        &resp,
        400,
        "Validation error: emailOrUsername must be a string",
    );
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "a", "password": 12345678 }),
        )
        .peer("192.0.2.52"),
    );
    assert_error(&resp, 400, "Validation error: password must be a string");
}

#[test]
fn cors_allows_only_listed_origins() {
    let mut h = Harness::new();
    let resp = h.call(get("/health").header("Origin", "https://app.example.com"));
    assert_eq!(
        resp.header_value("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        resp.header_value("access-control-allow-credentials"),
        Some("true")
    );
    assert_eq!(resp.header_value("vary"), Some("Origin"));
    let resp = h.call(get("/health").header("Origin", "https://evil.example"));
    assert!(resp.header_value("access-control-allow-origin").is_none());
    // Preflight.
    let resp = h.call(
        Request::new("OPTIONS", "/api/auth/login")
            .header("Origin", "https://app.example.com")
            .header("Access-Control-Request-Method", "POST"),
    );
    assert_eq!(resp.status, 204);
    assert_eq!(
        resp.header_value("access-control-allow-methods"),
        Some("POST, OPTIONS")
    );
    assert!(resp
        .header_value("access-control-allow-headers")
        .unwrap()
        .contains("Authorization"));
    assert_eq!(
        resp.header_value("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let resp =
        h.call(Request::new("OPTIONS", "/api/auth/login").header("Origin", "https://evil.example"));
    assert_eq!(resp.status, 204);
    assert!(resp.header_value("access-control-allow-origin").is_none());
    assert!(resp.header_value("access-control-allow-methods").is_none());
    assert_error(
        &h.call(Request::new("OPTIONS", "/api/nope")),
        404,
        "Resource not found",
    );
}

#[test]
fn health_variants() {
    let mut h = Harness::new();
    let resp = h.call(get("/health"));
    assert_eq!(resp.status, 200);
    let v = resp.json();
    assert_eq!(v["status"], "healthy");
    assert_eq!(v["checks"], json!({ "database": "up", "redis": "up" }));
    assert_eq!(v["timestamp"], "2026-01-01T00:00:00.000Z");
    assert!(v["version"].is_string());
    assert!(v.get("success").is_none(), "health is not wrapped");
    assert_eq!(h.call(get("/health/live")).status, 200);
    assert_eq!(h.call(get("/health/ready")).status, 200);

    let mut h = Harness::with(test_config(&[]), FailingStore::new(MemoryStore::new()));
    h.store.fail_after(1);
    let resp = h.call(get("/health"));
    assert_eq!(resp.status, 503);
    let v = resp.json();
    assert_eq!(v["status"], "unhealthy");
    assert_eq!(v["checks"], json!({ "database": "down", "redis": "down" }));
    assert_eq!(h.call(get("/health/ready")).status, 503);
    assert_eq!(h.call(get("/health/live")).status, 200);
}

#[test]
fn store_failure_is_503_never_500_and_loses_nothing() {
    let mut h = Harness::with(test_config(&[]), FailingStore::new(MemoryStore::new()));
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": "a@example.com", "username": "alice", "password": PASSWORD }),
    ));
    assert_eq!(resp.status, 201);
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    // Fail each operation of a login in turn.
    for n in 1..40 {
        h.store.fail_after(n);
        let resp = h.call(
            post(
                "/auth/login",
                json!({ "emailOrUsername": "alice", "password": PASSWORD }),
            )
            .peer(&format!("192.0.2.{n}")),
        );
        h.store.disarm();
        assert!(
            resp.status == 503 || resp.status == 200,
            "op {n}: {}",
            resp.status
        );
        if resp.status == 503 {
            assert_error(&resp, 503, "Service unavailable");
        }
    }
    assert_eq!(h.call(bearer(get("/auth/me"), &access)).status, 200);
    // A login that failed while holding the user record's lock could not
    // release it; the lock lapses after two lease periods.
    h.advance_secs(2 * tfa_core::plumbing::lock::LEASE_MS / 1000);
    assert_eq!(login(&mut h, "alice", "192.0.2.200").status, 200);
}

#[test]
fn a_custom_base_path() {
    let mut h = Harness::with(
        test_config(&[("API_BASE_PATH", "/v1/2fa-service/")]),
        MemoryStore::new(),
    );
    assert_eq!(
        h.call(Request::new("GET", "/v1/2fa-service/health")).status,
        200
    );
    assert_error(
        &h.call(Request::new("GET", "/api/health")),
        404,
        "Resource not found",
    );
    let resp = h.call(Request::new("POST", "/v1/2fa-service/auth/register").json(
        &json!({ "email": "a@example.com", "username": "abc", "password": PASSWORD }).to_string(),
    ));
    assert!(resp
        .header_value("set-cookie")
        .unwrap()
        .contains("Path=/v1/2fa-service/auth"));
}

#[test]
fn a_corrupt_record_is_a_500_that_leaks_nothing() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    tfa_core::Store::set(&h.store, &format!("user:{}", u.id), b"{not json").unwrap();
    let resp = h.call(bearer(get("/auth/me"), &u.access));
    assert_error(&resp, 500, "Internal server error");
    assert!(
        h.log.iter().any(|l| l.contains("/api/auth/me failed")),
        "{:?}",
        h.log
    );
}
