//! Registration, login, refresh, logout, sessions, the current user.

mod common;

use common::*;
use serde_json::json;
use tfa_core::crypto::password;
use tfa_core::testing::Harness;
use tfa_core::Request;

#[test]
fn register_returns_user_tokens_and_cookie() {
    let mut h = Harness::new();
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": "Alice@Example.com", "username": "alice", "password": PASSWORD }),
    ));
    assert_eq!(resp.status, 201);
    let d = data(&resp);
    let user = &d["user"];
    assert_eq!(user["email"], "alice@example.com");
    assert_eq!(user["username"], "alice");
    assert_eq!(user["twoFactorEnabled"], false);
    assert_eq!(user["createdAt"], "2026-01-01T00:00:00.000Z");
    assert_eq!(
        user.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        [
            "createdAt",
            "email",
            "id",
            "twoFactorEnabled",
            "updatedAt",
            "username"
        ]
    );
    assert!(
        !resp.body.windows(7).any(|w| w == b"argon2i"),
        "hash leaked"
    );
    let cookie = resp.header_value("set-cookie").unwrap();
    assert!(cookie.starts_with("refreshToken="));
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/api/auth",
        "Max-Age=604800",
    ] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains("Secure"));
    // The access token works at once.
    let me = h.call(bearer(get("/auth/me"), d["accessToken"].as_str().unwrap()));
    let me = data(&me);
    assert_eq!(me["username"], "alice");
    assert_eq!(me["methods"], json!([]));
}

#[test]
fn register_validation_names_the_field() {
    let mut h = Harness::new();
    let cases = [
        (
            json!({ "username": "bob", "password": PASSWORD }),
            "email is required",
        ),
        (
            json!({ "email": "bob@example.com", "password": PASSWORD }),
            "username is required",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob" }),
            "password is required",
        ),
        (
            json!({ "email": "not-an-email", "username": "bob", "password": PASSWORD }),
            "email must be a valid e-mail address",
        ),
        (
            json!({ "email": "bob@exämple.com", "username": "bob", "password": PASSWORD }),
            "email must be a valid e-mail address",
        ),
        (
            json!({ "email": 5, "username": "bob", "password": PASSWORD }),
            "email must be a string",
        ),
        (
            json!({ "email": "bob@example.com", "username": "b", "password": PASSWORD }),
            "username must be 3-30 characters of letters, digits, _ or -",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob/../x", "password": PASSWORD }),
            "username must be 3-30 characters of letters, digits, _ or -",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": "Sh0rt!" }),
            "password must be at least 8 characters",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": "alllower1!" }),
            "password must contain an uppercase letter",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": "ALLUPPER1!" }),
            "password must contain a lowercase letter",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": "NoDigits!!" }),
            "password must contain a digit",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": "NoSpecial1" }),
            "password must contain a special character",
        ),
        (
            json!({ "email": "bob@example.com", "username": "bob", "password": format!("Aa1!{}", "x".repeat(125)) }),
            "password must be at most 128 characters",
        ),
    ];
    for (i, (body, detail)) in cases.into_iter().enumerate() {
        let resp = h.call(post("/auth/register", body).peer(&format!("192.0.2.{i}")));
        assert_error(&resp, 400, &format!("Validation error: {detail}"));
    }
    let resp = h.call(
        Request::new("POST", "/api/auth/register")
            .json("not json")
            .peer("192.0.2.100"),
    );
    assert_error(&resp, 400, "Validation error: body must be a JSON object");
}

#[test]
fn duplicate_email_and_username_conflict() {
    let mut h = Harness::new();
    register(&mut h, "carol");
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": "CAROL@example.com", "username": "carol2", "password": PASSWORD }),
        )
        .peer("192.0.2.1"),
    );
    assert_error(&resp, 409, "Email already registered");
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": "carol2@example.com", "username": "Carol", "password": PASSWORD }),
        )
        .peer("192.0.2.2"),
    );
    assert_error(&resp, 409, "Username already taken");
    // The e-mail of the refused registration is still free.
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": "carol2@example.com", "username": "carol2", "password": PASSWORD }),
        )
        .peer("192.0.2.3"),
    );
    assert_eq!(resp.status, 201);
}

#[test]
fn login_without_2fa_by_email_username_and_variant_field() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    for (i, body) in [
        json!({ "emailOrUsername": "dave@example.com", "password": PASSWORD }),
        json!({ "emailOrUsername": "DAVE", "password": PASSWORD }),
        json!({ "email": "dave@example.com", "password": PASSWORD }),
        json!({ "email": "dave", "password": PASSWORD }),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = h.call(post("/auth/login", body).peer(&format!("192.0.2.{i}")));
        let d = data(&resp);
        assert_eq!(d["user"]["id"], u.id.as_str());
        assert!(d["accessToken"].is_string() && d["refreshToken"].is_string());
        assert!(resp
            .header_value("set-cookie")
            .unwrap()
            .starts_with("refreshToken="));
    }
}

#[test]
fn login_failures_look_identical_and_cost_the_same() {
    let mut h = Harness::new();
    register(&mut h, "erin");
    let before = password::argon2_invocations();
    let wrong = h.call(post(
        "/auth/login",
        json!({ "emailOrUsername": "erin", "password": "Wr0ng!Password" }),
    ));
    let after_wrong = password::argon2_invocations();
    let unknown = h.call(post(
        "/auth/login",
        json!({ "emailOrUsername": "nobody", "password": "Wr0ng!Password" }),
    ));
    let after_unknown = password::argon2_invocations();
    assert_error(&wrong, 401, "Invalid email or password");
    assert_error(&unknown, 401, "Invalid email or password");
    assert_eq!(wrong.body, unknown.body);
    // Other tests run in parallel threads, so count at least one each way.
    assert!(after_wrong > before && after_unknown > after_wrong);
    let missing = h.call(post("/auth/login", json!({ "password": PASSWORD })).peer("192.0.2.9"));
    assert_error(
        &missing,
        400,
        "Validation error: emailOrUsername is required",
    );
}

#[test]
fn me_requires_a_valid_access_token() {
    let mut h = Harness::new();
    let u = register(&mut h, "frank");
    for req in [
        get("/auth/me"),
        bearer(get("/auth/me"), "garbage"),
        bearer(get("/auth/me"), &u.refresh),
        get("/auth/me").header("Authorization", "Basic abc"),
    ] {
        assert_error(&h.call(req), 401, "Invalid or expired token");
    }
    h.advance_secs(15 * 60);
    assert_error(
        &h.call(bearer(get("/auth/me"), &u.access)),
        401,
        "Invalid or expired token",
    );
}

#[test]
fn refresh_rotates_and_detects_reuse() {
    let mut h = Harness::new();
    let u = register(&mut h, "grace");
    let r1 = h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh })));
    let d1 = data(&r1);
    let new_refresh = d1["refreshToken"].as_str().unwrap().to_string();
    assert_ne!(new_refresh, u.refresh);
    assert!(r1
        .header_value("set-cookie")
        .unwrap()
        .starts_with("refreshToken="));
    assert_eq!(
        h.call(bearer(get("/auth/me"), d1["accessToken"].as_str().unwrap()))
            .status,
        200
    );
    // The old one again: reuse, the whole session ends.
    assert_error(
        &h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh }))),
        401,
        "Invalid refresh token",
    );
    assert_error(
        &h.call(post(
            "/auth/refresh",
            json!({ "refreshToken": new_refresh }),
        )),
        401,
        "Invalid refresh token",
    );
    assert_error(
        &h.call(bearer(get("/auth/me"), &u.access)),
        401,
        "Invalid or expired token",
    );
    // Missing and garbage.
    assert_error(
        &h.call(post("/auth/refresh", json!({}))),
        401,
        "Invalid refresh token",
    );
    assert_error(
        &h.call(post("/auth/refresh", json!({ "refreshToken": u.access }))),
        401,
        "Invalid refresh token",
    );
}

#[test]
fn refresh_by_cookie_needs_an_allowed_origin() {
    let mut h = Harness::new();
    let u = register(&mut h, "heidi");
    let cookie = format!("refreshToken={}", u.refresh);
    let no_origin = h.call(Request::new("POST", "/api/auth/refresh").header("Cookie", &cookie));
    assert_error(&no_origin, 403, "Invalid CSRF origin");
    let evil = h.call(
        Request::new("POST", "/api/auth/refresh")
            .header("Cookie", &cookie)
            .header("Origin", "https://evil.example"),
    );
    assert_error(&evil, 403, "Invalid CSRF origin");
    let good = h.call(
        Request::new("POST", "/api/auth/refresh")
            .header("Cookie", &cookie)
            .header("Origin", "https://app.example.com"),
    );
    assert_eq!(good.status, 200);
    assert_eq!(
        good.header_value("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let same = h.call(
        Request::new("POST", "/api/auth/refresh")
            .header(
                "Cookie",
                &format!(
                    "refreshToken={}",
                    data(&good)["refreshToken"].as_str().unwrap()
                ),
            )
            .header("Host", "auth.example.org")
            .header("Origin", "https://auth.example.org"),
    );
    assert_eq!(same.status, 200);
}

#[test]
fn refresh_token_expires_after_seven_days() {
    let mut h = Harness::new();
    let u = register(&mut h, "ivan");
    h.advance_secs(7 * 24 * 3600);
    assert_error(
        &h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh }))),
        401,
        "Invalid refresh token",
    );
}

#[test]
fn logout_ends_the_access_token_at_once() {
    let mut h = Harness::new();
    let u = register(&mut h, "judy");
    let resp = h.call(bearer(post("/auth/logout", json!({})), &u.access));
    assert_eq!(data(&resp), json!({ "message": "Logged out successfully" }));
    assert!(resp
        .header_value("set-cookie")
        .unwrap()
        .contains("Max-Age=0"));
    assert_error(
        &h.call(bearer(get("/auth/me"), &u.access)),
        401,
        "Invalid or expired token",
    );
    assert_error(
        &h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh }))),
        401,
        "Invalid refresh token",
    );
    assert_error(
        &h.call(post("/auth/logout", json!({}))),
        401,
        "Invalid or expired token",
    );
}

#[test]
fn logout_by_cookie_is_csrf_checked() {
    let mut h = Harness::new();
    let u = register(&mut h, "kim");
    let cookie = format!("refreshToken={}", u.refresh);
    let resp = h.call(Request::new("POST", "/api/auth/logout").header("Cookie", &cookie));
    assert_error(&resp, 403, "Invalid CSRF origin");
    let resp = h.call(
        Request::new("POST", "/api/auth/logout")
            .header("Cookie", &cookie)
            .header("Origin", "https://app.example.com"),
    );
    assert_eq!(resp.status, 200);
    assert_error(
        &h.call(bearer(get("/auth/me"), &u.access)),
        401,
        "Invalid or expired token",
    );
}

#[test]
fn sessions_list_delete_and_revoke_all() {
    let mut h = Harness::new();
    let u = register(&mut h, "leo");
    let second = data(&login(&mut h, "leo", "192.0.2.50"));
    let second_access = second["accessToken"].as_str().unwrap().to_string();
    let list =
        data(&h.call(bearer(get("/auth/sessions"), &u.access).header("User-Agent", "curl/8")));
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    let current: Vec<_> = sessions.iter().filter(|s| s["current"] == true).collect();
    assert_eq!(current.len(), 1);
    let other = sessions.iter().find(|s| s["current"] == false).unwrap();
    assert_eq!(other["ipAddress"], "192.0.2.50");
    for field in ["id", "userAgent", "createdAt", "lastUsedAt", "expiresAt"] {
        assert!(other.get(field).is_some(), "{field}");
    }
    // Delete the other one: its token dies, ours lives.
    let id = other["id"].as_str().unwrap();
    assert_eq!(
        h.call(bearer(delete(&format!("/auth/sessions/{id}")), &u.access))
            .status,
        200
    );
    assert_error(
        &h.call(bearer(get("/auth/me"), &second_access)),
        401,
        "Invalid or expired token",
    );
    assert_eq!(h.call(bearer(get("/auth/me"), &u.access)).status, 200);
    assert_error(
        &h.call(bearer(delete(&format!("/auth/sessions/{id}")), &u.access)),
        404,
        "Resource not found",
    );
    assert_error(
        &h.call(bearer(delete("/auth/sessions/..%2F..%2Fuser"), &u.access)),
        404,
        "Resource not found",
    );
    // Another user's session is not ours to delete.
    let other_user = register(&mut h, "mallory");
    let theirs = data(&h.call(bearer(get("/auth/sessions"), &other_user.access)))["sessions"][0]
        ["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_error(
        &h.call(bearer(
            delete(&format!("/auth/sessions/{theirs}")),
            &u.access,
        )),
        404,
        "Resource not found",
    );
    assert_eq!(
        h.call(bearer(get("/auth/me"), &other_user.access)).status,
        200
    );

    let third = data(&login(&mut h, "leo", "192.0.2.51"))["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = h.call(bearer(post("/auth/revoke-sessions", json!({})), &u.access));
    assert_eq!(
        data(&resp),
        json!({ "message": "All sessions revoked", "revokedCount": 2 })
    );
    for t in [&u.access, &third] {
        assert_error(
            &h.call(bearer(get("/auth/me"), t)),
            401,
            "Invalid or expired token",
        );
    }
}

/// The user a reply names for the operator's log (`Reply::user_id`): set
/// once a credential proved it or tokens were issued, never for a failed
/// attempt (a host may show it; it must tell nothing the client lacks).
#[test]
fn replies_name_the_proven_user_for_the_log() {
    let mut h = Harness::new();
    let alice = register(&mut h, "alice");
    assert_eq!(h.last_user_id.as_deref(), Some(alice.id.as_str()));
    let resp = h.call(bearer(get("/auth/me"), &alice.access));
    assert_eq!(resp.status, 200);
    assert_eq!(h.last_user_id.as_deref(), Some(alice.id.as_str()));

    // Wrong password, unknown user, bad token: nobody.
    let resp = h.call(post(
        "/auth/login",
        json!({ "emailOrUsername": "alice", "password": "wrong-password-1" }),
    ));
    assert_eq!(resp.status, 401);
    assert_eq!(h.last_user_id, None);
    let resp = h.call(post(
        "/auth/login",
        json!({ "emailOrUsername": "nobody", "password": PASSWORD }),
    ));
    assert_eq!(resp.status, 401);
    assert_eq!(h.last_user_id, None);
    let resp = h.call(bearer(get("/auth/me"), "not.a.token"));
    assert_eq!(resp.status, 401);
    assert_eq!(h.last_user_id, None);
    let resp = h.call(get("/health"));
    assert_eq!(resp.status, 200);
    assert_eq!(h.last_user_id, None);

    // A 2FA login: the temp token names the user, and so does the verify
    // that exchanges it; a wrong code with a valid temp token names it too
    // (the token proved the password).
    let (_secret, backups) = enable_totp(&mut h, &alice);
    let temp = temp_token(&mut h, &alice, "198.51.100.4");
    assert_eq!(h.last_user_id.as_deref(), Some(alice.id.as_str()));
    let resp = h.call(post(
        "/2fa/verify-backup",
        json!({ "tempToken": temp, "code": backups[0] }),
    ));
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    assert_eq!(h.last_user_id.as_deref(), Some(alice.id.as_str()));
    let resp = h.call(post(
        "/2fa/verify-backup",
        json!({ "tempToken": "x.y.z", "code": backups[1] }),
    ));
    assert_eq!(resp.status, 400);
    assert_eq!(h.last_user_id, None);
}

/// A user holds at most `MAX_SESSIONS` live sessions: one more sign-in
/// (password or second factor) ends the oldest, whose tokens die at once,
/// records why in the audit log, and keeps the list at the limit.
#[test]
fn the_oldest_session_ends_beyond_the_limit() {
    use tfa_core::api::sessions::MAX_SESSIONS;
    let mut h = Harness::new();
    let u = register(&mut h, "leo");
    let mut access = vec![u.access.clone()];
    for i in 1..MAX_SESSIONS {
        let ip = format!("10.0.{}.{}", i / 200, i % 200 + 1);
        let d = data(&login(&mut h, "leo", &ip));
        access.push(d["accessToken"].as_str().unwrap().to_string());
    }
    let listed = |h: &mut Harness<_>, token: &str| {
        data(&h.call(bearer(get("/auth/sessions"), token)))["sessions"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(listed(&mut h, &access[1]), MAX_SESSIONS);
    assert_eq!(h.call(bearer(get("/auth/me"), &access[0])).status, 200);

    // A password sign-in beyond the limit ends the first session only.
    let newest = data(&login(&mut h, "leo", "10.1.0.1"))["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    assert_error(
        &h.call(bearer(get("/auth/me"), &access[0])),
        401,
        "Invalid or expired token",
    );
    for t in [&access[1], &newest] {
        assert_eq!(h.call(bearer(get("/auth/me"), t)).status, 200);
    }
    assert_eq!(listed(&mut h, &newest), MAX_SESSIONS);
    let ended = audit_record(&mut h, &newest, 5, "sessions_revoked");
    assert_eq!(ended["details"]["reason"], "session_limit");
    assert_eq!(ended["details"]["revokedCount"], 1);

    // A second-factor sign-in beyond the limit ends the next oldest.
    let user = User {
        access: access[2].clone(),
        ..u
    };
    let (_, codes) = enable_totp(&mut h, &user);
    let temp = temp_token(&mut h, &user, "10.1.0.2");
    let resp = h.call(post(
        "/2fa/verify-backup-code",
        json!({ "tempToken": temp, "backupCode": codes[0] }),
    ));
    let second = data(&resp)["accessToken"].as_str().unwrap().to_string();
    assert_error(
        &h.call(bearer(get("/auth/me"), &access[1])),
        401,
        "Invalid or expired token",
    );
    for t in [&access[2], &newest, &second] {
        assert_eq!(h.call(bearer(get("/auth/me"), t)).status, 200);
    }
    assert_eq!(listed(&mut h, &second), MAX_SESSIONS);
}
