//! API keys: lifecycle, scopes on every endpoint, introspection.

mod common;

use common::*;
use serde_json::{json, Value};
use tfa_core::testing::Harness;
use tfa_core::Request;

fn create_key(h: &mut Harness, u: &User, scopes: Value) -> Value {
    let resp = h.call(bearer(
        post("/api-keys", json!({ "name": "ci", "scopes": scopes })),
        &u.access,
    ));
    assert_eq!(resp.status, 201, "{}", String::from_utf8_lossy(&resp.body));
    data(&resp)
}

fn with_key(req: Request, key: &str) -> Request {
    req.header("X-API-Key", key)
}

#[test]
fn create_list_rotate_revoke() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let k = create_key(&mut h, &u, json!(["user:read", "2fa:read", "user:read"]));
    let secret = k["apiKey"].as_str().unwrap().to_string();
    assert!(secret.starts_with("tfa_") && secret.len() == 44);
    assert!(secret[4..].chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(k["prefix"], &secret[..12]);
    assert_eq!(k["scopes"], json!(["user:read", "2fa:read"]));
    assert_eq!(k["expiresAt"], Value::Null);
    let id = k["id"].as_str().unwrap().to_string();
    // The key works, as its owner.
    assert_eq!(
        data(&h.call(with_key(get("/auth/me"), &secret)))["id"],
        u.id.as_str()
    );
    assert_eq!(
        data(&h.call(bearer(get("/auth/me"), &secret)))["id"],
        u.id.as_str()
    );
    // Listing never shows the key; the hash is not in the store's records as the key.
    let list = data(&h.call(bearer(get("/api-keys"), &u.access)));
    assert_eq!(list["apiKeys"].as_array().unwrap().len(), 1);
    assert!(!serde_json::to_string(&list).unwrap().contains(&secret));
    assert!(list["apiKeys"][0]["lastUsedAt"].is_string());
    for k in h.store.keys() {
        if let Some(v) = h.store.raw(&k) {
            assert!(
                !String::from_utf8_lossy(&v).contains(&secret[12..]),
                "secret stored in {k}"
            );
        }
    }
    // Rotate: new secret, old one dead.
    let rotated = data(&h.call(bearer(
        post(&format!("/api-keys/{id}/rotate"), json!({})),
        &u.access,
    )));
    let new_secret = rotated["apiKey"].as_str().unwrap().to_string();
    assert_ne!(new_secret, secret);
    assert_eq!(rotated["id"], id.as_str());
    assert_error(
        &h.call(with_key(get("/auth/me"), &secret)),
        401,
        "Invalid or expired token",
    );
    assert_eq!(h.call(with_key(get("/auth/me"), &new_secret)).status, 200);
    // Revoke.
    assert_eq!(
        data(&h.call(bearer(delete(&format!("/api-keys/{id}")), &u.access)))["message"],
        "API key revoked"
    );
    assert_error(
        &h.call(with_key(get("/auth/me"), &new_secret)),
        401,
        "Invalid or expired token",
    );
    assert_error(
        &h.call(bearer(delete(&format!("/api-keys/{id}")), &u.access)),
        404,
        "Resource not found",
    );
}

#[test]
fn scopes_are_enforced_with_the_exact_message() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    let reader = create_key(&mut h, &u, json!(["2fa:read"]))["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(h.call(with_key(get("/2fa/methods"), &reader)).status, 200);
    assert_eq!(
        h.call(with_key(get("/2fa/backup-codes/count"), &reader))
            .status,
        200
    );
    let cases = [
        (post("/2fa/totp/setup", json!({})), "2fa:write"),
        (delete("/2fa/devices"), "2fa:write"),
        (get("/auth/me"), "user:read"),
        (get("/auth/sessions"), "user:read"),
        (get("/audit-log"), "audit:read"),
        (get("/webhooks"), "webhooks:read"),
        (
            post(
                "/webhooks",
                json!({ "url": "https://example.com/h", "events": ["user.login"] }),
            ),
            "webhooks:write",
        ),
        (
            post("/auth/introspect", json!({ "token": "x" })),
            "auth:introspect",
        ),
    ];
    for (req, scope) in cases {
        let resp = h.call(with_key(req, &reader));
        assert_error(
            &resp,
            403,
            &format!("Insufficient permissions. Required scope: {scope}"),
        );
    }
    // `*` allows everything a key may do.
    let all = create_key(&mut h, &u, json!(["*"]))["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        h.call(with_key(post("/2fa/totp/setup", json!({})), &all))
            .status,
        200
    );
    // Session operations and key management never accept a key.
    for req in [
        post("/auth/logout", json!({})),
        post("/auth/revoke-sessions", json!({})),
        get("/api-keys"),
        post("/api-keys", json!({ "name": "x", "scopes": ["*"] })),
    ] {
        assert_error(
            &h.call(with_key(req, &all)),
            401,
            "Invalid or expired token",
        );
    }
    // Unknown and malformed keys.
    for k in [
        "tfa_",
        "tfa_0000000000000000000000000000000000000000",
        "nope",
    ] {
        assert_error(
            &h.call(with_key(get("/auth/me"), k)),
            401,
            "Invalid or expired token",
        );
    }
}

#[test]
fn bad_key_requests_are_400s_and_expiry_works() {
    let mut h = Harness::new();
    let u = register(&mut h, "carol");
    let cases = [
        (json!({ "scopes": ["*"] }), "name is required"),
        (json!({ "name": "x".repeat(101), "scopes": ["*"] }), "name must be at most 100 characters without control characters"),
        (json!({ "name": "x" }), "scopes must be a non-empty array of: *, user:read, 2fa:read, 2fa:write, webhooks:read, webhooks:write, audit:read, auth:introspect"),
        (json!({ "name": "x", "scopes": ["root"] }), "scopes must be a non-empty array of: *, user:read, 2fa:read, 2fa:write, webhooks:read, webhooks:write, audit:read, auth:introspect"),
        (json!({ "name": "x", "scopes": [] }), "scopes must be a non-empty array of: *, user:read, 2fa:read, 2fa:write, webhooks:read, webhooks:write, audit:read, auth:introspect"),
        (json!({ "name": "x", "scopes": ["*"], "expiresInDays": 0 }), "expiresInDays must be a whole number from 1 to 3650"),
        (json!({ "name": "x", "scopes": ["*"], "expiresInDays": "7" }), "expiresInDays must be a whole number from 1 to 3650"),
    ];
    for (body, detail) in cases {
        assert_error(
            &h.call(bearer(post("/api-keys", body), &u.access)),
            400,
            &format!("Validation error: {detail}"),
        );
    }
    let resp = h.call(bearer(
        post(
            "/api-keys",
            json!({ "name": "short", "scopes": ["user:read"], "expiresInDays": 1 }),
        ),
        &u.access,
    ));
    let secret = data(&resp)["apiKey"].as_str().unwrap().to_string();
    assert_eq!(h.call(with_key(get("/auth/me"), &secret)).status, 200);
    h.advance_secs(86_400);
    assert_error(
        &h.call(with_key(get("/auth/me"), &secret)),
        401,
        "Invalid or expired token",
    );
}

#[test]
fn introspection_for_gateways() {
    let mut h = Harness::new();
    let op = register(&mut h, "gateway-owner");
    let key = create_key(&mut h, &op, json!(["auth:introspect"]))["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    let u = register(&mut h, "dave");
    let resp = h.call(with_key(
        post("/auth/introspect", json!({ "token": u.access })),
        &key,
    ));
    let d = data(&resp);
    assert_eq!(d["active"], true);
    assert_eq!(d["sub"], u.id.as_str());
    assert_eq!(d["mfa"], false);
    assert!(d["sid"].is_string() && d["exp"].is_u64());
    // Other kinds, garbage, and logged-out sessions are inactive.
    for t in [u.refresh.as_str(), "garbage"] {
        let resp = h.call(with_key(
            post("/auth/introspect", json!({ "token": t })),
            &key,
        ));
        assert_eq!(data(&resp), json!({ "active": false }));
    }
    h.call(bearer(post("/auth/logout", json!({})), &u.access));
    let resp = h.call(with_key(
        post("/auth/introspect", json!({ "token": u.access })),
        &key,
    ));
    assert_eq!(data(&resp), json!({ "active": false }));
    assert_error(
        &h.call(with_key(post("/auth/introspect", json!({})), &key)),
        400,
        "Validation error: token is required",
    );
    assert_error(
        &h.call(post("/auth/introspect", json!({ "token": "x" }))),
        401,
        "Invalid or expired token",
    );
    // Limited per key, not per IP: many IPs share one window.
    let resp = h.call(
        with_key(post("/auth/introspect", json!({ "token": "x" })), &key).peer("192.0.2.200"),
    );
    assert_eq!(resp.header_value("x-ratelimit-limit"), Some("1000"));
    assert_eq!(resp.header_value("x-ratelimit-remaining"), Some("994"));
}

#[test]
fn audit_log_pages_newest_first_without_secrets() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    let (secret, codes) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": "000000" }),
    ));
    let temp = temp_token(&mut h, &u, "192.0.2.2");
    h.call(post(
        "/2fa/verify-backup-code",
        json!({ "tempToken": temp, "backupCode": codes[0] }),
    ));
    let page = data(&h.call(bearer(get("/audit-log?limit=3"), &u.access)));
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["action"], "backup_code_used");
    for e in events {
        for field in [
            "id",
            "action",
            "success",
            "ipAddress",
            "userAgent",
            "details",
            "createdAt",
        ] {
            assert!(e.get(field).is_some(), "{field} in {e}");
        }
    }
    let mut actions: Vec<String> = events
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_string())
        .collect();
    let mut cursor = page["nextCursor"].as_str().map(str::to_string);
    while let Some(c) = cursor {
        let page = data(&h.call(bearer(
            get(&format!("/audit-log?limit=3&cursor={c}")),
            &u.access,
        )));
        actions.extend(
            page["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["action"].as_str().unwrap().to_string()),
        );
        cursor = page["nextCursor"].as_str().map(str::to_string);
    }
    for expected in [
        "register",
        "2fa_setup_started",
        "2fa_enabled",
        "login_success",
        "2fa_failed",
        "backup_code_used",
    ] {
        assert!(
            actions.iter().any(|a| a == expected),
            "{expected} missing from {actions:?}"
        );
    }
    assert_eq!(actions.last().unwrap(), "register");
    // No secret, code or token in any record.
    let all = serde_json::to_string(
        &h.store
            .keys()
            .iter()
            .filter(|k| k.starts_with("audit:"))
            .map(|k| String::from_utf8_lossy(&h.store.raw(k).unwrap()).to_string())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for s in [&secret, &codes[0], &u.access, &u.refresh, &temp] {
        assert!(!all.contains(s.as_str()));
    }
    assert_error(
        &h.call(bearer(get("/audit-log?limit=0"), &u.access)),
        400,
        "Validation error: limit must be a whole number from 1 to 100",
    );
    assert_error(
        &h.call(bearer(get("/audit-log?limit=101"), &u.access)),
        400,
        "Validation error: limit must be a whole number from 1 to 100",
    );
    assert_error(
        &h.call(bearer(get("/audit-log?cursor=abc"), &u.access)),
        400,
        "Validation error: cursor is not valid",
    );
    // Another user sees only their own.
    let v = register(&mut h, "frank");
    let theirs = data(&h.call(bearer(get("/audit-log"), &v.access)));
    assert_eq!(theirs["events"].as_array().unwrap().len(), 1);
}
