//! Expired records are removed by the service itself, so storage does not
//! grow without bound.

mod common;

use common::*;
use serde_json::{json, Value};
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

/// Issue #15: a reply whose host skips this request's queue check
/// (`Reply::skip_maintenance`, what `tfa-host` asks of all but one request a
/// second) reads nothing after its response, even with a bucket due; its
/// audit record is still persisted. The next request that checks does the
/// due work.
#[test]
fn a_reply_that_skips_maintenance_reads_nothing_after_its_response() {
    use tfa_core::testing::{test_config, FailingStore, MemoryStore};
    let mut h = Harness::with(test_config(&[]), FailingStore::new(MemoryStore::new()));
    h.call(get("/health/live"));
    h.call(get("/health/live"));
    h.advance_secs(31);
    let ops = |h: &Harness<FailingStore<MemoryStore>>| h.store.ops();

    let mut reply = h.respond(get("/health/live"));
    assert!(reply.effects.contains(&tfa_core::Effect::Maintenance));
    reply.skip_maintenance();
    assert!(!reply.effects.contains(&tfa_core::Effect::Maintenance));
    let before = ops(&h);
    h.complete(reply.effects);
    assert_eq!(ops(&h) - before, 0, "a due bucket, but this request skips");

    // A failed login: its audit record is kept though the check is skipped.
    let mut reply = h.respond(post(
        "/auth/login",
        json!({ "emailOrUsername": "nobody", "password": PASSWORD }),
    ));
    assert_eq!(reply.response.status, 401);
    reply.skip_maintenance();
    assert!(reply
        .effects
        .iter()
        .any(|e| matches!(e, tfa_core::Effect::Audit(..))));

    let before = ops(&h);
    h.call(get("/health/live"));
    assert!(
        ops(&h) - before > 1,
        "the next check processes the due bucket"
    );
}

/// Issue #15: a `POST /2fa/verify` reads the user record twice (before the
/// check, and under the lock that spends the code and links the session),
/// never a third time for the webhook fan-out after the response, and its
/// temp token's one counter twice (reserving the attempt is the check that
/// one is left and that the token is unused; the exchange is the other). So
/// does a backup code. The events still reach the user's webhooks.
#[test]
fn a_second_factor_check_reads_the_user_twice_and_its_token_counter_twice() {
    use tfa_core::testing::{test_config, MemoryStore, RecordingStore};
    let mut h = Harness::with(test_config(&[]), RecordingStore::new(MemoryStore::new()));
    let u = register(&mut h, "alice");
    let (secret, backups) = enable_totp(&mut h, &u);
    let count = |ops: &[String], prefix: &str| ops.iter().filter(|o| o.starts_with(prefix)).count();
    let user_read = format!("get user:{}", u.id);
    // The store operations of one verification, and the event it announced
    // (the last webhook call's, if it made one).
    let verify = |h: &mut Harness<RecordingStore<MemoryStore>>, path: &str, body: Value| {
        let calls = h.webhook_calls.len();
        h.store.take();
        let resp = h.call(post(path, body));
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        let event = h.webhook_calls[calls..]
            .last()
            .map(|c| header(c, "x-webhook-event").to_string());
        h.advance_secs(30);
        (h.store.take(), event)
    };

    for hooks in [false, true] {
        if hooks {
            create_hook(&mut h, &u, json!(["2fa.verified", "backup_code.used"]));
        }
        let temp = temp_token(&mut h, &u, "192.0.2.9");
        let code = totp_code(&secret, now_secs(&h));
        let body = json!({ "tempToken": temp, "code": code });
        let (ops, event) = verify(&mut h, "/2fa/verify", body);
        assert_eq!(count(&ops, &user_read), 2, "{ops:#?}");
        // One increment reserves the attempt and checks the token is
        // unused, one exchanges it: no other counter of the token.
        assert_eq!(count(&ops, "increment tt:"), 2, "{ops:#?}");
        assert_eq!(count(&ops, "increment ttu:"), 0, "{ops:#?}");
        assert_eq!(event.as_deref(), hooks.then_some("2fa.verified"));

        let temp = temp_token(&mut h, &u, "192.0.2.9");
        let body = json!({ "tempToken": temp, "backupCode": backups[usize::from(hooks)] });
        let (ops, event) = verify(&mut h, "/2fa/verify-backup-code", body);
        assert_eq!(count(&ops, &user_read), 2, "{ops:#?}");
        assert_eq!(count(&ops, "increment tt:"), 2, "{ops:#?}");
        assert_eq!(event.as_deref(), hooks.then_some("backup_code.used"));
    }
}

/// Issue #15, target 3: what a request creates that expires (a rate-limit
/// window, a temp token's counters, a session, a trusted device) is filed in
/// the expiry index after the response, so no index write is on the
/// client's wait; the storage test above shows it is swept all the same. A
/// registration's claims are the exception: filed before they are taken,
/// because one left unswept would keep its name taken.
#[test]
fn expiries_are_filed_after_the_response_except_claims() {
    use tfa_core::testing::{test_config, MemoryStore, RecordingStore};
    use tfa_core::Store;
    let mut h = Harness::with(test_config(&[]), RecordingStore::new(MemoryStore::new()));
    // Writes to the index (the reads below are this test's own).
    let index = |ops: &[String]| -> Vec<String> {
        let writes = ["set hk:", "increment hk:", "delete hk:"];
        let ours = |o: &&String| writes.iter().any(|w| o.starts_with(w));
        ops.iter().filter(ours).cloned().collect()
    };
    // The entries filed by `ops`, read back from the store.
    let filed = |h: &Harness<RecordingStore<MemoryStore>>, ops: &[String]| -> Vec<String> {
        ops.iter()
            .filter_map(|o| o.strip_prefix("set hk:e:"))
            .map(|k| {
                let v = h.store.get(&format!("hk:e:{k}")).unwrap().unwrap();
                String::from_utf8(v).unwrap()
            })
            .collect()
    };

    h.store.take();
    let body = json!({ "email": "carol@example.com", "username": "carol", "password": PASSWORD });
    let reply = h.respond(post("/auth/register", body));
    assert_eq!(reply.response.status, 201);
    let before = h.store.take();
    let claims = filed(&h, &before);
    assert_eq!(
        claims,
        ["c|claim:email:carol@example.com", "c|claim:username:carol"],
        "{before:#?}"
    );
    h.complete(reply.effects);
    let u = register(&mut h, "alice");
    let (secret, _) = enable_totp(&mut h, &u);

    // No index write before the answer; after it, an entry for each prefix.
    let files_after_the_answer = |h: &mut Harness<RecordingStore<MemoryStore>>,
                                  reply: tfa_core::Reply,
                                  prefixes: &[&str]| {
        let before = h.store.take();
        assert_eq!(index(&before), Vec::<String>::new(), "{before:#?}");
        h.complete(reply.effects);
        let after = h.store.take();
        let entries = filed(h, &after);
        for prefix in prefixes {
            let found = entries.iter().any(|e| e.starts_with(prefix));
            assert!(found, "{prefix}: {entries:?}");
        }
    };
    h.store.take();
    let login = json!({ "emailOrUsername": u.email, "password": PASSWORD });
    let reply = h.respond(post("/auth/login", login).peer("192.0.2.40"));
    assert_eq!(reply.response.status, 200);
    let temp = data(&reply.response)["tempToken"]
        .as_str()
        .unwrap()
        .to_string();
    files_after_the_answer(&mut h, reply, &["c|rl:login:192.0.2.40:", "c|tt:"]);

    let code = totp_code(&secret, now_secs(&h));
    let body = json!({ "tempToken": temp, "code": code, "trustDevice": true });
    let reply = h.respond(post("/2fa/verify", body).peer("192.0.2.40"));
    assert_eq!(reply.response.status, 200);
    files_after_the_answer(
        &mut h,
        reply,
        &["c|rl:verify:192.0.2.40:", "r|sess:", "r|dev:"],
    );
}

/// An exhausted temp token is refused by the increment that would reserve
/// its next attempt, with no read of its counter first; when the account is
/// locked as well, the lock is what is said (and the counter is read once,
/// to tell an exchanged token, which is refused as that, from this one).
#[test]
fn an_exhausted_temp_token_on_a_locked_account_reports_the_lock() {
    use tfa_core::testing::{test_config, MemoryStore};
    let mut h = Harness::with(
        test_config(&[("RATE_LIMIT_ENABLED", "false")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "bob");
    let (secret, _) = enable_totp(&mut h, &u);
    let wrong = |h: &Harness, temp: &str| {
        let bad = wrong_code(&totp_code(&secret, now_secs(h)));
        post("/2fa/verify", json!({ "tempToken": temp, "code": bad }))
    };
    // 20 consecutive failures lock the account: four tokens of five.
    let mut temp = String::new();
    for i in 0..4 {
        temp = temp_token(&mut h, &u, "192.0.2.20");
        for _ in 0..5 {
            let req = wrong(&h, &temp);
            assert_error(&h.call(req), 400, "Invalid verification code");
        }
        if i == 0 {
            // Used up, not locked: the token is what is refused (and the
            // refusal is not one more failure of the account).
            let req = wrong(&h, &temp);
            assert_error(&h.call(req), 400, "Invalid temp token");
        }
    }
    let req = wrong(&h, &temp);
    assert_error(
        &h.call(req),
        429,
        "Too many requests. Please try again later.",
    );
}

/// A temp token that was exchanged is refused as that, not with the lock's
/// 429, when the account has been locked since; the check costs its counter
/// read only on a locked account. A token that only failed (here with a
/// backup code another token spent) is not exchanged: on a locked account
/// it gets the 429. (A token an exchange gives back is in concurrency.rs.)
#[test]
fn an_exchanged_temp_token_on_a_locked_account_is_an_invalid_token() {
    use tfa_core::testing::{test_config, MemoryStore};
    let mut h = Harness::with(
        test_config(&[("RATE_LIMIT_ENABLED", "false")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "dora");
    let (secret, backups) = enable_totp(&mut h, &u);
    let used = temp_token(&mut h, &u, "192.0.2.21");
    let code = totp_code(&secret, now_secs(&h));
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": used, "code": code }),
    ));
    assert_eq!(resp.status, 200);
    // A backup code spent by one token, then tried by another.
    let first = temp_token(&mut h, &u, "192.0.2.21");
    let failed = temp_token(&mut h, &u, "192.0.2.21");
    let body = |t: &str| json!({ "tempToken": t, "backupCode": backups[0] });
    let resp = h.call(post("/2fa/verify-backup-code", body(&first)));
    assert_eq!(resp.status, 200);
    let resp = h.call(post("/2fa/verify-backup-code", body(&failed)));
    assert_error(&resp, 400, "This backup code has already been used");
    // 20 consecutive failures lock the account (the one above is the first).
    let bad = |h: &Harness| wrong_code(&totp_code(&secret, now_secs(h)));
    for _ in 0..19 {
        let temp = temp_token(&mut h, &u, "192.0.2.21");
        let resp = h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": bad(&h) }),
        ));
        assert_error(&resp, 400, "Invalid verification code");
    }
    for (temp, status, message) in [
        (&used, 400, "Invalid temp token"),
        (&first, 400, "Invalid temp token"),
        (&failed, 429, "Too many requests. Please try again later."),
    ] {
        let resp = h.call(post(
            "/2fa/verify",
            json!({ "tempToken": temp, "code": bad(&h) }),
        ));
        assert_error(&resp, status, message);
    }
}
