//! Storage through the real component: data surviving a restart, two hosts
//! sharing one real Redis, concurrency, store failures.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use e2e::api::*;
use e2e::client::Client;
use e2e::procs::{Host, HostOptions, Redis};
use serde_json::json;
use tfa_core::plumbing::ratelimit;

#[test]
fn data_survives_a_clean_restart() {
    survives_a_clean_restart(HostOptions::default());
}

/// The same with the log store (`KV_ENGINE=log`, local host only): SIGTERM
/// flushes what the work after the last responses wrote.
#[test]
fn data_survives_a_clean_restart_with_the_log_store() {
    survives_a_clean_restart(HostOptions {
        env: vec![("KV_ENGINE".into(), "log".into())],
        ..Default::default()
    });
}

fn survives_a_clean_restart(opts: HostOptions) {
    let env = opts.env.clone();
    let host = Host::start(opts);
    let c = host.client.clone();
    let u = register(&c, "dora");
    let (secret, backups, step) = enable_totp(&c, &u);
    let opts = HostOptions {
        env,
        ..host.restart_options()
    };
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
    // Counts the 15-minute login allowance across both hosts.
    within_one_rate_window(ratelimit::LOGIN, 60);
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

/// How many clients race in the two-host concurrency tests below.
const RACERS: usize = 20;

/// Two hosts on one fresh Redis, client addresses from `X-Forwarded-For`
/// (TRUST_PROXY), so the per-IP limits let every racer through.
fn two_hosts_on_one_redis(redis: &Redis) -> (Host, Host) {
    let opts = HostOptions {
        kv_url: Some(redis.url()),
        env: vec![("TRUST_PROXY".into(), "true".into())],
        ..Default::default()
    };
    (Host::start(opts.clone()), Host::start(opts))
}

/// `POST path` with `body` from client address `ip`.
fn post_as(c: &Client, ip: &str, path: &str, body: &serde_json::Value) -> e2e::client::Resp {
    c.post_from(path, body, None, &[("X-Forwarded-For", ip)])
}

/// Runs `requests` (client, ip, path, body) at once, one thread each.
fn race(
    requests: Vec<(Client, String, &'static str, serde_json::Value)>,
) -> Vec<e2e::client::Resp> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let handles: Vec<_> = requests
        .into_iter()
        .map(|(c, ip, path, body)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                post_as(&c, &ip, path, &body)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no client panic"))
        .collect()
}

/// The one answer with `status` among `results`; fails when any answer is a
/// 5xx or when not exactly one has `status` (printing them all).
fn one_winner(results: &[e2e::client::Resp], status: u16) -> &e2e::client::Resp {
    let all = results
        .iter()
        .map(|r| format!("{} {}", r.status, String::from_utf8_lossy(&r.body)))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(results.iter().all(|r| r.status < 500), "no 5xx:\n{all}");
    let winners: Vec<_> = results.iter().filter(|r| r.status == status).collect();
    assert_eq!(winners.len(), 1, "exactly one {status}:\n{all}");
    winners[0]
}

#[test]
fn concurrent_uses_of_one_backup_code_over_two_hosts_give_one_success() {
    let redis = Redis::start();
    let (a, b) = two_hosts_on_one_redis(&redis);
    let (ca, cb) = (a.client.clone(), b.client.clone());
    let u = register(&ca, "bea");
    let (_, backups, _) = enable_totp(&ca, &u);
    // One temp token per racer, each from an address of its own (logins
    // are limited per IP), alternately from either host.
    let requests = (0..RACERS)
        .map(|i| {
            let c = if i % 2 == 0 { &ca } else { &cb };
            let r = post_as(
                c,
                &format!("10.61.0.{i}"),
                "/api/auth/login",
                &json!({ "emailOrUsername": u.email, "password": PASSWORD }),
            );
            let temp = r.data()["tempToken"].as_str().unwrap().to_string();
            (
                c.clone(),
                format!("10.62.0.{i}"),
                "/api/2fa/verify-backup-code",
                json!({ "tempToken": temp, "backupCode": backups[0] }),
            )
        })
        .collect();
    let results = race(requests);
    assert_eq!(one_winner(&results, 200).data()["remainingCodes"], 9);
    for r in results.iter().filter(|r| r.status != 200) {
        if r.status == 429 {
            // The per-account lock after repeated failures.
            r.assert_error(429, "Too many requests. Please try again later.");
        } else {
            r.assert_error(400, "This backup code has already been used");
        }
    }
    // Both hosts agree on the count.
    for c in [&ca, &cb] {
        assert_eq!(
            c.get("/api/2fa/backup-codes/count", Some(&u.access)).data(),
            json!({ "remaining": 9, "total": 10 })
        );
    }
}

#[test]
fn concurrent_registrations_of_one_email_over_two_hosts_give_one_user() {
    let redis = Redis::start();
    let (a, b) = two_hosts_on_one_redis(&redis);
    let (ca, cb) = (a.client.clone(), b.client.clone());
    let requests = (0..RACERS)
        .map(|i| {
            let c = if i % 2 == 0 { &ca } else { &cb };
            (
                c.clone(),
                format!("10.63.0.{i}"),
                "/api/auth/register",
                json!({ "email": "Same@Example.com", "username": format!("same{i}"), "password": PASSWORD }),
            )
        })
        .collect();
    let results = race(requests);
    let created = one_winner(&results, 201);
    for r in results.iter().filter(|r| r.status != 201) {
        r.assert_error(409, "Email already registered");
    }
    let winner = created.data()["user"]["username"]
        .as_str()
        .unwrap()
        .to_string();
    // Either host logs the one user in, by the e-mail in any case.
    for (c, ip) in [(&ca, "10.64.0.1"), (&cb, "10.64.0.2")] {
        let r = post_as(
            c,
            ip,
            "/api/auth/login",
            &json!({ "emailOrUsername": "same@example.com", "password": PASSWORD }),
        );
        assert_eq!(r.data()["user"]["username"], winner.as_str());
    }
    // A loser's username was not kept.
    let loser = (0..RACERS)
        .map(|i| format!("same{i}"))
        .find(|n| *n != winner)
        .unwrap();
    let r = post_as(
        &cb,
        "10.64.0.3",
        "/api/auth/register",
        &json!({ "email": "other@example.com", "username": loser, "password": PASSWORD }),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

/// Webhooks with two hosts on one Redis: a hook registered through one host
/// receives, signed, the event that happens on the other; a failed first
/// attempt stays pending in the delivery log both hosts show, and a hook's
/// test event arrives once. (Retries after the back-off are covered on the
/// local host by `api_integrations`, which moves the component's clock.)
#[test]
fn webhooks_over_two_hosts_on_one_redis() {
    let redis = Redis::start();
    let receiver = e2e::fake::FakeServer::start();
    let opts = HostOptions {
        kv_url: Some(redis.url()),
        env: vec![
            ("WEBHOOK_ALLOW_PRIVATE".into(), "true".into()),
            ("ALLOWED_OUTBOUND_HOSTS".into(), receiver.base()),
        ],
        ..Default::default()
    };
    let (a, b) = (Host::start(opts.clone()), Host::start(opts));
    let (ca, cb) = (a.client.clone(), b.client.clone());
    let u = register(&ca, "hana");
    let hook = ca
        .post(
            "/api/webhooks",
            &json!({ "url": format!("{}/hook", receiver.base()), "events": ["user.login"] }),
            Some(&u.access),
        )
        .data();
    let (id, secret) = (
        hook["id"].as_str().unwrap().to_string(),
        hook["secret"].as_str().unwrap().to_string(),
    );
    receiver.statuses.lock().unwrap().push_back(500);
    assert_eq!(login(&cb, "hana").status, 200);
    let got = receiver.wait_for(1, Duration::from_secs(20));
    assert_eq!(got.len(), 1, "one delivery of user.login");
    assert_eq!(got[0].header("x-webhook-event"), Some("user.login"));
    assert!(tfa_core::signature::verify_signature(
        secret.as_bytes(),
        &got[0].body,
        got[0].header("x-webhook-signature").unwrap()
    ));
    // The failed attempt is recorded (after the response: bounded wait) and
    // both hosts show the same log.
    let path = format!("/api/webhooks/{id}/deliveries");
    let mut log = serde_json::Value::Null;
    for _ in 0..40 {
        log = ca.get(&path, Some(&u.access)).data();
        if log["deliveries"][0]["attempts"][0]["statusCode"] == 500 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(log["deliveries"][0]["status"], "pending", "{log}");
    assert_eq!(log["deliveries"][0]["attempts"][0]["statusCode"], 500);
    assert_eq!(cb.get(&path, Some(&u.access)).data(), log);
    // A test event through the other host arrives once, answered 200.
    let r = cb.post(
        &format!("/api/webhooks/{id}/test"),
        &json!({}),
        Some(&u.access),
    );
    assert!(r.status < 300, "{}", String::from_utf8_lossy(&r.body));
    let got = receiver.wait_for(2, Duration::from_secs(20));
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].header("x-webhook-event"), Some("webhook.test"));
}
