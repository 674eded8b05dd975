//! The whole API through the real component in the local host, over real
//! HTTP: enrolment and login flows, trusted devices, backup codes, sessions,
//! refresh, errors, rate limits.

use base64::Engine;
use e2e::api::*;
use e2e::procs::{Host, HostOptions};
use serde_json::json;
use tfa_core::plumbing::ratelimit;

#[test]
fn totp_enrolment_login_trusted_device_backup_codes_and_sessions() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "alice");
    let me = c.get("/api/auth/me", Some(&u.access)).data();
    assert_eq!(me["email"], "alice@example.com");
    assert_eq!(me["twoFactorEnabled"], false);

    // Setup: the QR code is a PNG data URL of the otpauth URI.
    let setup = c
        .post("/api/2fa/totp/setup", &json!({}), Some(&u.access))
        .data();
    let qr = setup["qrCode"].as_str().unwrap();
    let png = base64::engine::general_purpose::STANDARD
        .decode(qr.strip_prefix("data:image/png;base64,").unwrap())
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let secret = setup["secret"].as_str().unwrap().to_string();
    let backups: Vec<String> = setup["backupCodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(backups.len(), 10);
    // Drawn in one request from the component's batch of random bytes
    // (spin-app's WasiRng): no two alike.
    let distinct: std::collections::BTreeSet<&String> = backups.iter().collect();
    assert_eq!(distinct.len(), backups.len(), "{backups:?}");
    let step = now_secs() / 30;
    let r = c.post(
        "/api/2fa/totp/verify-setup",
        &json!({ "code": totp_code(&secret, step * 30) }),
        Some(&u.access),
    );
    assert_eq!(r.data(), json!({ "enabled": true, "method": "totp" }));

    // Login now needs the second factor; a wrong code is refused.
    let d = login(c, "alice").data();
    assert_eq!(d["requiresTwoFactor"], true);
    assert_eq!(d["availableMethods"], json!(["totp", "backup"]));
    let temp = d["tempToken"].as_str().unwrap().to_string();
    let bad = if totp_code(&secret, step * 30) == "000000" {
        "111111"
    } else {
        "000000"
    };
    c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": bad }),
        None,
    )
    .assert_error(400, "Invalid verification code");
    // The code used for enrolment is not accepted again.
    c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": totp_code(&secret, step * 30) }),
        None,
    )
    .assert_error(400, "Invalid verification code");
    let (code, step) = fresh_totp(&secret, step);
    let r = c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": temp, "code": code, "trustDevice": true, "deviceName": "e2e laptop" }),
        None,
    );
    let v = r.data();
    let access = v["accessToken"].as_str().unwrap().to_string();
    let device = v["deviceToken"].as_str().unwrap().to_string();
    assert!(r.header("set-cookie").unwrap().starts_with("refreshToken="));
    let _ = step;

    // The trusted device skips 2FA.
    let r = c.post(
        "/api/auth/login",
        &json!({ "emailOrUsername": "alice", "password": PASSWORD, "deviceToken": device }),
        None,
    );
    assert!(r.data()["accessToken"].is_string());
    let devices = c.get("/api/2fa/devices", Some(&access)).data();
    assert_eq!(devices["devices"][0]["deviceName"], "e2e laptop");

    // A backup code logs in once.
    let temp = temp_token(c, &u);
    let r = c.post(
        "/api/2fa/verify-backup-code",
        &json!({ "tempToken": temp, "backupCode": backups[0] }),
        None,
    );
    assert_eq!(r.data()["remainingCodes"], 9);
    let temp = temp_token(c, &u);
    c.post(
        "/api/2fa/verify-backup",
        &json!({ "tempToken": temp, "code": backups[0] }),
        None,
    )
    .assert_error(400, "This backup code has already been used");
    assert_eq!(
        c.get("/api/2fa/backup-codes/count", Some(&access)).data(),
        json!({ "remaining": 9, "total": 10 })
    );

    // Sessions: several; revoke them all; every token dies at once.
    let sessions = c.get("/api/auth/sessions", Some(&access)).data();
    assert!(sessions["sessions"].as_array().unwrap().len() >= 3);
    let r = c
        .post("/api/auth/revoke-sessions", &json!({}), Some(&access))
        .data();
    assert_eq!(r["message"], "All sessions revoked");
    for t in [&access, &u.access] {
        c.get("/api/auth/me", Some(t))
            .assert_error(401, "Invalid or expired token");
    }
    c.post(
        "/api/auth/refresh",
        &json!({ "refreshToken": u.refresh }),
        None,
    )
    .assert_error(401, "Invalid refresh token");
    // One request line per request in the local host's log (Spin writes
    // no request lines).
    if e2e::procs::runtime() == e2e::procs::Runtime::Local {
        assert!(
            host.wait_output(
                "POST /api/auth/revoke-sessions 200",
                std::time::Duration::from_secs(5)
            ),
            "{}",
            host.output()
        );
    }
}

#[test]
fn refresh_rotation_cookie_csrf_and_logout() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "bob");
    let cookie = format!("refreshToken={}", u.refresh);
    c.send("POST", "/api/auth/refresh", &[("Cookie", &cookie)], b"")
        .assert_error(403, "Invalid CSRF origin");
    let r = c.send(
        "POST",
        "/api/auth/refresh",
        &[("Cookie", &cookie), ("Origin", "https://app.example.com")],
        b"",
    );
    let d = r.data();
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let cookie_attrs = r.header("set-cookie").unwrap();
    for a in ["HttpOnly", "SameSite=Strict", "Path=/api/auth"] {
        assert!(cookie_attrs.contains(a), "{cookie_attrs}");
    }
    // Reuse of the rotated token ends the session.
    c.post(
        "/api/auth/refresh",
        &json!({ "refreshToken": u.refresh }),
        None,
    )
    .assert_error(401, "Invalid refresh token");
    c.get("/api/auth/me", Some(d["accessToken"].as_str().unwrap()))
        .assert_error(401, "Invalid or expired token");
    // Logout ends the access token at once.
    let l = login(c, "bob").data();
    let access = l["accessToken"].as_str().unwrap();
    assert_eq!(
        c.post("/api/auth/logout", &json!({}), Some(access)).data(),
        json!({ "message": "Logged out successfully" })
    );
    c.get("/api/auth/me", Some(access))
        .assert_error(401, "Invalid or expired token");

    // The service's own origin (the Host the client sent) passes the CSRF
    // check; another origin does not.
    let refresh = login(c, "bob").data()["refreshToken"]
        .as_str()
        .unwrap()
        .to_string();
    let cookie = format!("refreshToken={refresh}");
    c.send(
        "POST",
        "/api/auth/refresh",
        &[("Cookie", &cookie), ("Origin", "https://evil.example")],
        b"",
    )
    .assert_error(403, "Invalid CSRF origin");
    let own = format!("http://127.0.0.1:{}", host.port);
    let r = c.send(
        "POST",
        "/api/auth/refresh",
        &[("Cookie", &cookie), ("Origin", &own)],
        b"",
    );
    assert!(r.data()["accessToken"].is_string(), "{}", r.json());
}

#[test]
fn errors_are_clear_and_never_500() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    c.get("/api/nope", None)
        .assert_error(404, "Resource not found");
    let r = c.get("/api/auth/login", None);
    r.assert_error(405, "Method not allowed");
    assert_eq!(r.header("allow"), Some("POST"));
    let big = vec![b'a'; 70 * 1024];
    let r = c.send(
        "POST",
        "/api/auth/register",
        &[("Content-Type", "application/json")],
        &big,
    );
    r.assert_error(413, "Request body too large");
    // The component answers this one itself (core never sees the body),
    // through core's envelope builder: the same security headers.
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("application/json", b"{".to_vec()),
        ("application/json", b"[1,2]".to_vec()),
        ("application/json", vec![0xff, 0xfe, 0x00]),
        (
            "application/json",
            format!("{}{}", "[".repeat(3000), "]".repeat(3000)).into_bytes(),
        ),
        ("text/plain", b"{}".to_vec()),
    ];
    for (ct, body) in bodies {
        c.send("POST", "/api/auth/register", &[("Content-Type", ct)], &body)
            .assert_error(400, "Validation error: body must be a JSON object");
    }
    c.post(
        "/api/auth/login",
        &json!({ "emailOrUsername": 1, "password": "y" }),
        None,
    )
    .assert_error(400, "Validation error: emailOrUsername must be a string");
    c.post(
        "/api/auth/login",
        &json!({ "emailOrUsername": "ghost", "password": "Wr0ng!pass" }),
        None,
    )
    .assert_error(401, "Invalid email or password");
    c.get("/api/auth/me", Some("garbage"))
        .assert_error(401, "Invalid or expired token");
    c.post(
        "/api/2fa/verify",
        &json!({ "tempToken": "x", "code": "123456" }),
        None,
    )
    .assert_error(400, "Invalid temp token");
    // Security headers on every answer.
    let r = c.get("/api/health", None);
    assert_eq!(r.status, 200);
    for (k, v) in [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(r.header(k), Some(v));
    }
    let h = r.json();
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["checks"], json!({ "database": "up", "redis": "up" }));
}

#[test]
fn rate_limits_with_headers() {
    // Counts a 15-minute login allowance to its end.
    within_one_rate_window(ratelimit::LOGIN, 60);
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    register(c, "carol");
    for i in 1..=5 {
        let r = login(c, "carol");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some((5 - i).to_string().as_str())
        );
    }
    let r = login(c, "carol");
    r.assert_error(429, "Too many requests. Please try again later.");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=900).contains(&retry));
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(reset > now_secs());
}

#[test]
fn the_error_table_over_http() {
    let host = Host::start(HostOptions::default());
    let c = &host.client;
    let u = register(c, "hank");
    // 409s.
    c.post(
        "/api/auth/register",
        &json!({ "email": "HANK@example.com", "username": "hank2", "password": PASSWORD }),
        None,
    )
    .assert_error(409, "Email already registered");
    c.post(
        "/api/auth/register",
        &json!({ "email": "hank2@example.com", "username": "Hank", "password": PASSWORD }),
        None,
    )
    .assert_error(409, "Username already taken");
    // Validation errors name the field.
    c.post(
        "/api/auth/register",
        &json!({ "email": "nope", "username": "hank3", "password": PASSWORD }),
        None,
    )
    .assert_error(
        400,
        "Validation error: email must be a valid e-mail address",
    );
    c.post(
        "/api/auth/register",
        &json!({ "email": "h3@example.com", "username": "hank3", "password": "short" }),
        None,
    )
    .assert_error(
        400,
        "Validation error: password must be at least 8 characters",
    );
    // 2FA state errors.
    c.post(
        "/api/2fa/totp/verify-setup",
        &json!({ "code": "123456" }),
        Some(&u.access),
    )
    .assert_error(400, "2FA setup not initiated");
    c.post(
        "/api/2fa/backup-codes/generate",
        &json!({}),
        Some(&u.access),
    )
    .assert_error(400, "No 2FA method available");
    c.post("/api/2fa/totp/setup", &json!({}), None)
        .assert_error(401, "Invalid or expired token");
    enable_totp(c, &u);
    let methods = c.get("/api/2fa/methods", Some(&u.access)).data();
    let id = methods["methods"][0]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/api/2fa/methods/{id}"), &u.access)
        .assert_error(
            400,
            "Cannot remove the last 2FA method while 2FA is enabled",
        );
    c.delete(
        "/api/2fa/devices/00000000-0000-4000-8000-000000000000",
        &u.access,
    )
    .assert_error(404, "Resource not found");
    // API key lacking a scope.
    let key = c
        .post(
            "/api/api-keys",
            &json!({ "name": "ro", "scopes": ["2fa:read"] }),
            Some(&u.access),
        )
        .data();
    let key = key["apiKey"].as_str().unwrap().to_string();
    assert_eq!(
        c.send("GET", "/api/2fa/methods", &[("X-API-Key", &key)], b"")
            .status,
        200
    );
    c.send("GET", "/api/auth/me", &[("X-API-Key", &key)], b"")
        .assert_error(403, "Insufficient permissions. Required scope: user:read");
    // Webhook signature check.
    let hook = c
        .post(
            "/api/webhooks",
            &json!({ "url": "https://hooks.example.com/x", "events": ["user.login"] }),
            Some(&u.access),
        )
        .data();
    c.post(
        "/api/webhooks/verify-signature",
        &json!({ "webhookId": hook["id"], "payload": "{}", "signature": "sha256=00" }),
        Some(&u.access),
    )
    .assert_error(400, "Invalid webhook signature");
    // Refresh with garbage.
    c.post(
        "/api/auth/refresh",
        &json!({ "refreshToken": "garbage" }),
        None,
    )
    .assert_error(401, "Invalid refresh token");
}
