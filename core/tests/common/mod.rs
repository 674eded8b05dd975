//! Helpers shared by the scenario tests: a harness per test, and the steps
//! every flow starts with (register, enable TOTP, log in).
#![allow(dead_code)]

use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use tfa_core::api::webhooks::WebhookCall;
use tfa_core::crypto::totp;
use tfa_core::testing::{Harness, InterleavingStore, MemoryStore, SeededRng};
use tfa_core::{Env, Request, Response, Service, Step, Store};

pub const PASSWORD: &str = "Str0ng!Passw0rd";

pub fn post(path: &str, body: Value) -> Request {
    Request::new("POST", &format!("/api{path}")).json(&body.to_string())
}

pub fn get(path: &str) -> Request {
    Request::new("GET", &format!("/api{path}"))
}

pub fn delete(path: &str) -> Request {
    Request::new("DELETE", &format!("/api{path}"))
}

pub fn bearer(req: Request, token: &str) -> Request {
    req.header("Authorization", &format!("Bearer {token}"))
}

/// The `data` of a success envelope; panics with the body otherwise.
pub fn data(resp: &Response) -> Value {
    let v = resp.json();
    assert_eq!(
        v["success"],
        json!(true),
        "expected success, got {} {v}",
        resp.status
    );
    v["data"].clone()
}

/// Asserts a failure envelope with `status` and exactly `message`.
pub fn assert_error(resp: &Response, status: u16, message: &str) {
    let v = resp.json();
    assert_eq!(resp.status, status, "body: {v}");
    assert_eq!(v, json!({ "success": false, "error": message }));
}

#[derive(Clone)]
pub struct User {
    pub id: String,
    pub email: String,
    pub username: String,
    pub access: String,
    pub refresh: String,
}

/// Registers `name` (e-mail `{name}@example.com`) from its own IP so that the
/// per-IP register limit never interferes.
pub fn register<S: Store>(h: &mut Harness<S>, name: &str) -> User {
    let email = format!("{name}@example.com");
    let resp = h.call(
        post(
            "/auth/register",
            json!({ "email": email, "username": name, "password": PASSWORD }),
        )
        .peer(&format!("198.51.100.{}", name.len() % 250 + 1)),
    );
    assert_eq!(resp.status, 201, "{}", String::from_utf8_lossy(&resp.body));
    let d = data(&resp);
    User {
        id: d["user"]["id"].as_str().unwrap().to_string(),
        email,
        username: name.to_string(),
        access: d["accessToken"].as_str().unwrap().to_string(),
        refresh: d["refreshToken"].as_str().unwrap().to_string(),
    }
}

/// Registers a webhook of `u` at `https://hooks.example.com/tfa` for
/// `events`; returns the created hook (its `secret` included).
pub fn create_hook<S: Store>(h: &mut Harness<S>, u: &User, events: Value) -> Value {
    let resp = h.call(bearer(
        post(
            "/webhooks",
            json!({ "url": "https://hooks.example.com/tfa", "events": events }),
        ),
        &u.access,
    ));
    assert_eq!(resp.status, 201, "{}", String::from_utf8_lossy(&resp.body));
    data(&resp)
}

/// The value of header `name` (any case) of a webhook call; panics if absent.
pub fn header<'a>(call: &'a WebhookCall, name: &str) -> &'a str {
    call.call
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap()
}

pub fn totp_code(secret_b32: &str, unix_secs: u64) -> String {
    let raw = totp::base32_decode(secret_b32).unwrap();
    totp::code_at_step(&raw, unix_secs / 30, totp::TotpAlgorithm::Sha1, 6)
}

pub fn now_secs<S: Store>(h: &Harness<S>) -> u64 {
    h.now_ms / 1000
}

/// Sets up and verifies TOTP; returns (secret, backup codes).
pub fn enable_totp<S: Store>(h: &mut Harness<S>, user: &User) -> (String, Vec<String>) {
    let resp = h.call(bearer(post("/2fa/totp/setup", json!({})), &user.access));
    let d = data(&resp);
    let secret = d["secret"].as_str().unwrap().to_string();
    let backups: Vec<String> = d["backupCodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let code = totp_code(&secret, now_secs(h));
    let resp = h.call(bearer(
        post("/2fa/totp/verify-setup", json!({ "code": code })),
        &user.access,
    ));
    assert_eq!(data(&resp), json!({ "enabled": true, "method": "totp" }));
    // Let the step used for enrolment pass, so login codes are fresh.
    h.advance_secs(30);
    (secret, backups)
}

/// The newest of the user's last `limit` audit records whose action is
/// `action` (read with `token`); panics with the log when there is none.
pub fn audit_record<S: Store>(h: &mut Harness<S>, token: &str, limit: u32, action: &str) -> Value {
    let log = data(&h.call(bearer(get(&format!("/audit-log?limit={limit}")), token)));
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == action)
        .unwrap_or_else(|| panic!("no {action} audit record in {log}"))
        .clone()
}

/// Logs in with the password; returns the response.
pub fn login<S: Store>(h: &mut Harness<S>, ident: &str, ip: &str) -> Response {
    h.call(
        post(
            "/auth/login",
            json!({ "emailOrUsername": ident, "password": PASSWORD }),
        )
        .peer(ip),
    )
}

/// Logs in a 2FA user and returns the temp token.
pub fn temp_token<S: Store>(h: &mut Harness<S>, user: &User, ip: &str) -> String {
    let resp = login(h, &user.email, ip);
    let d = data(&resp);
    assert_eq!(d["requiresTwoFactor"], json!(true));
    d["tempToken"].as_str().unwrap().to_string()
}

/// Key prefixes that any request, even a refused one, may legitimately
/// write: audit records, rate-limit counters, the housekeeping index,
/// temp-token counters (read by increment, which creates them),
/// second-factor failure counters and lock, generated development secrets,
/// the webhook queue and delivery log.
pub const BOOKKEEPING: &[&str] = &[
    "audit:",
    "auditn:",
    "rl:",
    "hk:",
    "tt:",
    "mfafail:",
    "mfalock:",
    "sys:secret:",
    "wq:",
    "whn:",
    "whd:",
];

/// Everything stored except [`BOOKKEEPING`]: what a refused request must
/// leave exactly as it was.
pub fn durable_state(
    store: &tfa_core::testing::MemoryStore,
) -> std::collections::BTreeMap<String, tfa_core::testing::Entry> {
    store
        .entries()
        .into_iter()
        .filter(|(k, _)| !BOOKKEEPING.iter().any(|p| k.starts_with(p)))
        .collect()
}

/// The keys whose entries differ between two [`durable_state`]s.
pub fn changed_keys(
    before: &std::collections::BTreeMap<String, tfa_core::testing::Entry>,
    after: &std::collections::BTreeMap<String, tfa_core::testing::Entry>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect()
}

/// A six-digit code that is not `right` (a TOTP or SMS / e-mail code).
pub fn wrong_code(right: &str) -> &'static str {
    if right == "000000" {
        "111111"
    } else {
        "000000"
    }
}

/// One request through `service` in `env`, and the work after its
/// response; the response. A request that asks for a delivery first panics.
pub fn respond(service: &Service, env: &mut Env, req: &Request) -> Response {
    let Step::Respond(reply) = service.handle(env, req) else {
        panic!("no delivery expected")
    };
    service.complete(env, reply.effects);
    reply.response
}

/// Runs `reqs` at once, one thread each, all against `store`.
pub fn concurrently(
    service: &Arc<Service>,
    store: &Arc<InterleavingStore<MemoryStore>>,
    now_ms: u64,
    reqs: Vec<Request>,
) -> Vec<Response> {
    let timed = reqs.into_iter().map(|r| (now_ms, r)).collect();
    concurrently_at(service, store, timed)
}

/// [`concurrently`], each request with its own clock reading (instances
/// whose clocks differ).
pub fn concurrently_at(
    service: &Arc<Service>,
    store: &Arc<InterleavingStore<MemoryStore>>,
    reqs: Vec<(u64, Request)>,
) -> Vec<Response> {
    let barrier = Arc::new(Barrier::new(reqs.len()));
    let handles: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, (now_ms, req))| {
            let (service, store, barrier) = (service.clone(), store.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut rng = SeededRng::new(1000 + i as u64);
                let mut env = Env {
                    store: &*store,
                    rng: &mut rng,
                    now_ms,
                };
                barrier.wait();
                respond(&service, &mut env, &req)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect()
}
