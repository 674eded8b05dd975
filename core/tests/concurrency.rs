//! Concurrent requests through the interleaving store: state changes that
//! must happen once happen once.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use tfa_core::plumbing::lock::LEASE_MS;
use tfa_core::testing::{test_config, Harness, InterleavingStore, MemoryStore, T0_MS};
use tfa_core::Service;

type Shared = Arc<InterleavingStore<MemoryStore>>;

fn shared_harness() -> (Harness<Shared>, Shared, Arc<Service>) {
    let store = Arc::new(InterleavingStore::new(MemoryStore::new()));
    let h = Harness::with(test_config(&[]), store.clone());
    (h, store, Arc::new(Service::new(test_config(&[]))))
}

#[test]
fn fifty_concurrent_uses_of_one_backup_code_give_one_success() {
    let (mut h, store, service) = shared_harness();
    let email = "alice@example.com";
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": email, "username": "alice", "password": PASSWORD }),
    ));
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    let setup = data(&h.call(bearer(post("/2fa/totp/setup", json!({})), &access)));
    let secret = setup["secret"].as_str().unwrap().to_string();
    let code = setup["backupCodes"][0].as_str().unwrap().to_string();
    let resp = h.call(bearer(
        post(
            "/2fa/totp/verify-setup",
            json!({ "code": totp_code(&secret, h.now_ms / 1000) }),
        ),
        &access,
    ));
    assert_eq!(resp.status, 200);
    // 50 temp tokens, from 50 addresses (limits are per IP).
    let temps: Vec<String> = (0..50)
        .map(|i| {
            let resp = h.call(
                post(
                    "/auth/login",
                    json!({ "emailOrUsername": email, "password": PASSWORD }),
                )
                .peer(&format!("10.1.{}.{}", i / 5, i % 5)),
            );
            data(&resp)["tempToken"].as_str().unwrap().to_string()
        })
        .collect();
    let reqs = temps
        .iter()
        .enumerate()
        .map(|(i, t)| {
            post(
                "/2fa/verify-backup-code",
                json!({ "tempToken": t, "backupCode": code }),
            )
            .peer(&format!("10.2.{}.{}", i / 5, i % 5))
        })
        .collect();
    let responses = concurrently(&service, &store, h.now_ms, reqs);
    let ok: Vec<_> = responses.iter().filter(|r| r.status == 200).collect();
    assert_eq!(ok.len(), 1, "exactly one success");
    assert_eq!(ok[0].json()["data"]["remainingCodes"], 9);
    // The others are refused as reuse, or, once 20 of them have failed, by
    // the account lock.
    let mut reused = 0;
    for r in responses.iter().filter(|r| r.status != 200) {
        if r.status == 429 {
            assert_error(r, 429, "Too many requests. Please try again later.");
        } else {
            assert_error(r, 400, "This backup code has already been used");
            reused += 1;
        }
    }
    assert!(
        reused >= 19,
        "at least 19 reuses answered before the lock: {reused}"
    );
    assert_eq!(
        data(&h.call(bearer(get("/2fa/backup-codes/count"), &access))),
        json!({ "remaining": 9, "total": 10 })
    );
}

#[test]
fn twenty_concurrent_registrations_of_one_email_give_one_user() {
    let (mut h, store, service) = shared_harness();
    let reqs = (0..20)
        .map(|i| {
            post("/auth/register", json!({ "email": "Same@Example.com", "username": format!("user{i}"), "password": PASSWORD }))
                .peer(&format!("10.3.0.{i}"))
        })
        .collect();
    let responses = concurrently(&service, &store, T0_MS, reqs);
    let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
    assert_eq!(created.len(), 1);
    for r in responses.iter().filter(|r| r.status != 201) {
        assert_error(r, 409, "Email already registered");
    }
    let winner = created[0].json()["data"]["user"]["username"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = h.call(post(
        "/auth/login",
        json!({ "emailOrUsername": "same@example.com", "password": PASSWORD }),
    ));
    assert_eq!(data(&resp)["user"]["username"], winner.as_str());
    // The losers' usernames were released.
    let loser = (0..20)
        .map(|i| format!("user{i}"))
        .find(|n| *n != winner)
        .unwrap();
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": "other@example.com", "username": loser, "password": PASSWORD }),
        )
        .peer("10.4.0.1"),
    );
    assert_eq!(resp.status, 201);
    // Only one user record exists.
    let users = store
        .inner()
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("user:"))
        .count();
    assert_eq!(users, 2);
}

#[test]
fn thirty_concurrent_logins_from_one_ip_give_exactly_five_answers() {
    let (mut h, store, service) = shared_harness();
    h.call(post(
        "/auth/register",
        json!({ "email": "bob@example.com", "username": "bob", "password": PASSWORD }),
    ));
    let reqs = (0..30)
        .map(|_| {
            post(
                "/auth/login",
                json!({ "emailOrUsername": "bob", "password": PASSWORD }),
            )
            .peer("10.5.0.1")
        })
        .collect();
    let responses = concurrently(&service, &store, h.now_ms, reqs);
    let not_limited: Vec<_> = responses.iter().filter(|r| r.status != 429).collect();
    assert_eq!(not_limited.len(), 5);
    assert!(not_limited.iter().all(|r| r.status == 200));
}

#[test]
fn concurrent_uses_of_one_totp_code_give_one_success() {
    let (mut h, store, service) = shared_harness();
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": "carol@example.com", "username": "carol", "password": PASSWORD }),
    ));
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    let setup = data(&h.call(bearer(post("/2fa/totp/setup", json!({})), &access)));
    let secret = setup["secret"].as_str().unwrap().to_string();
    h.call(bearer(
        post(
            "/2fa/totp/verify-setup",
            json!({ "code": totp_code(&secret, h.now_ms / 1000) }),
        ),
        &access,
    ));
    h.advance_secs(30);
    let temps: Vec<String> = (0..10)
        .map(|i| {
            let resp = h.call(
                post(
                    "/auth/login",
                    json!({ "emailOrUsername": "carol", "password": PASSWORD }),
                )
                .peer(&format!("10.6.0.{i}")),
            );
            data(&resp)["tempToken"].as_str().unwrap().to_string()
        })
        .collect();
    let code = totp_code(&secret, h.now_ms / 1000);
    let reqs = temps
        .iter()
        .enumerate()
        .map(|(i, t)| {
            post("/2fa/verify", json!({ "tempToken": t, "code": code }))
                .peer(&format!("10.7.0.{i}"))
        })
        .collect();
    let responses = concurrently(&service, &store, h.now_ms, reqs);
    assert_eq!(responses.iter().filter(|r| r.status == 200).count(), 1);
}

#[test]
fn concurrent_refreshes_with_one_token_never_leave_two_live_tokens() {
    let (mut h, store, service) = shared_harness();
    let resp = h.call(post(
        "/auth/register",
        json!({ "email": "dan@example.com", "username": "dan", "password": PASSWORD }),
    ));
    let refresh = data(&resp)["refreshToken"].as_str().unwrap().to_string();
    let reqs = (0..8)
        .map(|i| {
            post("/auth/refresh", json!({ "refreshToken": refresh })).peer(&format!("10.8.0.{i}"))
        })
        .collect();
    let responses = concurrently(&service, &store, h.now_ms, reqs);
    let winners: Vec<String> = responses
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| {
            r.json()["data"]["refreshToken"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(winners.len() <= 1, "one rotation at most");
    // Whatever happened, at most one refresh token works afterwards.
    let live = winners
        .iter()
        .filter(|t| {
            h.call(post("/auth/refresh", json!({ "refreshToken": t })).peer("10.9.0.1"))
                .status
                == 200
        })
        .count();
    assert!(live <= 1);
}

#[test]
fn one_backup_code_used_from_clocks_on_both_sides_of_a_lease_boundary_succeeds_once() {
    // Record updates are serialised by a lock keyed by the lease period of
    // the caller's clock; callers in neighbouring periods must still
    // exclude each other.
    let (mut h, store, service) = shared_harness();
    let user = register(&mut h, "erin");
    let (_, backups) = enable_totp(&mut h, &user);
    let temps: Vec<String> = (0..16)
        .map(|i| temp_token(&mut h, &user, &format!("10.11.0.{i}")))
        .collect();
    let boundary = (h.now_ms / LEASE_MS + 1) * LEASE_MS;
    let reqs = temps
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let now = if i % 2 == 0 { boundary - 1 } else { boundary };
            let req = post(
                "/2fa/verify-backup-code",
                json!({ "tempToken": t, "backupCode": backups[3] }),
            )
            .peer(&format!("10.12.0.{i}"));
            (now, req)
        })
        .collect();
    let responses = concurrently_at(&service, &store, reqs);
    assert_eq!(responses.iter().filter(|r| r.status == 200).count(), 1);
    for r in responses.iter().filter(|r| r.status != 200) {
        assert_error(r, 400, "This backup code has already been used");
    }
    // No lock is left behind.
    let locks: Vec<String> = store
        .inner()
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("lk:"))
        .collect();
    assert!(locks.is_empty(), "{locks:?}");
}

#[test]
fn a_session_ended_while_it_is_refreshed_stays_ended() {
    // Logout removes the session record under the record's lock, so a
    // refresh that read it just before cannot write it back.
    for round in 0..10 {
        let (mut h, store, service) = shared_harness();
        let user = register(&mut h, &format!("fay{round}"));
        let reqs = vec![
            post("/auth/refresh", json!({ "refreshToken": user.refresh })).peer("10.13.0.1"),
            bearer(post("/auth/logout", json!({})), &user.access).peer("10.13.0.2"),
        ];
        let responses = concurrently(&service, &store, h.now_ms, reqs);
        assert_eq!(responses[1].status, 200, "logout answers 200");
        let sessions: Vec<String> = store
            .inner()
            .keys()
            .into_iter()
            .filter(|k| k.starts_with("sess:"))
            .collect();
        assert!(sessions.is_empty(), "round {round}: {sessions:?}");
        // Whatever the refresh answered, its token does not work now.
        if responses[0].status == 200 {
            let rotated = responses[0].json()["data"]["refreshToken"]
                .as_str()
                .unwrap()
                .to_string();
            let again =
                h.call(post("/auth/refresh", json!({ "refreshToken": rotated })).peer("10.13.0.3"));
            assert_eq!(again.status, 401, "round {round}");
        }
    }
}

/// What [`BeforeExchange`] runs.
type Hook = Box<dyn FnOnce(&MemoryStore) + Send>;

/// A store that runs a hook once, just before the first exchange of a temp
/// token (`increment` by `mfa::EXCHANGED`): another request finishes there.
struct BeforeExchange {
    inner: MemoryStore,
    hook: std::sync::Mutex<Option<Hook>>,
}

impl tfa_core::Store for BeforeExchange {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, tfa_core::StoreError> {
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), tfa_core::StoreError> {
        self.inner.set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), tfa_core::StoreError> {
        self.inner.delete(key)
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, tfa_core::StoreError> {
        if delta == tfa_core::api::mfa::EXCHANGED {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook(&self.inner);
            }
        }
        self.inner.increment(key, delta)
    }
}

/// Two temp tokens check one backup code, and the other spends it between
/// this one's check and its exchange: this one loses the race, counts as a
/// failure, and gets its token back (one attempt used), so the user can
/// finish with another code. Its counter says "not exchanged" again.
#[test]
fn an_exchange_that_loses_the_race_for_its_code_gives_the_token_back() {
    use tfa_core::testing::SeededRng;
    use tfa_core::Env;
    let store = Arc::new(BeforeExchange {
        inner: MemoryStore::new(),
        hook: std::sync::Mutex::new(None),
    });
    let mut h = Harness::with(test_config(&[]), store.clone());
    let u = register(&mut h, "erin");
    let (_, backups) = enable_totp(&mut h, &u);
    let winner = temp_token(&mut h, &u, "192.0.2.30");
    let loser = temp_token(&mut h, &u, "192.0.2.31");
    let service = Service::new(test_config(&[]));
    let now_ms = h.now_ms;
    let code = backups[0].clone();
    let won = Arc::new(std::sync::Mutex::new(None));
    let (won2, body) = (
        won.clone(),
        json!({ "tempToken": winner, "backupCode": code }),
    );
    *store.hook.lock().unwrap() = Some(Box::new(move |inner: &MemoryStore| {
        let mut rng = SeededRng::new(77);
        let mut env = Env {
            store: inner,
            rng: &mut rng,
            now_ms,
        };
        let req = post("/2fa/verify-backup-code", body).peer("192.0.2.30");
        *won2.lock().unwrap() = Some(respond(&service, &mut env, &req).status);
    }));
    let resp = h.call(
        post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": loser, "backupCode": code }),
        )
        .peer("192.0.2.31"),
    );
    assert_eq!(
        *won.lock().unwrap(),
        Some(200),
        "the other request ran first"
    );
    assert_error(&resp, 400, "This backup code has already been used");
    let resp = h.call(
        post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": loser, "backupCode": backups[1] }),
        )
        .peer("192.0.2.31"),
    );
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    assert_eq!(data(&resp)["remainingCodes"], 8);
    // Both tokens are spent now.
    for t in [&winner, &loser] {
        let resp = h.call(post(
            "/2fa/verify-backup-code",
            json!({ "tempToken": t, "backupCode": backups[2] }),
        ));
        assert_error(&resp, 400, "Invalid temp token");
    }
}
