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

/// Issue #15: `GET /health` costs one store read and nothing after the
/// response; any other request with nothing due costs one read (`sched:next`)
/// after it; once a bucket comes due, the queues are checked and swept again.
#[test]
fn probes_cost_one_read_and_idle_requests_one_more() {
    use tfa_core::testing::{test_config, FailingStore, MemoryStore};
    let mut h = Harness::with(test_config(&[]), FailingStore::new(MemoryStore::new()));
    // The first requests set up the queue pointers (the retry queue starts
    // one bucket behind) and `sched:next`.
    h.call(get("/health/live"));
    h.call(get("/health/live"));
    let ops = |h: &Harness<FailingStore<MemoryStore>>| h.store.ops();

    let before = ops(&h);
    assert_eq!(h.call(get("/health")).status, 200);
    assert_eq!(ops(&h) - before, 1, "GET /health: the probe only");
    let before = ops(&h);
    assert_eq!(h.call(get("/health/ready")).status, 200);
    assert_eq!(ops(&h) - before, 1, "GET /health/ready: the probe only");
    let before = ops(&h);
    assert_eq!(h.call(get("/health/live")).status, 200);
    assert_eq!(ops(&h) - before, 1, "nothing due: one read of sched:next");

    // The webhook retry queue's next bucket (30 s) comes due: checked again.
    h.advance_secs(31);
    let before = ops(&h);
    h.call(get("/health/live"));
    assert!(ops(&h) - before > 1, "a due bucket is processed");
    let before = ops(&h);
    h.call(get("/health/live"));
    assert_eq!(ops(&h) - before, 1, "and then nothing is due again");
}
