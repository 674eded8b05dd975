//! The invariants behind the fuzz targets of `core/fuzz/`, as plain
//! functions of the fuzzer's bytes, so that the native test
//! `core/tests/fuzz_regressions.rs` replays every saved case through exactly
//! the same checks. Each function panics when an invariant breaks and
//! returns normally otherwise; none reads the clock or the OS random source.
//!
//! | target | what the bytes drive | invariants |
//! |---|---|---|
//! | [`api_sequence`] | a sequence of requests against a [`Harness`] holding one 2FA user with backup codes | no panic, never a 500 (nor a 503 from the in-memory store), JSON envelope (or health object) with a JSON content type; a backup code is never accepted twice and `remaining` = 10 − successful backup verifications; a TOTP step is never accepted twice |
//! | [`jwt_parse`] | arbitrary and mutated tokens into [`TokenKeys::verify`] and [`Verifier::verify`] | no panic; only tokens we issued are accepted; a token signed with our key is accepted only if it satisfies every documented check |
//! | [`signature_header`] | header, body and secret into [`verify_signature`] | no panic; accepted exactly when the header is the true signature |
//! | [`normalise`] | one string into the four normalisers | no panic; outputs valid and idempotent |
//! | [`webauthn_parse`] | raw bytes into the WebAuthn parsers; registration and assertion JSON, arbitrary or mutated from genuine ones | no panic; accepted ceremonies carry our challenge, origin and RP ID hash, and an accepted assertion's signature and counter pass an independent check ([`webauthn`]) |

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::{test_config, Harness, MemoryStore, T0_MS};
use crate::contract::http::{Request, Response};
use crate::crypto::signature::{hmac_sha256, sign_payload, to_hex, verify_signature};
use crate::crypto::tokens::{Extra, TokenKeys, TokenKind, Verifier};
use crate::crypto::{codes, totp};
use crate::plumbing::records::{self, UserRecord};

/// A fuzz target: panics when an invariant breaks.
pub type Target = fn(&[u8]);

pub mod webauthn;
pub use webauthn::webauthn_parse;

/// The targets by name, as `core/fuzz/fuzz_targets/<name>.rs` and
/// `core/fuzz/regressions/<name>/` name them.
pub const TARGETS: [(&str, Target); 5] = [
    ("api_sequence", api_sequence),
    ("jwt_parse", jwt_parse),
    ("signature_header", signature_header),
    ("normalise", normalise),
    ("webauthn_parse", webauthn_parse),
];

/// Reads the fuzzer's bytes front to back; past the end every read is 0 or
/// empty, so every input decodes to something.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[usize::from(self.byte()) % options.len()]
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }
    /// A length byte, then that many bytes.
    fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }
    fn rest(&mut self) -> &'a [u8] {
        self.take(usize::MAX)
    }
}

// ---------------------------------------------------------------------------
// Responses

/// The checks every response must pass: not a 500, and either an empty 204
/// (preflight) or a JSON body with a JSON content type that is the success
/// envelope `{success: true, data}`, the failure envelope
/// `{success: false, error: "<message>"}`, or (on `/health*`) the health
/// object.
pub fn check_response(req: &Request, resp: &Response) {
    let body = String::from_utf8_lossy(&resp.body);
    let what = format!("{} {:?} -> {} {body}", req.method, req.path, resp.status);
    assert!(resp.status != 500, "a 500: {what}");
    assert!((200..600).contains(&resp.status), "odd status: {what}");
    if resp.status == 204 {
        assert!(resp.body.is_empty(), "a 204 with a body: {what}");
        return;
    }
    let ct = resp.header_value("content-type").unwrap_or("");
    assert!(
        ct.starts_with("application/json"),
        "content type {ct:?}: {what}"
    );
    let v: Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {what}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("body is not an object: {what}"));
    match obj.get("success") {
        Some(Value::Bool(true)) => {
            assert!(
                obj.len() == 2 && obj.contains_key("data"),
                "success envelope: {what}"
            );
            assert!((200..300).contains(&resp.status), "success status: {what}");
        }
        Some(Value::Bool(false)) => {
            let msg = obj.get("error").and_then(Value::as_str).unwrap_or("");
            assert!(
                obj.len() == 2 && !msg.is_empty(),
                "failure envelope: {what}"
            );
            assert!(resp.status >= 400, "failure status: {what}");
        }
        _ => {
            assert!(
                req.path_only().contains("/health"),
                "neither envelope nor health: {what}"
            );
            assert!(
                obj.get("status").is_some_and(Value::is_string),
                "health object: {what}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// api_sequence

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

// ---------------------------------------------------------------------------
// jwt_parse

const ISS: &str = "https://fuzz.example.test";
const AUD: &str = "tfa-fuzz";
const NOW: u64 = T0_MS / 1000;
const KINDS: [TokenKind; 4] = [
    TokenKind::Access,
    TokenKind::Refresh,
    TokenKind::Temp,
    TokenKind::Device,
];

fn secret_of(kind: TokenKind) -> &'static [u8] {
    match kind {
        TokenKind::Access => b"fuzz-access-secret-0123456789abcdef",
        TokenKind::Refresh => b"fuzz-refresh-secret-0123456789abcdef",
        TokenKind::Temp => b"fuzz-temp-secret-0123456789abcdef!!",
        TokenKind::Device => b"fuzz-device-secret-0123456789abcdef",
    }
}

fn fuzz_keys() -> TokenKeys {
    TokenKeys::new(
        secret_of(TokenKind::Access),
        secret_of(TokenKind::Refresh),
        secret_of(TokenKind::Temp),
        secret_of(TokenKind::Device),
        ISS,
        AUD,
    )
}

/// The token of each kind the jwt target issues (and so may accept).
pub fn issued_tokens() -> [String; 4] {
    let keys = fuzz_keys();
    KINDS.map(|k| {
        keys.issue(
            k,
            "user-1",
            Extra {
                sid: Some("sess-1".into()),
                jti: Some("jti-1".into()),
                did: Some("dev-1".into()),
                mfa: Some(true),
                amr: None,
            },
            NOW,
        )
    })
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What a token signed with our key must satisfy to be accepted, checked
/// independently of `tokens.rs`.
fn acceptable(header: &Value, payload: &Value, kind: TokenKind, now: u64, leeway: u64) -> bool {
    let Some(h) = header.as_object() else {
        return false;
    };
    let Some(p) = payload.as_object() else {
        return false;
    };
    let forbidden = ["jku", "jwk", "x5u", "x5c", "crit"];
    let time_ok = |name: &str| p.get(name).and_then(Value::as_u64);
    let exp = time_ok("exp");
    h.get("alg") == Some(&json!("HS256"))
        && !forbidden.iter().any(|f| h.contains_key(*f))
        && p.get("typ") == Some(&json!(kind.typ()))
        && p.get("iss") == Some(&json!(ISS))
        && p.get("aud") == Some(&json!(AUD))
        && p.get("sub").is_some_and(Value::is_string)
        && time_ok("iat").is_some()
        && exp.is_some_and(|e| e.checked_add(leeway).is_none_or(|l| now < l))
        && match p.get("nbf") {
            None | Some(Value::Null) => true,
            Some(v) => v
                .as_u64()
                .is_some_and(|n| now.checked_add(leeway).is_none_or(|s| s >= n)),
        }
}

/// Arbitrary, mutated and self-signed tokens into both verifiers.
pub fn jwt_parse(data: &[u8]) {
    let keys = fuzz_keys();
    let issued = issued_tokens();
    let mut b = Bytes::new(data);
    let mode = b.byte() % 3;
    let kind_i = usize::from(b.byte() % 4);
    let kind = KINDS[kind_i];
    let now = NOW + u64::from(b.byte()) * 7;
    let verifiers: Vec<Verifier> = KINDS
        .iter()
        .map(|k| {
            Verifier::new(
                *k,
                &[b"not-our-secret".to_vec(), secret_of(*k).to_vec()],
                ISS,
                AUD,
                30,
            )
        })
        .collect();
    match mode {
        0 | 1 => {
            let token = if mode == 0 {
                String::from_utf8_lossy(b.rest()).to_string()
            } else {
                let mut t = issued[kind_i].clone().into_bytes();
                while !b.done() {
                    let pos = usize::from(b.byte()) | (usize::from(b.byte()) << 8);
                    let pos = if t.is_empty() { 0 } else { pos % (t.len() + 1) };
                    let c = b.byte();
                    match b.byte() % 5 {
                        0 if pos < t.len() => t[pos] = c,
                        1 => t.insert(pos, c),
                        2 if pos < t.len() => {
                            t.remove(pos);
                        }
                        3 => t.truncate(pos),
                        _ => t.extend_from_slice(b.chunk()),
                    }
                }
                String::from_utf8_lossy(&t).to_string()
            };
            for (i, k) in KINDS.iter().enumerate() {
                let ours = token == issued[i];
                let r = keys.verify(*k, &token, now);
                assert!(
                    r.is_err() || ours,
                    "accepted a token we did not issue as {k:?}: {token:?}"
                );
                let r = verifiers[i].verify(&token, now);
                assert!(
                    r.is_err() || ours,
                    "verifier accepted a token we did not issue as {k:?}: {token:?}"
                );
            }
        }
        _ => {
            // A token signed with our key, with a header and payload from the
            // input: accepted exactly when it satisfies the policy.
            let header_raw = b.chunk().to_vec();
            let payload_raw = b.rest().to_vec();
            let header: Value = serde_json::from_slice(&header_raw).unwrap_or(Value::Null);
            let payload: Value = serde_json::from_slice(&payload_raw).unwrap_or(Value::Null);
            let msg = format!("{}.{}", b64(&header_raw), b64(&payload_raw));
            let token = format!(
                "{msg}.{}",
                b64(&hmac_sha256(secret_of(kind), msg.as_bytes()))
            );
            let r = keys.verify(kind, &token, now);
            if r.is_ok() {
                assert!(
                    acceptable(&header, &payload, kind, now, 0),
                    "accepted against policy: {header} {payload}"
                );
                let extra_ok = match kind {
                    TokenKind::Access => payload["sid"].is_string() && payload["mfa"].is_boolean(),
                    TokenKind::Refresh => payload["sid"].is_string() && payload["jti"].is_string(),
                    TokenKind::Temp => payload["jti"].is_string(),
                    TokenKind::Device => payload["did"].is_string(),
                };
                assert!(extra_ok, "accepted without the kind's claims: {payload}");
            }
            let rv = verifiers[kind_i].verify(&token, now);
            if rv.is_ok() {
                assert!(
                    acceptable(&header, &payload, kind, now, 30),
                    "verifier accepted against policy: {header} {payload}"
                );
            }
            // Never under another kind's key.
            for (i, k) in KINDS.iter().enumerate() {
                if i != kind_i {
                    assert!(keys.verify(*k, &token, now).is_err(), "cross-kind accept");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// signature_header

/// Header, body and secret into `verify_signature`.
pub fn signature_header(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mode = b.byte();
    let secret = b.chunk().to_vec();
    let body = b.chunk().to_vec();
    let true_sig = sign_payload(&secret, &body);
    assert!(
        verify_signature(&secret, &body, &true_sig),
        "own signature refused"
    );
    let header = if mode % 2 == 0 {
        String::from_utf8_lossy(b.rest()).to_string()
    } else {
        let mut h = true_sig.clone().into_bytes();
        while !b.done() {
            let pos = usize::from(b.byte()) % (h.len() + 1);
            let c = b.byte();
            match b.byte() % 4 {
                0 if pos < h.len() => h[pos] = c,
                1 => h.insert(pos, c),
                2 if pos < h.len() => {
                    h.remove(pos);
                }
                _ => h.truncate(pos),
            }
        }
        String::from_utf8_lossy(&h).to_string()
    };
    let tag = to_hex(&hmac_sha256(&secret, &body));
    let hex = header.strip_prefix("sha256=").unwrap_or(&header);
    let expected = hex.len() == 64 && hex.eq_ignore_ascii_case(&tag);
    assert_eq!(
        verify_signature(&secret, &body, &header),
        expected,
        "header {header:?} for tag {tag}"
    );
}

// ---------------------------------------------------------------------------
// normalise

/// One string into the backup-code, OTP-code, phone and e-mail normalisers.
pub fn normalise(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let s = s.as_ref();

    if let Some(c) = codes::normalize_backup_code(s) {
        assert!(
            c.len() == 10
                && c.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()),
            "backup code {c:?} from {s:?}"
        );
        assert_eq!(
            codes::normalize_backup_code(&c).as_deref(),
            Some(c.as_str())
        );
        let plain: String = s
            .chars()
            .filter(|c| !matches!(c, ' ' | '-'))
            .map(|c| c.to_ascii_uppercase())
            .collect();
        assert_eq!(plain, c, "only spaces and hyphens are dropped");
    }

    if let Some(c) = codes::normalize_otp_code(s) {
        assert!(
            c.len() == 6 && c.bytes().all(|b| b.is_ascii_digit()),
            "otp {c:?} from {s:?}"
        );
        assert_eq!(codes::normalize_otp_code(&c).as_deref(), Some(c.as_str()));
    }

    if let Ok(p) = crate::api::otp::normalize_phone(s) {
        let digits = p.strip_prefix('+').unwrap_or("");
        assert!(
            (8..=15).contains(&digits.len())
                && digits.bytes().all(|b| b.is_ascii_digit())
                && !digits.starts_with('0'),
            "phone {p:?} from {s:?}"
        );
        assert_eq!(crate::api::otp::normalize_phone(&p), Ok(p.clone()));
    }

    match crate::api::users::normalize_email(s, "email") {
        Ok(e) => {
            assert!(
                e.len() <= 254
                    && e.is_ascii()
                    && !e.bytes().any(|b| b.is_ascii_control() || b == b' ')
                    && e == e.to_ascii_lowercase()
                    && e.matches('@').count() == 1,
                "e-mail {e:?} from {s:?}"
            );
            assert_eq!(
                crate::api::users::normalize_email(&e, "email"),
                Ok(e.clone())
            );
        }
        Err(err) => assert_eq!(
            err,
            crate::contract::error::ApiError::validation("email must be a valid e-mail address")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_takes_empty_and_simple_inputs() {
        for (_, f) in TARGETS {
            f(&[]);
            f(b"\x00\x01\x02\x03hello");
        }
    }
}
