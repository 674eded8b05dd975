//! Backup codes: login with one, reuse, count, regeneration.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::Harness;

#[test]
fn backup_code_login_both_paths_and_field_names() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (_, codes) = enable_totp(&mut h, &u);
    // Path variant and `code` field; input normalised (lower case, hyphen, spaces).
    let messy = format!(" {}-{} ", codes[0][..5].to_lowercase(), &codes[0][5..]);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let resp = h.call(post(
        "/2fa/verify-backup",
        json!({ "tempToken": temp, "code": messy }),
    ));
    let d = data(&resp);
    assert_eq!(d["remainingCodes"], 9);
    assert!(d["accessToken"].is_string() && d["refreshToken"].is_string());
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 9, "total": 10 })
    );
    // Reuse: 400 already used, count unchanged.
    let temp = temp_token(&mut h, &u, "192.0.2.2");
    let resp = h.call(post(
        "/2fa/verify-backup-code",
        json!({ "tempToken": temp, "backupCode": codes[0] }),
    ));
    assert_error(&resp, 400, "This backup code has already been used");
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 9, "total": 10 })
    );
    // The canonical path and field.
    let resp = h.call(post(
        "/2fa/verify-backup-code",
        json!({ "tempToken": temp, "backupCode": codes[1] }),
    ));
    assert_eq!(data(&resp)["remainingCodes"], 8);
}

#[test]
fn wrong_backup_codes_and_errors() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    let (_, codes) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": temp, "backupCode": "ZZZZZZZZZZ" }),
        )),
        400,
        "Invalid verification code",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": temp, "backupCode": "short" }),
        )),
        400,
        "Invalid verification code",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": temp }),
        )),
        400,
        "Validation error: backupCode is required",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "backupCode": codes[0] }),
        )),
        400,
        "Validation error: tempToken is required",
    );
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": "nope", "backupCode": codes[0] }),
        )),
        400,
        "Invalid temp token",
    );
    // Another user's code does not work for this user.
    let other = register(&mut h, "carol");
    let (_, other_codes) = enable_totp(&mut h, &other);
    let resp = h.call(
        post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": temp, "backupCode": other_codes[0] }),
        )
        .peer("192.0.2.77"),
    );
    assert_error(&resp, 400, "Invalid verification code");
}

#[test]
fn regenerate_invalidates_the_old_set() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    let (_, old) = enable_totp(&mut h, &u);
    let resp = h.call(bearer(
        post("/2fa/backup-codes/generate", json!({})),
        &u.access,
    ));
    let new: Vec<String> = data(&resp)["backupCodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(new.len(), 10);
    assert!(new.iter().all(|c| !old.contains(c)));
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    assert_error(
        &h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": temp, "backupCode": old[3] }),
        )),
        400,
        "Invalid verification code",
    );
    let resp = h.call(post(
        "/2fa/verify-backup-code",
        json!({ "tempToken": temp, "backupCode": new[3] }),
    ));
    assert_eq!(data(&resp)["remainingCodes"], 9);
}

#[test]
fn generate_requires_2fa_and_auth() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    assert_error(
        &h.call(bearer(
            post("/2fa/backup-codes/generate", json!({})),
            &u.access,
        )),
        400,
        "No 2FA method available",
    );
    assert_error(
        &h.call(post("/2fa/backup-codes/generate", json!({}))),
        401,
        "Invalid or expired token",
    );
    assert_error(
        &h.call(get("/2fa/backup-codes/count")),
        401,
        "Invalid or expired token",
    );
}

#[test]
fn all_ten_codes_are_single_use() {
    let mut h = Harness::new();
    let u = register(&mut h, "fred");
    let (_, codes) = enable_totp(&mut h, &u);
    for (i, code) in codes.iter().enumerate() {
        let temp = temp_token(&mut h, &u, &format!("192.0.2.{i}"));
        let resp = h.call(
            post(
                "/2fa/verify-backup-code",
                json!({ "tempToken": temp, "backupCode": code }),
            )
            .peer(&format!("192.0.3.{i}")),
        );
        assert_eq!(data(&resp)["remainingCodes"], 9 - i);
    }
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access))),
        json!({ "remaining": 0, "total": 10 })
    );
    let d = data(&login(&mut h, "fred", "192.0.2.200"));
    assert_eq!(d["availableMethods"], json!(["totp"]));
}
