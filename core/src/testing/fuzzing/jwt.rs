//! Fuzz target `jwt_parse`: arbitrary and mutated tokens into
//! [`TokenKeys::verify`] and [`Verifier::verify`]: no panic; only tokens
//! we issued are accepted; a token signed with our key is accepted only if
//! it satisfies every documented check.

use serde_json::{json, Value};

use super::Bytes;
use crate::crypto::signature::hmac_sha256;
use crate::crypto::tokens::{Extra, TokenKeys, TokenKind, Verifier};
use crate::testing::T0_MS;

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
