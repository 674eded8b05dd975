//! API keys, token introspection, the audit log and the integrations' input
//! checks, through the real component in the local host.

use e2e::api::*;
use e2e::client::{Client, Resp};
use e2e::procs::{Host, HostOptions};
use serde_json::{json, Value};

/// `GET` with an `X-API-Key` header.
fn get_with_key(c: &Client, path: &str, key: &str) -> Resp {
    c.send("GET", path, &[("X-API-Key", key)], b"")
}

/// A 400 whose message is `Validation error: …` naming `field`.
fn assert_validation(r: &Resp, field: &str) {
    let v = r.json();
    assert_eq!(r.status, 400, "{v}");
    assert_eq!(v["success"], false);
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Validation error: ") && msg.contains(field),
        "{field}: {msg}"
    );
}

fn create_key(c: &Client, access: &str, name: &str, scopes: &[&str]) -> Value {
    let r = c.post(
        "/api/api-keys",
        &json!({ "name": name, "scopes": scopes }),
        Some(access),
    );
    assert_eq!(r.status, 201, "{}", r.json());
    r.data()
}

#[test]
fn api_keys_act_for_their_owner_within_their_scopes() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "kay");
    let k = create_key(c, &u.access, "reporting", &["user:read", "audit:read"]);
    let key = k["apiKey"].as_str().unwrap().to_string();
    assert!(key.starts_with("tfa_") && key.len() == 44, "{key}");
    assert!(key[4..].chars().all(|ch| ch.is_ascii_alphanumeric()));
    assert_eq!(k["scopes"], json!(["user:read", "audit:read"]));
    assert_eq!(k["prefix"].as_str(), Some(&key[..12]));

    // Listing never shows the key.
    let list = c.get("/api/api-keys", Some(&u.access));
    assert_eq!(list.status, 200);
    assert!(!String::from_utf8_lossy(&list.body).contains(&key));
    assert_eq!(list.data()["apiKeys"][0]["id"], k["id"]);

    // As X-API-Key and as Bearer tfa_…, the key acts as its owner.
    let me = get_with_key(c, "/api/auth/me", &key);
    assert_eq!(me.data()["id"], u.id.as_str(), "{}", me.json());
    let me = c.get("/api/auth/me", Some(&key));
    assert_eq!(me.data()["id"], u.id.as_str());
    // Outside its scopes: the exact 403.
    c.post("/api/2fa/totp/setup", &json!({}), Some(&key))
        .assert_error(403, "Insufficient permissions. Required scope: 2fa:write");
    get_with_key(c, "/api/webhooks", &key).assert_error(
        403,
        "Insufficient permissions. Required scope: webhooks:read",
    );
    get_with_key(c, "/api/2fa/backup-codes/count", &key)
        .assert_error(403, "Insufficient permissions. Required scope: 2fa:read");
    // Key management needs a session, never a key.
    assert_eq!(
        c.post(
            "/api/api-keys",
            &json!({ "name": "x", "scopes": ["*"] }),
            Some(&key)
        )
        .status,
        401
    );

    // Rotation: the old key stops working, the new one works.
    let id = k["id"].as_str().unwrap();
    let r = c.post(
        &format!("/api/api-keys/{id}/rotate"),
        &json!({}),
        Some(&u.access),
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let rotated = r.data()["apiKey"].as_str().unwrap().to_string();
    assert_ne!(rotated, key);
    get_with_key(c, "/api/auth/me", &key).assert_error(401, "Invalid or expired token");
    assert_eq!(get_with_key(c, "/api/auth/me", &rotated).status, 200);

    // Revocation.
    assert_eq!(
        c.delete(&format!("/api/api-keys/{id}"), &u.access).status,
        200
    );
    get_with_key(c, "/api/auth/me", &rotated).assert_error(401, "Invalid or expired token");
    // A made-up key of the right shape.
    get_with_key(
        c,
        "/api/auth/me",
        "tfa_0000000000000000000000000000000000000000",
    )
    .assert_error(401, "Invalid or expired token");
}

#[test]
fn introspection_tells_a_gateway_when_a_session_has_ended() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let owner = register(c, "gate");
    let gw = create_key(c, &owner.access, "gateway", &["auth:introspect"])["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    let u = register(c, "ivy");
    let introspect = |token: &str, key: &str| {
        c.post_from(
            "/api/auth/introspect",
            &json!({ "token": token }),
            None,
            &[("X-API-Key", key)],
        )
    };
    let r = introspect(&u.access, &gw);
    let d = r.data();
    assert_eq!(d["active"], true, "{d}");
    assert_eq!(d["sub"], u.id.as_str());
    assert_eq!(d["mfa"], false);
    assert!(d["sid"].is_string() && d["exp"].is_u64(), "{d}");
    assert!(r.header("x-ratelimit-limit").is_some());
    // Other kinds of token, garbage: inactive, nothing more.
    assert_eq!(
        introspect(&u.refresh, &gw).data(),
        json!({ "active": false })
    );
    assert_eq!(
        introspect("not.a.token", &gw).data(),
        json!({ "active": false })
    );
    // After logout the unexpired token is inactive.
    assert_eq!(
        c.post("/api/auth/logout", &json!({}), Some(&u.access))
            .status,
        200
    );
    assert_eq!(
        introspect(&u.access, &gw).data(),
        json!({ "active": false })
    );
    // Without the scope, or without a key.
    let other = create_key(c, &owner.access, "reader", &["user:read"])["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    introspect(&owner.access, &other).assert_error(
        403,
        "Insufficient permissions. Required scope: auth:introspect",
    );
    let r = c.post(
        "/api/auth/introspect",
        &json!({ "token": owner.access }),
        None,
    );
    assert_eq!(r.status, 401, "{}", r.json());
    // Bad input.
    assert_validation(
        &c.post_from(
            "/api/auth/introspect",
            &json!({ "token": 5 }),
            None,
            &[("X-API-Key", &gw)],
        ),
        "token",
    );
}

#[test]
fn the_audit_log_pages_and_holds_no_secrets() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "ada");
    let (secret, backups, _) = enable_totp(c, &u);
    let r = c.post(
        "/api/auth/login",
        &json!({ "emailOrUsername": "ada", "password": "wrong-Passw0rd!" }),
        None,
    );
    assert_eq!(r.status, 401);
    let temp = temp_token(c, &u);
    let r = c.post(
        "/api/2fa/verify-backup-code",
        &json!({ "tempToken": temp, "code": backups[0] }),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let session = r.data()["accessToken"].as_str().unwrap().to_string();

    // Records are written after the response: wait (bounded) for the last.
    let mut events = Vec::new();
    for _ in 0..100 {
        let r = c.get("/api/audit-log?limit=100", Some(&session));
        events = r.data()["events"].as_array().cloned().unwrap_or_default();
        if events.iter().any(|e| e["action"] == "backup_code_used") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let actions: Vec<&str> = events
        .iter()
        .map(|e| e["action"].as_str().unwrap_or(""))
        .collect();
    for a in [
        "register",
        "2fa_setup_started",
        "2fa_enabled",
        "login_failed",
        "backup_code_used",
    ] {
        assert!(actions.contains(&a), "{a} in {actions:?}");
    }
    for e in &events {
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
    // Newest first.
    let times: Vec<&str> = events
        .iter()
        .map(|e| e["createdAt"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    // No secret, code, token or password anywhere.
    let all = serde_json::to_string(&events).unwrap();
    for s in [
        secret.as_str(),
        backups[0].as_str(),
        &u.access,
        &u.refresh,
        &temp,
        PASSWORD,
        "wrong-Passw0rd!",
    ] {
        assert!(!all.contains(s), "audit log leaks {s}");
    }

    // Paging: two at a time visits every record once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..50 {
        let path = match &cursor {
            Some(cur) => format!("/api/audit-log?limit=2&cursor={cur}"),
            None => "/api/audit-log?limit=2".to_string(),
        };
        let d = c.get(&path, Some(&session)).data();
        let page = d["events"].as_array().unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|e| e["id"].as_str().unwrap().to_string()));
        match d["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let all_ids: Vec<String> = c.get("/api/audit-log?limit=100", Some(&session)).data()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, all_ids);

    // A key needs audit:read.
    let key = create_key(c, &session, "k", &["user:read"])["apiKey"]
        .as_str()
        .unwrap()
        .to_string();
    get_with_key(c, "/api/audit-log", &key)
        .assert_error(403, "Insufficient permissions. Required scope: audit:read");
    // Bad paging input.
    for bad in ["limit=0", "limit=101", "limit=abc"] {
        assert_validation(
            &c.get(&format!("/api/audit-log?{bad}"), Some(&session)),
            "limit",
        );
    }
    assert_validation(
        &c.get("/api/audit-log?cursor=%%%", Some(&session)),
        "cursor",
    );
}

/// The integrations' bad input: each a clear 400 naming the field, and
/// nothing created.
#[test]
fn integrations_refuse_bad_input_with_clear_400s() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "val");
    let hook = |body: Value| c.post("/api/webhooks", &body, Some(&u.access));
    let ok_url = "https://hooks.example.com/tfa";
    assert_validation(
        &hook(json!({ "url": ok_url, "events": ["user.exploded"] })),
        "events",
    );
    assert_validation(&hook(json!({ "url": ok_url, "events": [] })), "events");
    assert_validation(
        &hook(json!({ "url": ok_url, "events": "user.login" })),
        "events",
    );
    assert_validation(
        &hook(json!({ "url": "ftp://hooks.example.com/", "events": ["user.login"] })),
        "url",
    );
    for private in [
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://localhost/hook",
        "https://2130706433/hook",
        "https://metadata.internal/hook",
    ] {
        assert_validation(
            &hook(json!({ "url": private, "events": ["user.login"] })),
            "url",
        );
    }
    assert_eq!(
        c.get("/api/webhooks", Some(&u.access)).data()["webhooks"],
        json!([])
    );

    let key = |body: Value| c.post("/api/api-keys", &body, Some(&u.access));
    assert_validation(&key(json!({ "name": "k", "scopes": ["root"] })), "scopes");
    assert_validation(&key(json!({ "name": "k", "scopes": [] })), "scopes");
    assert_validation(
        &key(json!({ "name": "x".repeat(101), "scopes": ["user:read"] })),
        "name",
    );
    assert_validation(
        &key(json!({ "name": "k\u{0}", "scopes": ["user:read"] })),
        "name",
    );
    assert_validation(
        &key(json!({ "name": "k", "scopes": ["user:read"], "expiresInDays": 0 })),
        "expiresInDays",
    );
    assert_eq!(
        c.get("/api/api-keys", Some(&u.access)).data()["apiKeys"],
        json!([])
    );
    // Unknown ids: 404, whatever their shape.
    for id in ["00000000-0000-0000-0000-000000000000", "..", "a%2Fb"] {
        let r = c.delete(&format!("/api/api-keys/{id}"), &u.access);
        assert_eq!(r.status, 404, "{id}: {}", r.json());
        let r = c.get(&format!("/api/webhooks/{id}/deliveries"), Some(&u.access));
        assert_eq!(r.status, 404, "{id}: {}", r.json());
    }
}
