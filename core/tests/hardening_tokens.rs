//! Token attacks through the API: `alg: none`, HS/RS confusion, key-naming
//! headers, confusion among the four kinds, expiry and not-before, wrong
//! issuer or audience, truncated and padded signatures, forged subjects, and
//! tokens of sessions that have ended. Every one is refused with the
//! specified error; the genuine token keeps working where it should.

mod common;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use common::*;
use serde_json::{json, Value};
use tfa_core::signature::hmac_sha256;
use tfa_core::testing::Harness;

const ACCESS_SECRET: &[u8] = b"access-secret-access-secret-access-secret-0001";
const REFRESH_SECRET: &[u8] = b"refresh-secret-refresh-secret-refresh-secret-02";
const TEMP_SECRET: &[u8] = b"temp-secret-temp-secret-temp-secret-temp-sec-03";
const DEVICE_SECRET: &[u8] = b"device-secret-device-secret-device-secret-0004";

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token with this header and payload, HS256-signed with `key` by hand.
fn forge(header: &Value, payload: &Value, key: &[u8]) -> String {
    let msg = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(payload.to_string().as_bytes())
    );
    format!("{msg}.{}", b64(&hmac_sha256(key, msg.as_bytes())))
}

fn payload_of(token: &str) -> Value {
    let part = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

fn hs256() -> Value {
    json!({ "alg": "HS256", "typ": "JWT" })
}

fn assert_me_refused(h: &mut Harness, token: &str, what: &str) {
    let resp = h.call(bearer(get("/auth/me"), token));
    assert_eq!(resp.status, 401, "{what}: {}", resp.json());
    assert_error(&resp, 401, "Invalid or expired token");
}

fn me_ok(h: &mut Harness, token: &str) -> bool {
    h.call(bearer(get("/auth/me"), token)).status == 200
}

#[test]
fn forged_headers_and_algorithms_are_refused() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let claims = payload_of(&u.access);
    assert!(me_ok(&mut h, &u.access));
    // The forger reproduces a genuine token exactly: the helper is sound.
    assert!(me_ok(&mut h, &forge(&hs256(), &claims, ACCESS_SECRET)));

    let body = b64(claims.to_string().as_bytes());
    let unsigned = |alg: &str| {
        format!(
            "{}.{body}.",
            b64(json!({ "alg": alg }).to_string().as_bytes())
        )
    };
    for alg in ["none", "None", "NONE", "nOnE"] {
        assert_me_refused(&mut h, &unsigned(alg), alg);
        // With a signature part left over from a real token, too.
        let sig = u.access.rsplit('.').next().unwrap();
        assert_me_refused(&mut h, &format!("{}{sig}", unsigned(alg)), alg);
    }
    // No alg at all, or not a string.
    for header in [
        json!({}),
        json!({ "alg": null }),
        json!({ "alg": ["HS256"] }),
        json!({ "alg": "hs256" }),
    ] {
        assert_me_refused(
            &mut h,
            &forge(&header, &claims, ACCESS_SECRET),
            &header.to_string(),
        );
    }

    // HS/RS confusion: an RS256 (or ES/PS/EdDSA) label over an HMAC made with
    // the secret as the key.
    for alg in [
        "RS256", "RS512", "PS256", "ES256", "EdDSA", "HS384", "HS512",
    ] {
        let t = forge(&json!({ "alg": alg, "typ": "JWT" }), &claims, ACCESS_SECRET);
        assert_me_refused(&mut h, &t, alg);
    }
    // HS256 keyed with something that looks like a public key.
    let pem = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo\n4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u\n-----END PUBLIC KEY-----\n";
    for key in [pem.as_bytes(), b"", b"null", b"undefined", b"secret"] {
        assert_me_refused(&mut h, &forge(&hs256(), &claims, key), "foreign HMAC key");
    }

    // Key-naming and extension headers, even with the right key.
    for (name, value) in [
        ("jku", json!("https://evil.example/jwks.json")),
        ("x5u", json!("https://evil.example/cert.pem")),
        ("jwk", json!({ "kty": "oct", "k": b64(b"attacker") })),
        ("x5c", json!(["MIIB"])),
        ("crit", json!(["exp"])),
    ] {
        let mut header = hs256();
        header[name] = value;
        assert_me_refused(&mut h, &forge(&header, &claims, ACCESS_SECRET), name);
    }
    // `kid` names nothing here: with a key of the attacker's choice it fails;
    // with ours it changes nothing (the key is never looked up by it).
    for kid in ["../../../../dev/null", "' OR 1=1 --", "", "0"] {
        let mut header = hs256();
        header["kid"] = json!(kid);
        assert_me_refused(&mut h, &forge(&header, &claims, b""), "kid, empty key");
        assert_me_refused(
            &mut h,
            &forge(&header, &claims, kid.as_bytes()),
            "kid as key",
        );
        assert!(
            me_ok(&mut h, &forge(&header, &claims, ACCESS_SECRET)),
            "kid is ignored"
        );
    }
}

#[test]
fn signature_tampering_is_refused() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (msg, sig) = u.access.rsplit_once('.').unwrap();
    let raw = URL_SAFE_NO_PAD.decode(sig).unwrap();
    let std_alphabet = STANDARD.encode(&raw);
    let cases = [
        format!("{msg}.{}", &sig[..sig.len() - 1]),
        format!("{msg}.{}", &sig[..sig.len() / 2]),
        format!("{msg}."),
        format!("{msg}.{sig}="),
        format!("{msg}.{sig}=="),
        format!("{msg}.{sig}A"),
        format!("{msg}.{std_alphabet}"),
        format!("{msg}.{}", b64(&raw[..31])),
        format!("{msg}.{}", b64(&[raw.as_slice(), &[0]].concat())),
        format!("{msg}.{sig}.{sig}"),
        msg.to_string(),
        format!("{}\u{0}", u.access),
        u.access.to_uppercase(),
    ];
    for t in &cases {
        if *t == u.access {
            continue;
        }
        assert_me_refused(&mut h, t, t);
    }
    assert!(me_ok(&mut h, &u.access));
}

#[test]
fn claims_checks_expiry_issuer_audience_subject() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let bob = register(&mut h, "bobby");
    let claims = payload_of(&u.access);
    let now = h.now_ms / 1000;
    let with = |name: &str, value: Value| {
        let mut c = claims.clone();
        c[name] = value;
        forge(&hs256(), &c, ACCESS_SECRET)
    };
    let cases = [
        ("expired", with("exp", json!(now - 1))),
        ("expires now", with("exp", json!(now))),
        (
            "exp as a string",
            with("exp", json!((now + 900).to_string())),
        ),
        ("exp negative", with("exp", json!(-1))),
        ("exp float", with("exp", json!(now as f64 + 900.5))),
        ("not yet valid", with("nbf", json!(now + 60))),
        ("wrong issuer", with("iss", json!("https://evil.example"))),
        ("issuer array", with("iss", json!([claims["iss"]]))),
        ("wrong audience", with("aud", json!("another-api"))),
        (
            "audience array",
            with("aud", json!([claims["aud"].clone()])),
        ),
        ("no sid", with("sid", Value::Null)),
        (
            "unknown sid",
            with("sid", json!("00000000-0000-4000-8000-000000000000")),
        ),
        ("no mfa", with("mfa", Value::Null)),
        // Alice's session, Bob's name: the session must belong to the subject.
        ("other subject", with("sub", json!(bob.id))),
        ("typ refresh", with("typ", json!("refresh"))),
        ("no typ", with("typ", Value::Null)),
    ];
    for (what, t) in &cases {
        assert_me_refused(&mut h, t, what);
    }
    // The real token expires after exactly 15 minutes.
    h.advance_secs(899);
    assert!(me_ok(&mut h, &u.access));
    h.advance_secs(1);
    assert_me_refused(&mut h, &u.access, "expired access token");
}

#[test]
fn no_kind_is_accepted_as_another() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (_, _) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let claims = payload_of(&u.access);

    // Refresh, temp and device tokens (and access-shaped tokens signed with
    // their secrets) as bearer tokens.
    let mut forged_access = Vec::new();
    for key in [REFRESH_SECRET, TEMP_SECRET, DEVICE_SECRET] {
        forged_access.push(forge(&hs256(), &claims, key));
    }
    for (what, t) in [
        ("refresh as bearer", u.refresh.clone()),
        ("temp as bearer", temp.clone()),
        (
            "access signed with the refresh secret",
            forged_access[0].clone(),
        ),
        (
            "access signed with the temp secret",
            forged_access[1].clone(),
        ),
        (
            "access signed with the device secret",
            forged_access[2].clone(),
        ),
    ] {
        assert_me_refused(&mut h, &t, what);
    }
    // An access token where a temp token belongs.
    for t in [&u.access, &u.refresh] {
        let resp = h.call(post(
            "/2fa/verify",
            json!({ "tempToken": t, "code": "123456" }),
        ));
        assert_error(&resp, 400, "Invalid temp token");
        let resp = h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": t, "backupCode": "AAAAAAAAAA" }),
        ));
        assert_error(&resp, 400, "Invalid temp token");
        let resp = h.call(post(
            "/2fa/send-code",
            json!({ "tempToken": t, "method": "email" }),
        ));
        assert_error(&resp, 400, "Invalid temp token");
    }
    // Access and temp tokens where a refresh token belongs; a refresh-shaped
    // token signed with the access secret.
    let mut rc = payload_of(&u.refresh);
    rc["typ"] = json!("refresh");
    for t in [
        u.access.clone(),
        temp.clone(),
        forge(&hs256(), &rc, ACCESS_SECRET),
    ] {
        let resp = h.call(post("/auth/refresh", json!({ "refreshToken": t })));
        assert_error(&resp, 401, "Invalid refresh token");
    }
    // Access, refresh and temp tokens as device tokens: the second factor is
    // still required.
    for t in [&u.access, &u.refresh, &temp] {
        let resp = h.call(
            post(
                "/auth/login",
                json!({ "emailOrUsername": "alice", "password": PASSWORD, "deviceToken": t }),
            )
            .peer("192.0.2.50"),
        );
        assert_eq!(data(&resp)["requiresTwoFactor"], json!(true));
    }
    // Introspection reports every non-access token inactive.
    let resp = h.call(bearer(
        post(
            "/api-keys",
            json!({ "name": "gw", "scopes": ["auth:introspect"] }),
        ),
        &u.access,
    ));
    let key = data(&resp)["apiKey"].as_str().unwrap().to_string();
    for t in [&u.refresh, &temp, &forged_access[0]] {
        let resp =
            h.call(post("/auth/introspect", json!({ "token": t })).header("X-API-Key", &key));
        assert_eq!(data(&resp), json!({ "active": false }));
    }
    let resp =
        h.call(post("/auth/introspect", json!({ "token": u.access })).header("X-API-Key", &key));
    assert_eq!(data(&resp)["active"], json!(true));
}

#[test]
fn device_tokens_of_other_users_and_forged_devices_do_not_skip_2fa() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (secret, _) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)), "trustDevice": true }),
    ));
    let device = data(&resp)["deviceToken"].as_str().unwrap().to_string();
    let login_with = |h: &mut Harness, who: &str, t: &str, ip: &str| {
        let resp = h.call(
            post(
                "/auth/login",
                json!({ "emailOrUsername": who, "password": PASSWORD, "deviceToken": t }),
            )
            .peer(ip),
        );
        data(&resp)
    };
    // The genuine device token skips the second factor.
    assert!(login_with(&mut h, "alice", &device, "192.0.2.2")["accessToken"].is_string());
    // Bob cannot use Alice's device token, nor a forged one.
    let b = register(&mut h, "bobby");
    let _ = enable_totp(&mut h, &b);
    assert_eq!(
        login_with(&mut h, "bobby", &device, "192.0.2.3")["requiresTwoFactor"],
        json!(true)
    );
    let mut c = payload_of(&device);
    c["sub"] = json!(b.id);
    for key in [ACCESS_SECRET, b"".as_slice(), b"device"] {
        let t = forge(&hs256(), &c, key);
        assert_eq!(
            login_with(&mut h, "bobby", &t, "192.0.2.4")["requiresTwoFactor"],
            json!(true)
        );
    }
    // Even signed with the device secret, a device id that is not Bob's.
    let t = forge(&hs256(), &c, DEVICE_SECRET);
    assert_eq!(
        login_with(&mut h, "bobby", &t, "192.0.2.5")["requiresTwoFactor"],
        json!(true)
    );
    // Once removed, Alice's device no longer skips it either.
    let resp = h.call(bearer(delete("/2fa/devices"), &u.access));
    assert_eq!(resp.status, 200);
    assert_eq!(
        login_with(&mut h, "alice", &device, "192.0.2.6")["requiresTwoFactor"],
        json!(true)
    );
}

fn session_id(token: &str) -> String {
    payload_of(token)["sid"].as_str().unwrap().to_string()
}

#[test]
fn tokens_of_ended_sessions_are_refused() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let second = data(&login(&mut h, "alice", "192.0.2.1"));
    let third = data(&login(&mut h, "alice", "192.0.2.2"));
    let (a2, r2) = (
        second["accessToken"].as_str().unwrap().to_string(),
        second["refreshToken"].as_str().unwrap().to_string(),
    );
    let (a3, r3) = (
        third["accessToken"].as_str().unwrap().to_string(),
        third["refreshToken"].as_str().unwrap().to_string(),
    );

    // Logout ends the caller's session only.
    let resp = h.call(bearer(post("/auth/logout", json!({})), &a2));
    assert_eq!(resp.status, 200);
    assert_me_refused(&mut h, &a2, "after logout");
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": r2 })));
    assert_error(&resp, 401, "Invalid refresh token");
    assert!(me_ok(&mut h, &u.access) && me_ok(&mut h, &a3));

    // DELETE /auth/sessions/{id} ends that one.
    let resp = h.call(bearer(
        delete(&format!("/auth/sessions/{}", session_id(&a3))),
        &u.access,
    ));
    assert_eq!(resp.status, 200);
    assert_me_refused(&mut h, &a3, "after session delete");
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": r3 })));
    assert_error(&resp, 401, "Invalid refresh token");
    // Deleting it again, or with its own dead token: 404 / 401.
    let resp = h.call(bearer(
        delete(&format!("/auth/sessions/{}", session_id(&a3))),
        &u.access,
    ));
    assert_error(&resp, 404, "Resource not found");

    // A rotated-out refresh token kills its session (reuse detection).
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh })));
    let fresh = data(&resp);
    let (a4, r4) = (
        fresh["accessToken"].as_str().unwrap().to_string(),
        fresh["refreshToken"].as_str().unwrap().to_string(),
    );
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": u.refresh })));
    assert_error(&resp, 401, "Invalid refresh token");
    assert_me_refused(&mut h, &a4, "after refresh reuse");
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": r4 })));
    assert_error(&resp, 401, "Invalid refresh token");

    // Revoke-sessions ends every session, the caller's included.
    let s5 = data(&login(&mut h, "alice", "192.0.2.3"));
    let s6 = data(&login(&mut h, "alice", "192.0.2.4"));
    let a5 = s5["accessToken"].as_str().unwrap().to_string();
    let a6 = s6["accessToken"].as_str().unwrap().to_string();
    let resp = h.call(bearer(post("/auth/revoke-sessions", json!({})), &a5));
    assert_eq!(data(&resp)["revokedCount"], json!(2));
    for t in [&a5, &a6] {
        assert_me_refused(&mut h, t, "after revoke-sessions");
    }
    for r in [&s5["refreshToken"], &s6["refreshToken"]] {
        let resp = h.call(post("/auth/refresh", json!({ "refreshToken": r })));
        assert_error(&resp, 401, "Invalid refresh token");
    }
}
