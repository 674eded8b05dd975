//! Expired records are removed by the service itself, so storage does not
//! grow without bound.

mod common;

use common::*;
use serde_json::json;
use tfa_core::testing::Harness;

#[test]
fn storage_returns_to_its_baseline_after_everything_expires() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let (secret, _) = enable_totp(&mut h, &u);
    // Let the registration session and its windows expire and be swept.
    h.advance_secs(8 * 24 * 3600);
    h.call(get("/health"));
    for _ in 0..50 {
        h.advance_secs(300);
        h.call(get("/health/live"));
    }
    let baseline = h.store.len();

    // A burst of activity: logins, temp tokens, wrong codes, trusted devices,
    // rate-limit windows, a refresh, a lock.
    for i in 0..30 {
        let ip = format!("192.0.2.{i}");
        let temp = temp_token(&mut h, &u, &ip);
        let code = if i % 3 == 0 {
            totp_code(&secret, now_secs(&h))
        } else {
            "000000".into()
        };
        let resp = h.call(
            post(
                "/2fa/verify",
                json!({ "tempToken": temp, "code": code, "trustDevice": i % 6 == 0 }),
            )
            .peer(&ip),
        );
        if resp.status == 200 {
            let refresh = data(&resp)["refreshToken"].as_str().unwrap().to_string();
            h.call(post("/auth/refresh", json!({ "refreshToken": refresh })).peer(&ip));
        }
        h.advance_secs(31);
    }
    let busy = h.store.len();
    assert!(
        busy > baseline + 30,
        "activity stored things: {baseline} -> {busy}"
    );

    // 31 days later, with some traffic to drive the sweep, everything that
    // expired is gone.
    h.advance_secs(31 * 24 * 3600);
    for _ in 0..3000 {
        h.advance_secs(60);
        h.call(get("/health/live"));
    }
    let after = h.store.len();
    let leftovers: Vec<String> = h
        .store
        .keys()
        .into_iter()
        .filter(|k| {
            k.starts_with("rl:")
                || k.starts_with("tt")
                || k.starts_with("sess:")
                || k.starts_with("dev:")
                || k.starts_with("mfalock:")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Audit records are kept (retention is a policy of their own); only they grew.
    let audit = h
        .store
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("audit"))
        .count();
    assert!(
        after <= baseline + audit + 2,
        "baseline {baseline}, after {after}, audit {audit}: {:?}",
        h.store.keys()
    );
}
