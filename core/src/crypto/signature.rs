//! Webhook signatures: HMAC-SHA-256 of a request body under a shared secret,
//! sent as `sha256=<64 lower-case hex digits>`, and their verification.
//!
//! Also the small helpers the rest of the crate builds on: [`hmac_sha256`],
//! [`to_hex`] and [`from_hex`].
//!
//! What this module does not do: it does not read headers, bodies or clocks
//! (no timestamp or replay protection: a caller that wants it signs a body
//! that contains a timestamp and checks it itself), and it knows of no
//! algorithm but HMAC-SHA-256.
//!
//! It depends on `hmac` and `sha2` only, and not on the `service` feature:
//! the browser package compiles it alone for `wasm32-unknown-unknown`.

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a signature header value, exactly as [`sign_payload`]
/// writes it and [`verify_signature`] accepts it.
const PREFIX: &str = "sha256=";

/// HMAC-SHA-256 tag length in bytes.
const TAG_LEN: usize = 32;

/// A keyed HMAC-SHA-256 instance. HMAC takes keys of any length (longer
/// keys are hashed first, as RFC 2104 says), so construction cannot fail.
fn mac(key: &[u8]) -> Hmac<Sha256> {
    // `Hmac::new_from_slice` accepts every key length: it never returns `Err`.
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// HMAC-SHA-256.
///
/// The 32-byte tag of `msg` under `key` (RFC 2104 with SHA-256, the
/// construction pinned by RFC 4231). Keys of any length are accepted.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut m = mac(key);
    m.update(msg);
    m.finalize().into_bytes().into()
}

/// Lower-case hex.
///
/// Two characters per byte, `0`–`9` and `a`–`f`, no separator or prefix.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The value of one hex digit (either case), or `None`.
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Hex (either case) to bytes; None for odd length or non-hex characters.
///
/// The empty string decodes to no bytes. No prefix (`0x`) and no
/// whitespace is accepted.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    if bytes.len() % 2 != 0 {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some((hex_value(pair[0])? << 4) | hex_value(pair[1])?))
        .collect()
}

/// "sha256=" + lower-case hex of HMAC-SHA-256(secret, body).
///
/// The value of the signature header of an outgoing webhook.
pub fn sign_payload(secret: &[u8], body: &[u8]) -> String {
    let mut out = String::with_capacity(PREFIX.len() + 2 * TAG_LEN);
    out.push_str(PREFIX);
    out.push_str(&to_hex(&hmac_sha256(secret, body)));
    out
}

/// True iff `header` is the HMAC of body under secret: optional "sha256="
/// prefix (exactly that, lower case), then exactly 64 hex characters in
/// either case; anything else (empty, odd length, other prefix, non-hex,
/// surrounding whitespace other than none) is false. Comparison in constant
/// time over the 32 bytes.
///
/// Only the shape of `header` (its length and whether it is hex) decides
/// early; the tag comparison itself does not stop at the first differing
/// byte.
pub fn verify_signature(secret: &[u8], body: &[u8], header: &str) -> bool {
    let hex = header.strip_prefix(PREFIX).unwrap_or(header);
    if hex.len() != 2 * TAG_LEN {
        return false;
    }
    let Some(tag) = from_hex(hex) else {
        return false;
    };
    let mut m = mac(secret);
    m.update(body);
    // `verify_slice` compares in constant time (`subtle`) and rejects any
    // length other than 32.
    m.verify_slice(&tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        from_hex(s).expect("test vector is hex")
    }

    /// RFC 4231 section 4: (key, data, HMAC-SHA-256). Case 5's tag is the
    /// 128-bit truncation the RFC gives.
    fn rfc4231() -> Vec<(Vec<u8>, Vec<u8>, &'static str)> {
        vec![
            (
                vec![0x0b; 20],
                b"Hi There".to_vec(),
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                vec![0xaa; 20],
                vec![0xdd; 50],
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            ),
            (
                hex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                vec![0x0c; 20],
                b"Test With Truncation".to_vec(),
                "a3b6167473100ee06e0c796c2955552b",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                vec![0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than \
                  block-size data. The key needs to be hashed before being used by the \
                  HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ]
    }

    #[test]
    fn rfc4231_vectors() {
        let cases = rfc4231();
        assert_eq!(cases.len(), 7);
        for (i, (key, data, expected)) in cases.iter().enumerate() {
            let tag = to_hex(&hmac_sha256(key, data));
            // Case 5 is truncated to 128 bits: compare the prefix.
            assert!(
                tag.starts_with(expected),
                "RFC 4231 case {}: got {tag}, want {expected}",
                i + 1
            );
            if i != 4 {
                assert_eq!(&tag, expected, "RFC 4231 case {}", i + 1);
            }
        }
        // The long data of case 7 is exactly the RFC's 152 bytes.
        assert_eq!(cases[6].1.len(), 152);
    }

    #[test]
    fn hex_round_trip_and_edges() {
        assert_eq!(to_hex(&[]), "");
        assert_eq!(to_hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert_eq!(from_hex(""), Some(vec![]));
        assert_eq!(from_hex("000fABff"), Some(vec![0x00, 0x0f, 0xab, 0xff]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("0x00"), None);
        assert_eq!(from_hex(" 00"), None);
        assert_eq!(from_hex("é0"), None);
        assert_eq!(from_hex("+1"), None);
    }

    #[test]
    fn sign_verify_round_trip() {
        let secret = b"whsec_test";
        let body = br#"{"event":"login","user":"u1"}"#;
        let sig = sign_payload(secret, body);
        assert!(sig.starts_with("sha256="));
        assert_eq!(sig.len(), 7 + 64);
        assert_eq!(sig[7..], to_hex(&hmac_sha256(secret, body)));
        assert!(verify_signature(secret, body, &sig));
        // Without the prefix.
        assert!(verify_signature(secret, body, &sig[7..]));
        // Upper-case hex, with and without prefix; mixed case.
        let upper = sig[7..].to_ascii_uppercase();
        assert!(verify_signature(secret, body, &upper));
        assert!(verify_signature(secret, body, &format!("sha256={upper}")));
        let mixed: String = sig[7..]
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        assert!(verify_signature(secret, body, &mixed));
    }

    #[test]
    fn empty_secret_and_body_are_fine() {
        let sig = sign_payload(b"", b"");
        assert!(verify_signature(b"", b"", &sig));
        assert!(!verify_signature(b"x", b"", &sig));
    }

    #[test]
    fn every_single_byte_change_fails() {
        let secret = b"s3cret-key".to_vec();
        let body = b"payload body".to_vec();
        let sig = sign_payload(&secret, &body);
        for i in 0..body.len() {
            for delta in [1u8, 0x80] {
                let mut b = body.clone();
                b[i] ^= delta;
                assert!(!verify_signature(&secret, &b, &sig), "body byte {i}");
            }
        }
        for i in 0..secret.len() {
            let mut s = secret.clone();
            s[i] ^= 1;
            assert!(!verify_signature(&s, &body, &sig), "secret byte {i}");
        }
        // Longer / shorter body and secret.
        let mut longer = body.clone();
        longer.push(0);
        assert!(!verify_signature(&secret, &longer, &sig));
        assert!(!verify_signature(&secret, &body[..body.len() - 1], &sig));
        assert!(!verify_signature(&secret[..secret.len() - 1], &body, &sig));
        // Every hex digit of the signature changed to every other hex digit.
        let hex_part = &sig[7..];
        for i in 0..hex_part.len() {
            let orig = hex_part.as_bytes()[i];
            for c in b"0123456789abcdef" {
                if *c == orig {
                    continue;
                }
                let mut h = hex_part.as_bytes().to_vec();
                h[i] = *c;
                let h = String::from_utf8(h).expect("ascii");
                assert!(!verify_signature(&secret, &body, &h), "sig char {i}");
                assert!(!verify_signature(&secret, &body, &format!("sha256={h}")));
            }
        }
        // Every single decoded byte of the tag flipped.
        let tag = from_hex(hex_part).expect("hex");
        for i in 0..tag.len() {
            let mut t = tag.clone();
            t[i] ^= 0x01;
            assert!(
                !verify_signature(&secret, &body, &to_hex(&t)),
                "tag byte {i}"
            );
        }
    }

    #[test]
    fn malformed_headers_fail() {
        let secret = b"k";
        let body = b"b";
        let sig = sign_payload(secret, body);
        let hex_part = sig[7..].to_string();
        let bad = [
            String::new(),
            "sha256=".to_string(),
            format!("sha1={hex_part}"),
            format!("SHA256={hex_part}"),
            format!("Sha256={hex_part}"),
            format!("sha256:{hex_part}"),
            format!("sha256= {hex_part}"),
            format!("sha256=sha256={hex_part}"),
            format!(" {sig}"),
            format!("{sig} "),
            format!("{sig}\n"),
            format!("\t{hex_part}"),
            hex_part[..63].to_string(),
            format!("{hex_part}0"),
            hex_part[..62].to_string(),
            format!("{hex_part}00"),
            format!("sha256={}", &hex_part[..63]),
            format!("sha256={hex_part}0"),
            format!("{}g", &hex_part[..63]),
            format!("{}-", &hex_part[..63]),
            format!("{}é", &hex_part[..62]),
            "z".repeat(64),
            "0".repeat(64),
        ];
        for h in &bad {
            assert!(!verify_signature(secret, body, h), "accepted {h:?}");
        }
    }

    proptest! {
        #[test]
        fn prop_round_trip(secret in proptest::collection::vec(any::<u8>(), 0..100),
                           body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let sig = sign_payload(&secret, &body);
            prop_assert!(verify_signature(&secret, &body, &sig));
            prop_assert!(verify_signature(&secret, &body, &sig[7..]));
            prop_assert!(verify_signature(&secret, &body, &sig[7..].to_ascii_uppercase()));
            let mut other = body.clone();
            other.push(1);
            prop_assert!(!verify_signature(&secret, &other, &sig));
        }

        #[test]
        fn prop_hex_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let h = to_hex(&bytes);
            prop_assert_eq!(h.len(), bytes.len() * 2);
            prop_assert_eq!(from_hex(&h), Some(bytes.clone()));
            prop_assert_eq!(from_hex(&h.to_ascii_uppercase()), Some(bytes));
        }

        #[test]
        fn prop_verify_never_panics(header in "\\PC{0,80}") {
            let _ = verify_signature(b"k", b"b", &header);
            let _ = from_hex(&header);
        }
    }
}
