//! The session check: the call's request, the reading of its answer, and the
//! cache records kept in the host's shared data.
//!
//! Answers are cached in a fixed number of slots (`cache_slots`) so that the
//! shared data cannot grow without bound: slot = first 8 bytes of
//! SHA-256(token) modulo the slot count. A record holds the full hash, so a
//! slot taken by another token is a miss, never a wrong answer.

use sha2::{Digest, Sha256};

use crate::config::{Config, Introspection};

/// Largest introspection answer body read.
pub const MAX_BODY: usize = 64 * 1024;

/// Where a token's answer is cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSlot {
    /// Shared-data key.
    pub key: String,
    /// Hex SHA-256 of the token.
    pub token_hash: String,
}

/// The slot of `token` under `cfg`'s namespace.
pub fn slot(cfg: &Config, intro: &Introspection, token: &str) -> CacheSlot {
    let digest = Sha256::digest(token.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let n = u64::from_be_bytes(first) % intro.cache_slots.max(1);
    CacheSlot {
        key: format!("{}introspect/{n}", cfg.cache_namespace),
        token_hash: digest.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// A cached answer: `<hash> <0|1> <expires_at_ms>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    /// The session was active.
    pub active: bool,
    /// Unix milliseconds after which the record is stale.
    pub expires_at_ms: u64,
}

/// Encodes a record of `token_hash`.
pub fn encode(token_hash: &str, c: Cached) -> Vec<u8> {
    format!("{token_hash} {} {}", u8::from(c.active), c.expires_at_ms).into_bytes()
}

/// The fresh record for `token_hash` in `raw`, if any: `None` when the
/// slot is empty, holds another token, is stale at `now_ms`, or is garbage.
pub fn lookup(raw: Option<&[u8]>, token_hash: &str, now_ms: u64) -> Option<Cached> {
    let s = std::str::from_utf8(raw?).ok()?;
    let mut parts = s.split(' ');
    let (Some(h), Some(a), Some(e), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if h != token_hash {
        return None;
    }
    let active = match a {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let expires_at_ms: u64 = e.parse().ok()?;
    (now_ms < expires_at_ms).then_some(Cached {
        active,
        expires_at_ms,
    })
}

/// The record to store for an answer at `now_ms`, or `None` when the TTL of
/// that kind of answer is 0.
pub fn record_for(intro: &Introspection, active: bool, now_ms: u64) -> Option<Cached> {
    let ttl = if active {
        intro.positive_ttl_secs
    } else {
        intro.negative_ttl_secs
    };
    (ttl > 0).then(|| Cached {
        active,
        expires_at_ms: now_ms.saturating_add(ttl.saturating_mul(1000)),
    })
}

/// Headers of the call, pseudo-headers first.
pub fn request_headers(intro: &Introspection) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":path", intro.path.as_str()),
        (":authority", intro.authority.as_str()),
        ("content-type", "application/json"),
        ("accept", "application/json"),
        (intro.api_key_header.as_str(), intro.api_key.as_str()),
    ]
}

/// Body of the call: `{"token": "..."}`.
pub fn request_body(token: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        token: &'a str,
    }
    // Serialising a struct of one string cannot fail.
    serde_json::to_vec(&Body { token }).unwrap_or_default()
}

/// Why an answer could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    /// No answer at all (connection failure, timeout, reset).
    NoResponse,
    /// A status outside 2xx.
    Status(u16),
    /// A 2xx answer that is not `{"success":true,"data":{"active":<bool>}}`.
    Garbage,
}

/// Reads an answer: `Ok(active)` or why it cannot be used. `status` is
/// `None` when the host reported no response.
pub fn parse_response(status: Option<u16>, body: &[u8]) -> Result<bool, ApiError> {
    let status = status.ok_or(ApiError::NoResponse)?;
    if !(200..300).contains(&status) {
        return Err(ApiError::Status(status));
    }
    if body.len() > MAX_BODY {
        return Err(ApiError::Garbage);
    }
    // Read straight into the two members that matter (no JSON tree: the
    // filter links no `serde_json::Value`). Both levels must be objects:
    // serde would also read a struct from an array, by position.
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        success: Option<bool>,
        #[serde(borrow)]
        data: Option<&'a serde_json::value::RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        active: Option<bool>,
    }
    if !is_json_object(body) {
        return Err(ApiError::Garbage);
    }
    let answer: Answer<'_> = serde_json::from_slice(body).map_err(|_| ApiError::Garbage)?;
    let data = match (answer.success, answer.data) {
        (Some(true), Some(data)) if is_json_object(data.get().as_bytes()) => data.get(),
        _ => return Err(ApiError::Garbage),
    };
    // `from_slice`, like the outer parse: `from_str` would link a second
    // copy of the JSON parser (for its `&str` reader), for the same result.
    serde_json::from_slice::<Data>(data.as_bytes())
        .ok()
        .and_then(|d| d.active)
        .ok_or(ApiError::Garbage)
}

/// Whether `json` starts (after JSON white space) with `{`.
fn is_json_object(json: &[u8]) -> bool {
    json.iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|b| *b == b'{')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::parse(
            br#"{"secrets":["s"],"introspection":{"cluster":"api","api_key":"k","cache_slots":8,"positive_ttl_secs":30,"negative_ttl_secs":0}}"#,
        )
        .expect("valid")
    }

    #[test]
    fn slots_are_bounded_and_hash_checked() {
        let c = cfg();
        let i = c.introspection.clone().expect("intro");
        let mut keys = std::collections::BTreeSet::new();
        for n in 0..200 {
            keys.insert(slot(&c, &i, &format!("token-{n}")).key);
        }
        assert!(keys.len() <= 8);
        let a = slot(&c, &i, "a");
        assert_eq!(a.token_hash.len(), 64);
        let rec = encode(
            &a.token_hash,
            Cached {
                active: true,
                expires_at_ms: 2000,
            },
        );
        assert_eq!(
            lookup(Some(&rec), &a.token_hash, 1999),
            Some(Cached {
                active: true,
                expires_at_ms: 2000
            })
        );
        assert_eq!(lookup(Some(&rec), &a.token_hash, 2000), None);
        assert_eq!(lookup(Some(&rec), &slot(&c, &i, "b").token_hash, 0), None);
        for garbage in [&b""[..], b"x", b"h 2 5", b"h 1 x", b"h 1 5 6", b"\xff"] {
            assert_eq!(lookup(Some(garbage), "h", 0), None);
        }
        assert_eq!(lookup(None, "h", 0), None);
    }

    #[test]
    fn ttls() {
        let i = cfg().introspection.expect("intro");
        assert_eq!(
            record_for(&i, true, 1000),
            Some(Cached {
                active: true,
                expires_at_ms: 31_000
            })
        );
        assert_eq!(record_for(&i, false, 1000), None);
        assert_eq!(
            record_for(&i, true, u64::MAX).map(|c| c.expires_at_ms),
            Some(u64::MAX)
        );
    }

    #[test]
    fn answers() {
        let ok =
            br#"{"success":true,"data":{"active":true,"sub":"u","sid":"s","mfa":true,"exp":1}}"#;
        assert_eq!(parse_response(Some(200), ok), Ok(true));
        assert_eq!(
            parse_response(
                Some(200),
                b" {\"data\": {\"x\": [1, {}], \"active\": true}, \"success\": true}\n"
            ),
            Ok(true)
        );
        assert_eq!(
            parse_response(Some(200), br#"{"success":true,"data":{"active":false}}"#),
            Ok(false)
        );
        assert_eq!(parse_response(None, ok), Err(ApiError::NoResponse));
        assert_eq!(parse_response(Some(500), ok), Err(ApiError::Status(500)));
        assert_eq!(parse_response(Some(401), ok), Err(ApiError::Status(401)));
        for bad in [
            &b""[..],
            b"<html>",
            br#"{"success":false,"error":"x"}"#,
            br#"{"success":true,"data":{"active":"yes"}}"#,
            br#"{"success":true}"#,
            br#"{"success":"true","data":{"active":true}}"#,
            br#"{"success":true,"data":null}"#,
            br#"{"success":true,"data":[true]}"#,
            br#"[true,{"active":true}]"#,
            br#"{"success":true,"data":{"active":true},"success":true}"#,
            br#"{"success":true,"data":{"active":true}"#,
        ] {
            assert_eq!(parse_response(Some(200), bad), Err(ApiError::Garbage));
        }
        assert_eq!(request_body("a\"b"), br#"{"token":"a\"b"}"#.to_vec());
        let i = cfg().introspection.expect("intro");
        assert!(request_headers(&i).contains(&("x-api-key", "k")));
    }
}
