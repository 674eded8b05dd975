//! Login does the same Argon2 work whether or not the account exists.
//!
//! `argon2_invocations()` is process-wide and tests of one binary run on
//! parallel threads, so this file is its own test binary holding one test
//! (and a lock, should another ever be added): no other hashing can happen
//! between two readings, and the counts are compared for equality.

mod common;

use std::sync::Mutex;

use common::*;
use serde_json::json;
use tfa_core::crypto::password::argon2_invocations;
use tfa_core::testing::Harness;

static COUNTER: Mutex<()> = Mutex::new(());

/// Argon2 computations made by one login attempt.
fn hashes_for(h: &mut Harness, ident: &str, password: &str, ip: &str) -> (u16, u64) {
    let before = argon2_invocations();
    let resp = h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": ident, "password": password }),
        )
        .peer(ip),
    );
    (resp.status, argon2_invocations() - before)
}

#[test]
fn unknown_user_costs_exactly_what_a_wrong_password_costs() {
    let _only_me = COUNTER.lock().unwrap_or_else(|e| e.into_inner());
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let _ = enable_totp(&mut h, &u);

    let wrong = hashes_for(&mut h, "alice@example.com", "Wr0ng!Password", "192.0.2.1");
    let wrong_by_name = hashes_for(&mut h, "alice", "Wr0ng!Password", "192.0.2.2");
    let unknown = hashes_for(&mut h, "nobody@example.com", "Wr0ng!Password", "192.0.2.3");
    let unknown_by_name = hashes_for(&mut h, "nobody", "Wr0ng!Password", "192.0.2.4");
    let right = hashes_for(&mut h, "alice", PASSWORD, "192.0.2.5");
    assert_eq!(wrong, (401, 1));
    assert_eq!(wrong_by_name, (401, 1));
    assert_eq!(unknown, (401, 1));
    assert_eq!(unknown_by_name, (401, 1));
    assert_eq!(right, (200, 1), "a 2FA user's password step");

    // Identifiers that can never match still cost one computation.
    for (i, ident) in ["x", "@", "a\u{0}b", &"a".repeat(300), "аlice"]
        .iter()
        .enumerate()
    {
        let got = hashes_for(
            &mut h,
            ident,
            "Wr0ng!Password",
            &format!("192.0.2.{}", 10 + i),
        );
        assert_eq!(got, (401, 1), "{ident:?}");
    }
    // An overlong password is refused before hashing, for both.
    let long = "A1!a".repeat(40);
    assert_eq!(hashes_for(&mut h, "alice", &long, "192.0.2.30"), (401, 0));
    assert_eq!(hashes_for(&mut h, "nobody", &long, "192.0.2.31"), (401, 0));
    // Refused by the rate limit: no hashing at all.
    for _ in 0..5 {
        hashes_for(&mut h, "nobody", "Wr0ng!Password", "192.0.2.40");
    }
    assert_eq!(
        hashes_for(&mut h, "nobody", "Wr0ng!Password", "192.0.2.40"),
        (429, 0)
    );
}
