//! TOTP enrolment, the TOTP login, window edges and replay.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::Harness;

#[test]
fn setup_returns_secret_qr_and_backup_codes() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let resp = h.call(bearer(post("/2fa/totp/setup", json!({})), &u.access));
    let d = data(&resp);
    let secret = d["secret"].as_str().unwrap();
    assert_eq!(secret.len(), 32, "20 bytes in base32 without padding");
    assert!(secret
        .chars()
        .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c)));
    assert!(d["qrCode"]
        .as_str()
        .unwrap()
        .starts_with("data:image/png;base64,"));
    assert_eq!(
        d["otpauthUrl"].as_str().unwrap(),
        format!("otpauth://totp/TwoFactorAuth:alice%40example.com?secret={secret}&issuer=TwoFactorAuth&algorithm=SHA1&digits=6&period=30")
    );
    let codes = d["backupCodes"].as_array().unwrap();
    assert_eq!(codes.len(), 10);
    for c in codes {
        let c = c.as_str().unwrap();
        assert_eq!(c.len(), 10);
        assert!(c
            .chars()
            .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit()));
    }
    assert_eq!(resp.header_value("cache-control"), Some("no-store"));
    // Pending: not enabled yet, backup codes not valid yet.
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["twoFactorEnabled"], false);
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 0, "total": 0 })
    );
}

#[test]
fn verify_setup_state_table() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    // not set up → verify-setup: 400 setup not initiated
    let resp = h.call(bearer(
        post("/2fa/totp/verify-setup", json!({ "code": "123456" })),
        &u.access,
    ));
    assert_error(&resp, 400, "2FA setup not initiated");
    // unauthenticated
    assert_error(
        &h.call(post("/2fa/totp/setup", json!({}))),
        401,
        "Invalid or expired token",
    );

    let d = data(&h.call(bearer(post("/2fa/totp/setup", json!({})), &u.access)));
    let secret = d["secret"].as_str().unwrap().to_string();
    // pending → wrong code: 400, still pending
    let now = now_secs(&h);
    let wrong = wrong_code(&totp_code(&secret, now));
    let resp = h.call(bearer(
        post("/2fa/totp/verify-setup", json!({ "code": wrong })),
        &u.access,
    ));
    assert_error(&resp, 400, "Invalid verification code");
    // malformed code
    let resp = h.call(bearer(
        post("/2fa/totp/verify-setup", json!({ "code": "12345" })),
        &u.access,
    ));
    assert_error(&resp, 400, "Validation error: code must be 6 digits");
    let resp = h.call(bearer(post("/2fa/totp/verify-setup", json!({})), &u.access));
    assert_error(&resp, 400, "Validation error: code is required");
    // a code two steps old is expired
    let resp = h.call(bearer(
        post(
            "/2fa/totp/verify-setup",
            json!({ "code": totp_code(&secret, now - 60) }),
        ),
        &u.access,
    ));
    assert_error(&resp, 400, "Invalid verification code");
    // variant: secret given but not the pending one
    let resp = h.call(bearer(
        post(
            "/2fa/totp/verify",
            json!({ "code": totp_code(&secret, now), "secret": "JBSWY3DPEHPK3PXP" }),
        ),
        &u.access,
    ));
    assert_error(&resp, 400, "Invalid verification code");
    // pending → correct (variant path and secret field): enabled
    let resp = h.call(bearer(
        post(
            "/2fa/totp/verify",
            json!({ "code": totp_code(&secret, now), "secret": secret }),
        ),
        &u.access,
    ));
    assert_eq!(data(&resp), json!({ "enabled": true, "method": "totp" }));
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["twoFactorEnabled"], true);
    assert_eq!(me["methods"], json!(["totp"]));
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 10, "total": 10 })
    );
}

#[test]
fn pending_setup_expires_after_fifteen_minutes() {
    let mut h = Harness::new();
    let u = register(&mut h, "carl");
    let d = data(&h.call(bearer(post("/2fa/totp/setup", json!({})), &u.access)));
    let secret = d["secret"].as_str().unwrap().to_string();
    h.advance_secs(15 * 60);
    let code = totp_code(&secret, now_secs(&h));
    // The access token expired too; log in again.
    let access = data(&login(&mut h, "carl", "192.0.2.1"))["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = h.call(bearer(
        post("/2fa/totp/verify-setup", json!({ "code": code })),
        &access,
    ));
    assert_error(&resp, 400, "2FA setup not initiated");
}

#[test]
fn login_with_totp() {
    let mut h = Harness::new();
    let u = register(&mut h, "dana");
    let (secret, _) = enable_totp(&mut h, &u);
    let resp = login(&mut h, "dana", "192.0.2.1");
    let d = data(&resp);
    assert_eq!(d["requiresTwoFactor"], true);
    assert_eq!(d["requires2FA"], true);
    assert_eq!(d["availableMethods"], json!(["totp", "backup"]));
    assert!(d.get("accessToken").is_none());
    assert!(resp.header_value("set-cookie").is_none());
    let temp = d["tempToken"].as_str().unwrap();
    // The temp token is not an access token.
    assert_error(
        &h.call(bearer(get("/auth/me"), temp)),
        401,
        "Invalid or expired token",
    );
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)) }),
    ));
    let d = data(&resp);
    assert!(d.get("deviceToken").is_none());
    let access = d["accessToken"].as_str().unwrap();
    assert_eq!(
        data(&h.call(bearer(get("/auth/me"), access)))["id"],
        u.id.as_str()
    );
    // A temp token is exchanged once.
    h.advance_secs(30);
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)) }),
    ));
    assert_error(&resp, 400, "Invalid temp token");
}

#[test]
fn totp_window_edges_and_replay() {
    let mut h = Harness::new();
    let u = register(&mut h, "eve");
    let (secret, _) = enable_totp(&mut h, &u);
    // Align to the start of a step.
    let t = now_secs(&h);
    h.advance_secs(30 - t % 30);
    let now = now_secs(&h);
    let mut n = 0;
    let mut verify = |h: &mut Harness, code: String| {
        n += 1;
        let temp = temp_token(h, &u, &format!("192.0.2.{n}"));
        h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code }),
        ))
    };
    // Two steps away on either side: refused.
    assert_error(
        &verify(&mut h, totp_code(&secret, now - 60)),
        400,
        "Invalid verification code",
    );
    assert_error(
        &verify(&mut h, totp_code(&secret, now + 60)),
        400,
        "Invalid verification code",
    );
    // One step back: accepted; replay of the same step: refused; an older step: refused.
    assert_eq!(verify(&mut h, totp_code(&secret, now - 30)).status, 200);
    assert_error(
        &verify(&mut h, totp_code(&secret, now - 30)),
        400,
        "Invalid verification code",
    );
    // The current step: accepted once.
    assert_eq!(verify(&mut h, totp_code(&secret, now)).status, 200);
    assert_error(
        &verify(&mut h, totp_code(&secret, now)),
        400,
        "Invalid verification code",
    );
    // One step ahead: accepted; then the current step (older) is refused.
    assert_eq!(verify(&mut h, totp_code(&secret, now + 30)).status, 200);
    h.advance_secs(29);
    let current = totp_code(&secret, now_secs(&h));
    assert_error(&verify(&mut h, current), 400, "Invalid verification code");
}

#[test]
fn verify_errors() {
    let mut h = Harness::new();
    let u = register(&mut h, "fay");
    let (secret, _) = enable_totp(&mut h, &u);
    let code = totp_code(&secret, now_secs(&h));
    assert_error(
        &h.call(post("/2fa/verify", json!({ "code": code }))),
        400,
        "Validation error: tempToken is required",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": "x", "code": code }),
        )),
        400,
        "Invalid temp token",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": u.access, "code": code }),
        )),
        400,
        "Invalid temp token",
    );
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": "12a456" }),
        )),
        400,
        "Validation error: code must be 6 digits",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code, "method": "pigeon" }),
        )),
        400,
        "Validation error: method must be totp, sms or email",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code, "trustDevice": "yes" }),
        )),
        400,
        "Validation error: trustDevice must be a boolean",
    );
    // Temp token lifetime: 5 minutes.
    h.advance_secs(300);
    let code = totp_code(&secret, now_secs(&h));
    assert_error(
        &h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": code }),
        )),
        400,
        "Invalid temp token",
    );
}

#[test]
fn temp_token_dies_after_five_wrong_codes() {
    let mut h = Harness::new();
    let u = register(&mut h, "gus");
    let (secret, _) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let good = totp_code(&secret, now_secs(&h));
    let bad = wrong_code(&good);
    for _ in 0..5 {
        let resp = h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": bad }),
        ));
        assert_error(&resp, 400, "Invalid verification code");
    }
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": good }),
    ));
    assert_error(&resp, 400, "Invalid temp token");
    // A new login gets a new token that works.
    let temp = temp_token(&mut h, &u, "192.0.2.2");
    assert_eq!(
        h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": good })
        ))
        .status,
        200
    );
}

#[test]
fn delete_totp_disables_2fa_and_voids_backup_codes() {
    let mut h = Harness::new();
    let u = register(&mut h, "hal");
    let (_, backups) = enable_totp(&mut h, &u);
    let resp = h.call(bearer(delete("/2fa/totp"), &u.access));
    assert_eq!(data(&resp)["message"], "TOTP disabled");
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["twoFactorEnabled"], false);
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 0, "total": 0 })
    );
    // Login no longer asks for a second factor; backup codes are gone.
    let d = data(&login(&mut h, "hal", "192.0.2.1"));
    assert!(d["accessToken"].is_string());
    assert_error(
        &h.call(bearer(delete("/2fa/totp"), &u.access)),
        404,
        "Resource not found",
    );
    assert_error(
        &h.call(bearer(
            post("/2fa/backup-codes/generate", json!({})),
            &u.access,
        )),
        400,
        "No 2FA method available",
    );
    let _ = backups;
}

#[test]
fn methods_list_and_last_method_rule() {
    let mut h = Harness::new();
    let u = register(&mut h, "ida");
    assert_eq!(
        data(&h.call(bearer(get("/2fa/methods"), &u.access))),
        json!({ "methods": [] })
    );
    enable_totp(&mut h, &u);
    let d = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    let m = &d["methods"][0];
    assert_eq!(m["type"], "totp");
    assert_eq!(m["enabled"], true);
    assert!(m["verifiedAt"].is_string() && m["createdAt"].is_string());
    assert!(
        m.get("secret").is_none(),
        "the TOTP secret never leaves after setup"
    );
    let id = m["id"].as_str().unwrap().to_string();
    let resp = h.call(bearer(delete(&format!("/2fa/methods/{id}")), &u.access));
    assert_error(
        &resp,
        400,
        "Cannot remove the last 2FA method while 2FA is enabled",
    );
    assert_error(
        &h.call(bearer(
            delete("/2fa/methods/00000000-0000-4000-8000-000000000000"),
            &u.access,
        )),
        404,
        "Resource not found",
    );
}
