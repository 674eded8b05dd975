//! The invariants behind the fuzz targets of `core/fuzz/`, as plain
//! functions of the fuzzer's bytes, so that the native test
//! `core/tests/fuzz_regressions.rs` replays every saved case through exactly
//! the same checks. Each function panics when an invariant breaks and
//! returns normally otherwise; none reads the clock or the OS random source.
//!
//! | target | what the bytes drive | invariants |
//! |---|---|---|
//! | [`api_sequence`] | a sequence of requests against a [`Harness`](crate::testing::Harness) holding one 2FA user with backup codes | no panic, never a 500 (nor a 503 from the in-memory store), JSON envelope (or health object) with a JSON content type; a backup code is never accepted twice and `remaining` = 10 − successful backup verifications; a TOTP step is never accepted twice |
//! | [`jwt_parse`] | arbitrary and mutated tokens into [`TokenKeys::verify`](crate::crypto::tokens::TokenKeys::verify) and [`Verifier::verify`](crate::crypto::tokens::Verifier::verify) | no panic; only tokens we issued are accepted; a token signed with our key is accepted only if it satisfies every documented check |
//! | [`signature_header`] | header, body and secret into [`verify_signature`] | no panic; accepted exactly when the header is the true signature |
//! | [`normalise`] | one string into the four normalisers | no panic; outputs valid and idempotent |
//! | [`webauthn_parse`] | raw bytes into the WebAuthn parsers; registration and assertion JSON, arbitrary or mutated from genuine ones | no panic; accepted ceremonies carry our challenge, origin and RP ID hash, and an accepted assertion's signature and counter pass an independent check ([`webauthn`]) |

use serde_json::Value;

use crate::contract::http::{Request, Response};
use crate::crypto::codes;
use crate::crypto::signature::{hmac_sha256, sign_payload, to_hex, verify_signature};

/// A fuzz target: panics when an invariant breaks.
pub type Target = fn(&[u8]);

mod api;
mod jwt;
pub mod webauthn;
pub use api::api_sequence;
pub use jwt::{issued_tokens, jwt_parse};
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
