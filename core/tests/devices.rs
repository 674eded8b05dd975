//! Trusted devices: granted at verification, used at login, 30-day expiry,
//! listing and removal.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::Harness;

/// Logs in with TOTP and trustDevice; returns (access token, device token).
fn trust(
    h: &mut Harness,
    u: &User,
    secret: &str,
    ip: &str,
    name: Option<&str>,
) -> (String, String) {
    let temp = temp_token(h, u, ip);
    let mut body =
        json!({ "tempToken": temp, "code": totp_code(secret, now_secs(h)), "trustDevice": true });
    if let Some(n) = name {
        body["deviceName"] = json!(n);
    }
    let resp = h.call(
        post("/2fa/verify", body)
            .peer(ip)
            .header("User-Agent", "Firefox/130"),
    );
    let d = data(&resp);
    h.advance_secs(30);
    (
        d["accessToken"].as_str().unwrap().to_string(),
        d["deviceToken"].as_str().unwrap().to_string(),
    )
}

#[test]
fn trusted_device_skips_2fa_for_thirty_days() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (secret, _) = enable_totp(&mut h, &u);
    let (_, device) = trust(&mut h, &u, &secret, "192.0.2.1", Some("  Alice's laptop  "));

    // Body field.
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "alice", "password": PASSWORD, "deviceToken": device }),
        )
        .peer("192.0.2.2"),
    );
    let d = data(&resp);
    assert!(d["accessToken"].is_string(), "{d}");
    assert!(d.get("tempToken").is_none());
    // Header variant.
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "alice", "password": PASSWORD }),
        )
        .header("X-Device-Token", &device)
        .peer("192.0.2.3"),
    );
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    let list = data(&h.call(bearer(get("/2fa/devices"), &access)));
    let dev = &list["devices"][0];
    assert_eq!(dev["deviceName"], "Alice's laptop");
    assert_eq!(dev["ipAddress"], "192.0.2.1");
    assert_eq!(dev["userAgent"], "Firefox/130");
    assert_eq!(
        dev["lastUsedAt"],
        tfa_core::plumbing::util::iso8601(h.now_ms)
    );
    // A wrong password with the device token is still refused.
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "alice", "password": "Wr0ng!pass", "deviceToken": device }),
        )
        .peer("192.0.2.4"),
    );
    assert_error(&resp, 401, "Invalid email or password");

    // 30 days later the device is expired: 2FA again.
    h.advance_secs(30 * 24 * 3600);
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "alice", "password": PASSWORD, "deviceToken": device }),
        )
        .peer("192.0.2.5"),
    );
    assert_eq!(data(&resp)["requiresTwoFactor"], true);
}

#[test]
fn device_token_of_another_user_or_removed_device_does_not_skip() {
    let mut h = Harness::new();
    let a = register(&mut h, "bob");
    let (secret_a, _) = enable_totp(&mut h, &a);
    let (access_a, device_a) = trust(&mut h, &a, &secret_a, "192.0.2.1", None);
    let b = register(&mut h, "carol");
    enable_totp(&mut h, &b);
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "carol", "password": PASSWORD, "deviceToken": device_a }),
        )
        .peer("192.0.2.2"),
    );
    assert_eq!(data(&resp)["requiresTwoFactor"], true);
    // Garbage and other token kinds are ignored, not errors.
    for t in ["garbage", &a.access] {
        let resp = h.call(
            post(
                "/auth/login",
                json!({ "emailOrUsername": "bob", "password": PASSWORD, "deviceToken": t }),
            )
            .peer("192.0.2.3"),
        );
        assert_eq!(data(&resp)["requiresTwoFactor"], true);
    }
    // Remove the device: the token stops working.
    let list = data(&h.call(bearer(get("/2fa/devices"), &access_a)));
    let id = list["devices"][0]["id"].as_str().unwrap().to_string();
    let resp = h.call(bearer(delete(&format!("/2fa/devices/{id}")), &access_a));
    assert_eq!(data(&resp)["message"], "Device removed");
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "bob", "password": PASSWORD, "deviceToken": device_a }),
        )
        .peer("192.0.2.4"),
    );
    assert_eq!(data(&resp)["requiresTwoFactor"], true);
    assert_error(
        &h.call(bearer(delete(&format!("/2fa/devices/{id}")), &access_a)),
        404,
        "Resource not found",
    );
    assert_error(
        &h.call(bearer(delete("/2fa/devices/not-a-uuid"), &access_a)),
        404,
        "Resource not found",
    );
}

#[test]
fn delete_all_devices_counts_them() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    let (secret, _) = enable_totp(&mut h, &u);
    let (access, _) = trust(&mut h, &u, &secret, "192.0.2.1", Some("one"));
    trust(&mut h, &u, &secret, "192.0.2.2", Some("two"));
    assert_eq!(
        data(&h.call(bearer(get("/2fa/devices"), &access)))["devices"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let resp = h.call(bearer(delete("/2fa/devices"), &access));
    assert_eq!(
        data(&resp),
        json!({ "message": "All trusted devices removed", "removedCount": 2 })
    );
    assert_eq!(
        data(&h.call(bearer(get("/2fa/devices"), &access))),
        json!({ "devices": [] })
    );
    assert_eq!(
        data(&h.call(bearer(delete("/2fa/devices"), &access)))["removedCount"],
        0
    );
}

#[test]
fn device_name_rules() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    let (secret, _) = enable_totp(&mut h, &u);
    let temp = temp_token(&mut h, &u, "192.0.2.1");
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": totp_code(&secret, now_secs(&h)), "trustDevice": true, "deviceName": "evil\r\nname" }),
    ));
    assert_error(
        &resp,
        400,
        "Validation error: deviceName must not contain control characters",
    );
    let long = "x".repeat(300);
    let (access, _) = trust(&mut h, &u, &secret, "192.0.2.2", Some(&long));
    let list = data(&h.call(bearer(get("/2fa/devices"), &access)));
    assert_eq!(
        list["devices"][0]["deviceName"].as_str().unwrap().len(),
        100
    );
}

#[test]
fn trusted_device_login_has_mfa_in_the_access_token() {
    let mut h = Harness::new();
    let u = register(&mut h, "fay");
    let (secret, _) = enable_totp(&mut h, &u);
    let (_, device) = trust(&mut h, &u, &secret, "192.0.2.1", None);
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": "fay", "password": PASSWORD, "deviceToken": device }),
        )
        .peer("192.0.2.2"),
    );
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    let payload = access.split('.').nth(1).unwrap();
    use base64::Engine;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["mfa"], true);
    assert_eq!(claims["typ"], "access");
    // A password-only login of a user without 2FA has mfa false.
    let v = register(&mut h, "gwen");
    let payload = v.access.split('.').nth(1).unwrap().to_string();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["mfa"], false);
}

#[test]
fn the_oldest_device_ends_beyond_the_limit() {
    use tfa_core::api::devices::MAX_DEVICES;
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    let (secret, _) = enable_totp(&mut h, &u);
    let mut devices = Vec::new();
    let mut access = String::new();
    for i in 0..MAX_DEVICES {
        let (a, d) = trust(&mut h, &u, &secret, &format!("192.0.2.{}", i + 1), None);
        access = a;
        devices.push(d);
    }
    let listed = |h: &mut Harness, token: &str| {
        data(&h.call(bearer(get("/2fa/devices"), token)))["devices"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(listed(&mut h, &access), MAX_DEVICES);
    let skips = |h: &mut Harness, device: &str, ip: &str| {
        let resp = h.call(
            post(
                "/auth/login",
                json!({ "emailOrUsername": "erin", "password": PASSWORD, "deviceToken": device }),
            )
            .peer(ip),
        );
        data(&resp).get("requiresTwoFactor").is_none()
    };
    assert!(skips(&mut h, &devices[0], "198.51.100.1"));

    // One more: the first device is no longer trusted, the others are.
    let (access, newest) = trust(&mut h, &u, &secret, "192.0.2.200", Some("newest"));
    assert_eq!(listed(&mut h, &access), MAX_DEVICES);
    assert!(!skips(&mut h, &devices[0], "198.51.100.2"));
    for d in [&devices[1], &newest] {
        assert!(skips(&mut h, d, "198.51.100.3"));
    }
    let removed = audit_record(&mut h, &access, 10, "trusted_device_removed");
    assert_eq!(removed["details"]["reason"], "device_limit");
    assert_eq!(removed["details"]["removedCount"], 1);
}
