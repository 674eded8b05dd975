//! Fuzz target `api_sequence`: a sequence of requests, decoded from the
//! fuzzer's bytes, against a [`Harness`] holding one 2FA user with backup
//! codes, checked against a model of what the service must allow: no
//! panic, never a 500, a JSON envelope on every answer, a backup code
//! never accepted twice and `remaining` = 10 − successful backup
//! verifications, a TOTP step never accepted twice.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::{check_response, Bytes};
use crate::contract::http::{Request, Response};
use crate::crypto::totp;
use crate::plumbing::records::{self, UserRecord};
use crate::testing::{test_config, Harness, MemoryStore};

const PASSWORD: &str = "Str0ng!Passw0rd";
const EMAIL: &str = "fuzz@example.com";

/// One 2FA user (TOTP and ten backup codes), prepared once per process.
struct Prepared {
    store: MemoryStore,
    now_ms: u64,
    user_id: String,
    access: String,
    refresh: String,
    secret: String,
    backup: Vec<String>,
    last_step: u64,
}

fn send(h: &mut Harness, req: Request) -> Response {
    let resp = h.call(req.clone());
    check_response(&req, &resp);
    resp
}

fn post(path: &str, body: Value) -> Request {
    Request::new("POST", &format!("/api{path}")).json(&body.to_string())
}

fn bearer(req: Request, token: &str) -> Request {
    req.header("Authorization", &format!("Bearer {token}"))
}

fn data_of(resp: &Response) -> Value {
    let v = resp.json();
    assert_eq!(v["success"], json!(true), "setup step failed: {v}");
    v["data"].clone()
}

fn prepared() -> &'static Prepared {
    static PREPARED: OnceLock<Prepared> = OnceLock::new();
    PREPARED.get_or_init(|| {
        let mut h = Harness::new();
        let reg = send(
            &mut h,
            post(
                "/auth/register",
                json!({ "email": EMAIL, "username": "fuzzer", "password": PASSWORD }),
            ),
        );
        let d = data_of(&reg);
        let user_id = d["user"]["id"].as_str().unwrap_or_default().to_string();
        let access = d["accessToken"].as_str().unwrap_or_default().to_string();
        let refresh = d["refreshToken"].as_str().unwrap_or_default().to_string();
        let setup = send(&mut h, bearer(post("/2fa/totp/setup", json!({})), &access));
        let d = data_of(&setup);
        let secret = d["secret"].as_str().unwrap_or_default().to_string();
        let backup: Vec<String> = d["backupCodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let raw = totp::base32_decode(&secret).unwrap_or_default();
        let step = totp::step_of(h.now_ms / 1000);
        let code = totp::code_at_step(&raw, step, totp::TotpAlgorithm::Sha1, 6);
        let v = send(
            &mut h,
            bearer(
                post("/2fa/totp/verify-setup", json!({ "code": code })),
                &access,
            ),
        );
        data_of(&v);
        h.advance_secs(30);
        Prepared {
            store: h.store.clone(),
            now_ms: h.now_ms,
            user_id,
            access,
            refresh,
            secret,
            backup,
            last_step: step,
        }
    })
}

/// Paths of real routes; `{id}` is replaced by an id the input chooses.
const ROUTES: [&str; 53] = [
    "/health",
    "/health/live",
    "/health/ready",
    "/auth/register",
    "/auth/login",
    "/auth/me",
    "/auth/refresh",
    "/auth/logout",
    "/auth/revoke-sessions",
    "/auth/sessions",
    "/auth/sessions/{id}",
    "/auth/introspect",
    "/2fa/totp/setup",
    "/2fa/totp/verify-setup",
    "/2fa/totp/verify",
    "/2fa/totp",
    "/2fa/sms/setup",
    "/2fa/sms/verify-setup",
    "/2fa/email/setup",
    "/2fa/email/verify-setup",
    "/2fa/send-code",
    "/2fa/resend",
    "/2fa/verify",
    "/2fa/verify-backup-code",
    "/2fa/verify-backup",
    "/2fa/backup-codes/generate",
    "/2fa/backup-codes/count",
    "/2fa/methods",
    "/2fa/methods/{id}",
    "/2fa/webauthn/register/options",
    "/2fa/webauthn/register/verify",
    "/2fa/webauthn/credentials",
    "/2fa/webauthn/credentials/{id}",
    "/2fa/webauthn/options",
    "/2fa/verify-webauthn",
    "/auth/passkey/options",
    "/auth/passkey/verify",
    "/2fa/webauthn",
    "/2fa/devices",
    "/2fa/devices/{id}",
    "/api-keys",
    "/api-keys/{id}",
    "/api-keys/{id}/rotate",
    "/audit-log",
    "/webhooks",
    "/webhooks/events",
    "/webhooks/verify-signature",
    "/webhooks/{id}",
    "/webhooks/{id}/test",
    "/webhooks/{id}/deliveries",
    "/2fa/unknown",
    "/auth",
    "",
];

const METHODS: [&str; 8] = [
    "GET", "POST", "DELETE", "PUT", "OPTIONS", "PATCH", "HEAD", "get",
];
const PEERS: [&str; 4] = ["203.0.113.7", "198.51.100.9", "2001:db8::1", "10.0.0.1"];

/// What the sequence knows, and what it has seen accepted.
struct Model {
    user_id: String,
    access: String,
    refresh: String,
    old_refresh: Option<String>,
    temp: Option<String>,
    secret: String,
    /// Plain codes of the installed backup set, as far as known.
    codes: Vec<String>,
    /// Plain codes of a TOTP setup not yet verified.
    pending_codes: Vec<String>,
    /// Hashes of the installed backup set (to notice a new set).
    hashes: Vec<String>,
    /// Successful backup verifications since the set was installed.
    backup_successes: usize,
    /// The newest TOTP step the sequence has seen accepted.
    last_step: Option<u64>,
}

fn user(h: &Harness, id: &str) -> Option<UserRecord> {
    records::load(&h.store, &format!("user:{id}"))
        .ok()
        .flatten()
}

/// The hashes and used flags of a user's backup set.
fn backup_state(u: Option<&UserRecord>) -> (Vec<String>, Vec<bool>) {
    u.and_then(|u| u.backup.as_ref())
        .map(|b| {
            (
                b.codes.iter().map(|c| c.hash.clone()).collect(),
                b.codes.iter().map(|c| c.used).collect(),
            )
        })
        .unwrap_or_default()
}

fn totp_secret(u: Option<&UserRecord>) -> Option<String> {
    u.and_then(|u| u.method("totp"))
        .and_then(|m| m.secret.clone())
}

/// Which kind of request an operation made, for the stateful checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    Other,
    /// `/2fa/verify-backup*` with backup code `Some(i)` of the set (or a code
    /// the sequence does not know).
    Backup(Option<usize>),
    /// `/2fa/verify` with the TOTP code of this step.
    Totp(u64),
}

impl Model {
    fn placeholders(&self, h: &Harness, s: &str) -> String {
        let mut out = s
            .replace("$A", &self.access)
            .replace("$R", &self.refresh)
            .replace("$T", self.temp.as_deref().unwrap_or(""))
            .replace("$U", &self.user_id)
            .replace("$C", &h.last_code().unwrap_or_default());
        for (i, c) in self.codes.iter().enumerate() {
            out = out.replace(&format!("$B{i}"), c);
        }
        out
    }

    fn totp_code(&self, step: u64) -> String {
        let raw = totp::base32_decode(&self.secret).unwrap_or_default();
        totp::code_at_step(&raw, step, totp::TotpAlgorithm::Sha1, 6)
    }

    /// Picks up tokens and codes from a successful response.
    fn learn(&mut self, req: &Request, resp: &Response) {
        let v = resp.json();
        if v["success"] != json!(true) {
            return;
        }
        let d = &v["data"];
        if let Some(t) = d["tempToken"].as_str() {
            self.temp = Some(t.to_string());
        }
        if let Some(t) = d["accessToken"].as_str() {
            self.access = t.to_string();
        }
        if let Some(t) = d["refreshToken"].as_str() {
            self.old_refresh = Some(std::mem::replace(&mut self.refresh, t.to_string()));
        }
        if let Some(a) = d["backupCodes"].as_array() {
            let list: Vec<String> = a
                .iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect();
            if req.path_only().contains("/backup-codes/generate") {
                self.codes = list;
            } else {
                self.pending_codes = list;
            }
        }
    }

    /// The stateful invariants, from the store before and after one request.
    fn check(
        &mut self,
        h: &Harness,
        before: Option<&UserRecord>,
        sent: Sent,
        req: &Request,
        resp: &Response,
    ) {
        let after = user(h, &self.user_id);
        let after = after.as_ref();
        let body = String::from_utf8_lossy(&resp.body);
        let what = format!("{} {:?} -> {} {body}", req.method, req.path, resp.status);
        assert!(
            !(resp.status == 503 && body.contains("Service unavailable")),
            "503 from an in-memory store: {what}"
        );
        let success = resp.status == 200;
        let backup_path = req.path_only().contains("/2fa/verify-backup");
        let backup_ok = success && backup_path;

        let (h0, used0) = backup_state(before);
        let (h1, used1) = backup_state(after);
        if h0 == h1 && !h1.is_empty() {
            // Same set: used flags never go back, and exactly one flips per
            // successful backup verification (none otherwise).
            let mut flipped = 0;
            for (i, (a, b)) in used0.iter().zip(&used1).enumerate() {
                assert!(!*a || *b, "backup slot {i} became unused: {what}");
                if !*a && *b {
                    flipped += 1;
                }
            }
            assert_eq!(flipped, usize::from(backup_ok), "slots flipped: {what}");
            if backup_ok {
                self.backup_successes += 1;
            }
        } else if h0 != h1 {
            // A new set (generate, verify-setup) or none (last method removed).
            assert!(!backup_ok, "a backup verification replaced the set: {what}");
            if !req.path_only().contains("/backup-codes/generate") {
                self.codes = std::mem::take(&mut self.pending_codes);
            }
            if h1.is_empty() {
                self.codes.clear();
            }
            self.hashes = h1.clone();
            self.backup_successes = used1.iter().filter(|u| **u).count();
            assert_eq!(
                self.backup_successes, 0,
                "a new set with used codes: {what}"
            );
        } else {
            assert!(!backup_ok, "backup verification without codes: {what}");
        }
        let remaining = used1.iter().filter(|u| !**u).count();
        if !h1.is_empty() {
            assert_eq!(
                remaining,
                h1.len() - self.backup_successes,
                "remaining = total - successful verifications: {what}"
            );
        }
        if backup_ok {
            let said = resp.json()["data"]["remainingCodes"].as_u64();
            assert_eq!(said, Some(remaining as u64), "remainingCodes: {what}");
        }
        if sent == Sent::Backup(None) {
            assert!(
                !backup_ok,
                "a code that is not in the set was accepted: {what}"
            );
        }

        // TOTP: under one secret the last accepted step never moves back,
        // and a step at or before it is never accepted again.
        let (s0, s1) = (totp_secret(before), totp_secret(after));
        let (l0, l1) = (
            before.and_then(|u| u.totp_last_step),
            after.and_then(|u| u.totp_last_step),
        );
        if s0.is_some() && s0 == s1 {
            if let (Some(a), Some(b)) = (l0, l1) {
                assert!(b >= a, "TOTP last step moved back {a} -> {b}: {what}");
            }
        }
        if let Sent::Totp(step) = sent {
            let no_other_codes = before.is_some_and(|u| u.codes.is_empty());
            if success && no_other_codes && s0.is_some() && s0 == s1 {
                if let Some(prev) = l0 {
                    assert!(
                        step > prev,
                        "TOTP step {step} replayed (last {prev}): {what}"
                    );
                }
                assert_eq!(l1, Some(step), "accepted step recorded: {what}");
                self.last_step = Some(step);
            }
        }
        if let Some(s) = s1 {
            self.secret = s;
        }
    }
}

/// One generic request built from the input.
fn generic(b: &mut Bytes, m: &Model, h: &Harness) -> Request {
    let method = b.pick(&METHODS);
    let route = b.pick(&ROUTES);
    let id_choice = b.byte() % 5;
    let fuzz_id = String::from_utf8_lossy(b.chunk()).to_string();
    let id = match id_choice {
        0 => "00000000-0000-4000-8000-000000000000".to_string(),
        1 => "..".to_string(),
        2 => "%2e%2e%2f".to_string(),
        3 => m.user_id.clone(),
        _ => fuzz_id.clone(),
    };
    let mut path = format!("/api{}", route.replace("{id}", &id));
    match b.byte() % 9 {
        1 => path.push('/'),
        2 => path.push_str("?limit=1000&cursor=zz&x=%00"),
        3 => path.push_str(&fuzz_id),
        4 => path = path.replacen("/api", "/api/..", 1),
        5 => path = path.replace('/', "%2F").replacen("%2Fapi", "/api", 1),
        6 => path = path.replacen("/api/", "/api//", 1),
        7 => path = path.replacen("/api", "/API", 1),
        8 => path = format!("/api/{}", m.placeholders(h, &fuzz_id)),
        _ => {}
    }
    let mut req = Request::new(method, &path).peer(b.pick(&PEERS));
    if method == "get" {
        req.method = "get".into();
    }
    match b.byte() % 8 {
        1 => req = bearer(req, &m.access),
        2 => req = bearer(req, &m.refresh),
        3 => req = bearer(req, m.temp.as_deref().unwrap_or("")),
        4 => req = req.header("X-API-Key", &format!("tfa_{fuzz_id}")),
        5 => {
            req = req
                .header("Cookie", &format!("refreshToken={}", m.refresh))
                .header("Origin", "https://app.example.com")
        }
        6 => req = req.header("Authorization", &m.placeholders(h, &fuzz_id)),
        _ => {}
    }
    match b.byte() % 5 {
        0 | 1 => req = req.header("Content-Type", "application/json"),
        2 => req = req.header("Content-Type", "text/plain"),
        3 => {
            req = req.header(
                "Content-Type",
                "application/merge-patch+json; charset=utf-8",
            )
        }
        _ => {}
    }
    if b.byte() % 16 == 0 {
        req = req
            .header("Origin", "https://evil.example")
            .header("X-Forwarded-For", "127.0.0.1")
            .header("User-Agent", "\r\nX-Injected: 1");
    }
    let raw = b.chunk();
    req.body = match std::str::from_utf8(raw) {
        Ok(s) => m.placeholders(h, s).into_bytes(),
        Err(_) => raw.to_vec(),
    };
    if b.byte() == 0xff {
        req.body = vec![b'{'; crate::plumbing::web::MAX_BODY_BYTES + 1];
    }
    req
}

/// Arbitrary sequences of requests against one prepared 2FA user; see the
/// module table for the invariants.
pub fn api_sequence(data: &[u8]) {
    let p = prepared();
    let mut h = Harness::with(test_config(&[]), p.store.clone());
    h.now_ms = p.now_ms;
    h.reseed(0x5eed);
    let mut m = Model {
        user_id: p.user_id.clone(),
        access: p.access.clone(),
        refresh: p.refresh.clone(),
        old_refresh: None,
        temp: None,
        secret: p.secret.clone(),
        codes: p.backup.clone(),
        pending_codes: vec![],
        hashes: backup_state(user(&h, &p.user_id).as_ref()).0,
        backup_successes: 0,
        last_step: Some(p.last_step),
    };
    let mut b = Bytes::new(data);
    let mut ops = 0;
    while !b.done() && ops < 64 {
        ops += 1;
        let peer = b.pick(&PEERS);
        let (req, sent) = match b.byte() % 10 {
            0..=2 => (generic(&mut b, &m, &h), Sent::Other),
            3 => (
                post(
                    "/auth/login",
                    json!({ "emailOrUsername": EMAIL, "password": PASSWORD }),
                ),
                Sent::Other,
            ),
            4 => {
                let i = usize::from(b.byte() % 12);
                let code = m
                    .codes
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| "AAAAAAAAAA".into());
                let code = match b.byte() % 4 {
                    1 => code.to_ascii_lowercase(),
                    2 => format!(
                        "{}-{}",
                        &code[..5.min(code.len())],
                        &code[5.min(code.len())..]
                    ),
                    3 => format!(" {code} "),
                    _ => code,
                };
                let temp = m.temp.clone().unwrap_or_default();
                let field = if b.byte() % 2 == 0 {
                    "backupCode"
                } else {
                    "code"
                };
                let path = if b.byte() % 2 == 0 {
                    "/2fa/verify-backup-code"
                } else {
                    "/2fa/verify-backup"
                };
                (
                    post(path, json!({ "tempToken": temp, field: code })),
                    Sent::Backup((i < m.codes.len()).then_some(i)),
                )
            }
            5 => {
                let now_step = totp::step_of(h.now_ms / 1000);
                let step = match b.byte() % 6 {
                    0 => now_step.saturating_sub(1),
                    1 => now_step + 1,
                    2 => now_step.saturating_sub(2),
                    3 => m.last_step.unwrap_or(now_step),
                    _ => now_step,
                };
                let temp = m.temp.clone().unwrap_or_default();
                let trust = b.byte() % 4 == 0;
                (
                    post(
                        "/2fa/verify",
                        json!({ "tempToken": temp, "code": m.totp_code(step), "trustDevice": trust }),
                    ),
                    Sent::Totp(step),
                )
            }
            6 => {
                let secs = b.pick(&[
                    1u64, 10, 29, 30, 31, 60, 299, 301, 900, 3600, 86_400, 604_801,
                ]);
                h.advance_secs(secs);
                continue;
            }
            7 => {
                let token = match (b.byte() % 3, &m.old_refresh) {
                    (0, Some(old)) => old.clone(),
                    _ => m.refresh.clone(),
                };
                (
                    post("/auth/refresh", json!({ "refreshToken": token })),
                    Sent::Other,
                )
            }
            8 => (
                bearer(post("/2fa/backup-codes/generate", json!({})), &m.access),
                Sent::Other,
            ),
            _ => {
                let path = if b.byte() % 2 == 0 {
                    "/auth/logout"
                } else {
                    "/auth/revoke-sessions"
                };
                (bearer(post(path, json!({})), &m.access), Sent::Other)
            }
        };
        let req = if req.peer.is_none() {
            req.peer(peer)
        } else {
            req
        };
        let before = user(&h, &m.user_id);
        let resp = send(&mut h, req.clone());
        m.check(&h, before.as_ref(), sent, &req, &resp);
        m.learn(&req, &resp);
    }
}
