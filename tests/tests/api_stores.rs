//! Storage through the real component: data surviving a restart, two hosts
//! sharing one real Redis, concurrency, store failures.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use e2e::api::*;
use e2e::client::Client;
use e2e::procs::{Host, HostOptions, Redis};
use serde_json::json;

#[test]
fn data_survives_a_clean_restart() {
    let host = Host::start(HostOptions::default());
    let c = host.client.clone();
    let u = register(&c, "dora");
    let (secret, backups, step) = enable_totp(&c, &u);
    let opts = host.restart_options();
    assert_eq!(host.stop(), Some(0), "SIGTERM ends the host cleanly");

    let host = Host::start(opts);
    let c = &host.client;
    // The session, the TOTP secret, the backup codes are all still there.
    assert_eq!(
        c.get("/api/auth/me", Some(&u.access)).data()["twoFactorEnabled"],
        true
    );
    assert_eq!(
        c.get("/api/2fa/backup-codes/count", Some(&u.access)).data(),
        json!({ "remaining": 10, "total": 10 })
    );
    let temp = temp_token(c, &u);
    let (code, _) = fresh_totp(&secret, step);
    assert!(c
        .post(
            "/api/2fa/verify",
            &json!({ "tempToken": temp, "code": code }),
            None
        )
        .data()["accessToken"]
        .is_string());
    let temp = temp_token(c, &u);
    assert_eq!(
        c.post(
            "/api/2fa/verify-backup-code",
            &json!({ "tempToken": temp, "backupCode": backups[1] }),
            None
        )
        .data()["remainingCodes"],
        9
    );
    // Registering the same e-mail again is still refused.
    c.post(
        "/api/auth/register",
        &json!({ "email": "dora@example.com", "username": "dora2", "password": PASSWORD }),
        None,
    )
    .assert_error(409, "Email already registered");
}

#[test]
fn two_hosts_share_one_redis() {
    let redis = Redis::start();
    let opts = HostOptions {
        kv_url: Some(redis.url()),
        ..Default::default()
    };
    let a = Host::start(opts.clone());
    let b = Host::start(opts);
    let (ca, cb) = (a.client.clone(), b.client.clone());
    let u = register(&ca, "erin");
    // Tokens from one host work on the other: one store, one set of keys.
    assert_eq!(
        cb.get("/api/auth/me", Some(&u.access)).data()["id"],
        u.id.as_str()
    );
    let (_, backups, _) = enable_totp(&ca, &u);
    let ta = temp_token(&ca, &u);
    let tb = temp_token(&cb, &u);
    // One backup code, presented to both hosts at once: exactly one success.
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = [(ca.clone(), ta), (cb.clone(), tb)]
        .into_iter()
        .map(|(c, t)| {
            let (barrier, code) = (barrier.clone(), backups[0].clone());
            std::thread::spawn(move || {
                barrier.wait();
                c.post(
                    "/api/2fa/verify-backup-code",
                    &json!({ "tempToken": t, "backupCode": code }),
                    None,
                )
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        results.iter().filter(|r| r.status == 200).count(),
        1,
        "{results:?}"
    );
    let loser = results.iter().find(|r| r.status != 200).unwrap();
    loser.assert_error(400, "This backup code has already been used");
    // Rate limits are counted across both hosts: 2 logins were made above;
    // 3 more split over the hosts, then both refuse.
    for c in [&ca, &cb, &ca] {
        assert_eq!(login(c, "erin").status, 200);
    }
    login(&cb, "erin").assert_error(429, "Too many requests. Please try again later.");
    login(&ca, "erin").assert_error(429, "Too many requests. Please try again later.");
}

#[test]
fn two_hundred_concurrent_requests_without_a_failure() {
    let host = Host::start(HostOptions {
        env: vec![("RATE_LIMIT_ENABLED".into(), "false".into())],
        ..Default::default()
    });
    let c = host.client.clone();
    let u = register(&c, "fred");
    enable_totp(&c, &u);
    let barrier = Arc::new(Barrier::new(200));
    let handles: Vec<_> = (0..200)
        .map(|i| {
            let (c, barrier, token) = (c.clone(), barrier.clone(), u.access.clone());
            std::thread::spawn(move || {
                barrier.wait();
                match i % 4 {
                    0 => c.get("/api/health", None),
                    1 => c.get("/api/auth/me", Some(&token)),
                    2 => c.get("/api/2fa/backup-codes/count", Some(&token)),
                    _ => c.post(
                        "/api/auth/login",
                        &json!({ "emailOrUsername": "fred", "password": "Wr0ng!pass" }),
                        None,
                    ),
                }
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.join().expect("no client panic");
        let expected = if i % 4 == 3 { 401 } else { 200 };
        assert_eq!(
            r.status,
            expected,
            "request {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

#[test]
fn a_failing_store_gives_503_and_the_host_keeps_serving() {
    let host = Host::start(HostOptions {
        env: vec![
            ("TFA_FAIL_STORE_AFTER".into(), "1".into()),
            ("TFA_FAIL_STORE_COUNT".into(), "1000000".into()),
        ],
        ..Default::default()
    });
    let c = &host.client;
    let r = c.get("/api/health", None);
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "unhealthy");
    c.post(
        "/api/auth/register",
        &json!({ "email": "g@example.com", "username": "gina", "password": PASSWORD }),
        None,
    )
    .assert_error(503, "Service unavailable");
    // Liveness does not touch the store.
    assert_eq!(c.get("/api/health/live", None).status, 200);
}

#[test]
fn bad_production_settings_answer_503() {
    let host = Host::start(HostOptions {
        env: vec![
            ("NODE_ENV".into(), "production".into()),
            ("JWT_ACCESS_SECRET".into(), "short".into()),
        ],
        ..Default::default()
    });
    let c = Client::new(host.port);
    c.get("/api/health", None)
        .assert_error(503, "Service unavailable");
    assert!(
        host.wait_output(
            "JWT_ACCESS_SECRET must be at least 32 characters",
            Duration::from_secs(5)
        ),
        "{}",
        host.output()
    );
}
