//! Time-based one-time passwords (RFC 6238, codes computed by `totp-lite`), base32
//! (RFC 4648) for secrets, and the `otpauth://` URI that authenticator apps scan.
//!
//! What it does: computes the code of a time step, checks a 6-digit SHA-1 code against
//! the steps around a given Unix time with replay protection (a step, once accepted, is
//! never accepted again), encodes and decodes base32, and builds the `otpauth://` URI.
//!
//! What it does not do: it never reads the clock (the Unix time is a parameter), never
//! draws secrets (the caller passes random bytes in), stores nothing (the caller keeps
//! the last accepted step and passes it back), does no rate limiting, and does not
//! normalise user input (callers strip whitespace before [`verify_code`]).

use std::fmt::Write as _;

use totp_lite::{totp_custom, Sha1, Sha256, Sha512};

/// Length of a time step, in seconds.
pub const STEP_SECS: u64 = 30;

/// Number of digits of the codes that [`verify_code`] checks.
pub const DIGITS: u32 = 6;

/// The HMAC hash function of a TOTP code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TotpAlgorithm {
    /// HMAC-SHA-1: what authenticator apps use, and what [`verify_code`] uses.
    Sha1,
    /// HMAC-SHA-256.
    Sha256,
    /// HMAC-SHA-512.
    Sha512,
}

/// The RFC 4648 base32 alphabet.
const BASE32_ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Encodes `bytes` as RFC 4648 base32, upper case, without `=` padding.
#[must_use]
pub fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let mut buffer: u16 = 0; // pending bits, in the low `bits` bits
    let mut bits: u32 = 0;
    for &byte in bytes {
        buffer = (buffer << 8) | u16::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(
                BASE32_ALPHABET[usize::from((buffer >> bits) & 0x1f)],
            ));
        }
        buffer &= (1 << bits) - 1;
    }
    if bits > 0 {
        // The last bits, padded with zero bits on the right.
        out.push(char::from(
            BASE32_ALPHABET[usize::from((buffer << (5 - bits)) & 0x1f)],
        ));
    }
    out
}

/// The value of one base32 character, in either case.
fn base32_value(c: char) -> Option<u8> {
    match c {
        'A'..='Z' => Some(c as u8 - b'A'),
        'a'..='z' => Some(c as u8 - b'a'),
        '2'..='7' => Some(c as u8 - b'2' + 26),
        _ => None,
    }
}

/// Decodes RFC 4648 base32. Upper and lower case are both accepted, spaces anywhere are
/// ignored, and so is `=` padding at the end.
///
/// Returns `None` for any other character (including `=` before the end) and for a
/// length that no byte string encodes to (1, 3 or 6 characters in the last group of 8,
/// i.e. a truncated string). Unused bits in the last character are ignored.
#[must_use]
pub fn base32_decode(s: &str) -> Option<Vec<u8>> {
    let unpadded = s.trim_end_matches(['=', ' ']);
    let mut out = Vec::with_capacity(unpadded.len() * 5 / 8);
    let mut buffer: u16 = 0;
    let mut bits: u32 = 0;
    let mut count: usize = 0;
    for c in unpadded.chars().filter(|&c| c != ' ') {
        let value = base32_value(c)?;
        count += 1;
        buffer = (buffer << 5) | u16::from(value);
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            // Truncation keeps exactly the 8 bits just completed.
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    match count % 8 {
        1 | 3 | 6 => None,
        _ => Some(out),
    }
}

/// The time step of a Unix time: `unix_secs / 30`.
#[must_use]
pub fn step_of(unix_secs: u64) -> u64 {
    unix_secs / STEP_SECS
}

/// The code of time step `step` (RFC 6238 with HMAC-`alg`, computed by `totp-lite`),
/// zero-padded on the left to `digits` digits. With a step counter this is also the
/// HOTP value (RFC 4226) of counter `step`.
///
/// A code never has more than 10 significant digits (it is a 31-bit number), so for
/// `digits` above 10 the extra digits are leading zeros; `digits == 0` gives `""`.
#[must_use]
pub fn code_at_step(secret: &[u8], step: u64, alg: TotpAlgorithm, digits: u32) -> String {
    // totp-lite takes a time and a step length; a time of `step` with steps of one
    // second is the counter `step`. It computes 10^digits in a u64, so ask it for at
    // most 10 digits (all there are) and pad the rest here.
    let significant = digits.min(10);
    if significant == 0 {
        return String::new();
    }
    let code = match alg {
        TotpAlgorithm::Sha1 => totp_custom::<Sha1>(1, significant, secret, step),
        TotpAlgorithm::Sha256 => totp_custom::<Sha256>(1, significant, secret, step),
        TotpAlgorithm::Sha512 => totp_custom::<Sha512>(1, significant, secret, step),
    };
    if digits == significant {
        // totp-lite pads to the digits it was asked for already.
        return code;
    }
    format!("{code:0>width$}", width = digits as usize)
}

/// Checks a 6-digit HMAC-SHA-1 code with 30-second steps (the authenticator-app
/// default) at Unix time `unix_secs`, and returns the step it matched.
///
/// `code` must be exactly six ASCII digits: no surrounding whitespace, no inner spaces
/// (callers normalise user input first). The candidate steps are the current one and
/// one on each side (now - 1, now, now + 1; a step below 0 or above `u64::MAX` is
/// skipped), and only those strictly greater than `last_step`, the step the caller
/// accepted last for this secret: a code is never accepted twice, nor one older than
/// the last accepted. Each candidate's code is computed and compared in constant time,
/// without stopping at the first match. If several steps match (the same code twice),
/// the latest is returned, so that storing it blocks them all.
#[must_use]
pub fn verify_code(
    secret: &[u8],
    code: &str,
    unix_secs: u64,
    last_step: Option<u64>,
) -> Option<u64> {
    if code.len() != DIGITS as usize || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let now = step_of(unix_secs);
    let candidates = [now.checked_sub(1), Some(now), now.checked_add(1)];
    let mut accepted = None;
    for step in candidates.into_iter().flatten() {
        if last_step.is_some_and(|last| step <= last) {
            continue;
        }
        let expected = code_at_step(secret, step, TotpAlgorithm::Sha1, DIGITS);
        if crate::crypto::codes::ct_eq(expected.as_bytes(), code.as_bytes()) {
            accepted = Some(step);
        }
    }
    accepted
}

/// Percent-encodes everything except RFC 3986 unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`), byte by byte of the UTF-8 form.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The key URI that authenticator apps scan:
/// `otpauth://totp/{issuer}:{account}?secret={secret}&issuer={issuer}&algorithm=SHA1&digits=6&period=30`.
///
/// `issuer`, `account` and `secret_b32` are percent-encoded: everything except RFC 3986
/// unreserved characters, so `@` becomes `%40` and a space `%20`. A base32 secret
/// (as made by [`base32_encode`]) is unchanged by this.
#[must_use]
pub fn otpauth_uri(issuer: &str, account: &str, secret_b32: &str) -> String {
    let issuer = percent_encode(issuer);
    let account = percent_encode(account);
    let secret = percent_encode(secret_b32);
    format!(
        "otpauth://totp/{issuer}:{account}?secret={secret}&issuer={issuer}\
         &algorithm=SHA1&digits={DIGITS}&period={STEP_SECS}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET_SHA1: &[u8] = b"12345678901234567890";
    const SECRET_SHA256: &[u8] = b"12345678901234567890123456789012";
    const SECRET_SHA512: &[u8] =
        b"1234567890123456789012345678901234567890123456789012345678901234";

    /// RFC 6238 Appendix B: (time, SHA-1, SHA-256, SHA-512), 8 digits.
    const RFC6238: [(u64, &str, &str, &str); 6] = [
        (59, "94287082", "46119246", "90693936"),
        (1_111_111_109, "07081804", "68084774", "25091201"),
        (1_111_111_111, "14050471", "67062674", "99943326"),
        (1_234_567_890, "89005924", "91819424", "93441116"),
        (2_000_000_000, "69279037", "90698825", "38618901"),
        (20_000_000_000, "65353130", "77737706", "47863826"),
    ];

    #[test]
    fn rfc6238_appendix_b() {
        for (time, sha1, sha256, sha512) in RFC6238 {
            let step = step_of(time);
            assert_eq!(
                code_at_step(SECRET_SHA1, step, TotpAlgorithm::Sha1, 8),
                sha1
            );
            assert_eq!(
                code_at_step(SECRET_SHA256, step, TotpAlgorithm::Sha256, 8),
                sha256
            );
            assert_eq!(
                code_at_step(SECRET_SHA512, step, TotpAlgorithm::Sha512, 8),
                sha512
            );
        }
    }

    #[test]
    fn rfc6238_steps() {
        // The "Value of T (hex)" column of Appendix B.
        assert_eq!(step_of(59), 0x1);
        assert_eq!(step_of(1_111_111_109), 0x0235_23EC);
        assert_eq!(step_of(1_111_111_111), 0x0235_23ED);
        assert_eq!(step_of(1_234_567_890), 0x0273_EF07);
        assert_eq!(step_of(2_000_000_000), 0x03F9_40AA);
        assert_eq!(step_of(20_000_000_000), 0x27BC_86AA);
    }

    #[test]
    fn rfc4226_appendix_d_hotp() {
        let expected = [
            "755224", "287082", "359152", "969429", "338314", "254676", "287922", "162583",
            "399871", "520489",
        ];
        for (counter, code) in expected.iter().enumerate() {
            assert_eq!(
                code_at_step(SECRET_SHA1, counter as u64, TotpAlgorithm::Sha1, 6),
                *code,
                "counter {counter}"
            );
        }
    }

    #[test]
    fn code_padding_and_digit_counts() {
        // RFC 4226 Appendix D, truncated value of counter 0 is 1284755224.
        assert_eq!(
            code_at_step(SECRET_SHA1, 0, TotpAlgorithm::Sha1, 10),
            "1284755224"
        );
        assert_eq!(
            code_at_step(SECRET_SHA1, 0, TotpAlgorithm::Sha1, 12),
            "001284755224"
        );
        assert_eq!(
            code_at_step(SECRET_SHA1, 0, TotpAlgorithm::Sha1, 25).len(),
            25
        );
        assert_eq!(code_at_step(SECRET_SHA1, 0, TotpAlgorithm::Sha1, 1), "4");
        assert_eq!(code_at_step(SECRET_SHA1, 0, TotpAlgorithm::Sha1, 0), "");
        // Leading zeros are kept (RFC 6238: 07081804).
        assert_eq!(
            code_at_step(SECRET_SHA1, step_of(1_111_111_109), TotpAlgorithm::Sha1, 8),
            "07081804"
        );
        // Extreme steps do not panic.
        assert_eq!(
            code_at_step(SECRET_SHA1, u64::MAX, TotpAlgorithm::Sha1, 6).len(),
            6
        );
    }

    #[test]
    fn base32_rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base32_encode(plain.as_bytes()), encoded);
            assert_eq!(base32_decode(encoded).as_deref(), Some(plain.as_bytes()));
        }
        // The padded forms of RFC 4648 decode too.
        let padded = [
            ("f", "MY======"),
            ("fo", "MZXQ===="),
            ("foo", "MZXW6==="),
            ("foob", "MZXW6YQ="),
            ("foobar", "MZXW6YTBOI======"),
        ];
        for (plain, encoded) in padded {
            assert_eq!(base32_decode(encoded).as_deref(), Some(plain.as_bytes()));
        }
    }

    #[test]
    fn base32_decode_is_lenient_about_case_and_spaces() {
        let hello = b"Hello!\xDE\xAD\xBE\xEF";
        assert_eq!(base32_encode(hello), "JBSWY3DPEHPK3PXP");
        for s in [
            "JBSWY3DPEHPK3PXP",
            "jbswy3dpehpk3pxp",
            "JbSw Y3dP EHPK 3PXP",
            " JBSW Y3DP EHPK 3PXP ",
            "JBSWY3DPEHPK3PXP=",
            "JBSWY3DPEHPK3PXP ==",
        ] {
            assert_eq!(base32_decode(s).as_deref(), Some(&hello[..]), "{s:?}");
        }
    }

    #[test]
    fn base32_decode_rejects_invalid_input() {
        for s in [
            "JBSWY3DPEHPK3PX1", // '1' is not in the alphabet
            "JBSWY3DPEHPK3PX0",
            "JBSWY3DPEHPK3PX8",
            "JBSW-Y3DP",
            "MY=A", // '=' before the end
            "=MY",
            "MZXW6\tYQ", // only spaces are ignored
            "MZXWé",
            "M", // impossible lengths
            "MZX",
            "MZXW6Y",
            "MZXW6YTBM",
        ] {
            assert_eq!(base32_decode(s), None, "{s:?}");
        }
        assert_eq!(base32_decode(""), Some(Vec::new()));
        assert_eq!(base32_decode("===="), Some(Vec::new()));
    }

    proptest! {
        #[test]
        fn base32_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let encoded = base32_encode(&bytes);
            prop_assert!(encoded.bytes().all(|b| BASE32_ALPHABET.contains(&b)));
            prop_assert_eq!(encoded.len(), (bytes.len() * 8).div_ceil(5));
            prop_assert_eq!(base32_decode(&encoded), Some(bytes.clone()));
            prop_assert_eq!(base32_decode(&encoded.to_lowercase()), Some(bytes.clone()));
            let padding = "=".repeat((8 - encoded.len() % 8) % 8);
            prop_assert_eq!(base32_decode(&format!("{encoded}{padding}")), Some(bytes));
        }

        #[test]
        fn base32_decode_never_panics(s in "\\PC{0,40}") {
            let _ = base32_decode(&s);
        }

        #[test]
        fn verify_accepts_the_current_code(secret in proptest::collection::vec(any::<u8>(), 1..40),
                                           time in 30u64..u64::MAX - 30) {
            let step = step_of(time);
            let code = code_at_step(&secret, step, TotpAlgorithm::Sha1, DIGITS);
            let accepted = verify_code(&secret, &code, time, None);
            // Usually `step`; a neighbour only if its code happens to be the same.
            prop_assert!(accepted.is_some());
            prop_assert!(accepted.unwrap().abs_diff(step) <= 1);
            prop_assert_eq!(verify_code(&secret, &code, time, accepted), None);
        }
    }

    const SECRET: &[u8] = b"12345678901234567890";

    fn code(step: u64) -> String {
        code_at_step(SECRET, step, TotpAlgorithm::Sha1, DIGITS)
    }

    #[test]
    fn window_is_one_step_each_side() {
        let time = 1_234_567_890; // the first second of step 41152263
        let now = step_of(time);
        // The codes of these steps are all different for this secret.
        let codes: Vec<String> = (now - 2..=now + 2).map(code).collect();
        for (i, a) in codes.iter().enumerate() {
            for b in &codes[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            verify_code(SECRET, &code(now - 1), time, None),
            Some(now - 1)
        );
        assert_eq!(verify_code(SECRET, &code(now), time, None), Some(now));
        assert_eq!(
            verify_code(SECRET, &code(now + 1), time, None),
            Some(now + 1)
        );
        assert_eq!(verify_code(SECRET, &code(now - 2), time, None), None);
        assert_eq!(verify_code(SECRET, &code(now + 2), time, None), None);
    }

    #[test]
    fn window_at_step_boundaries() {
        // t = 59 is step 1, t = 60 is step 2.
        assert_eq!(step_of(59), 1);
        assert_eq!(step_of(60), 2);
        // Step 0's code is in the window at 59 (steps 0..=2) but not at 60 (steps 1..=3).
        assert_eq!(verify_code(SECRET, &code(0), 59, None), Some(0));
        assert_eq!(verify_code(SECRET, &code(0), 60, None), None);
        // Step 3's code: not at 59, yes at 60.
        assert_eq!(verify_code(SECRET, &code(3), 59, None), None);
        assert_eq!(verify_code(SECRET, &code(3), 60, None), Some(3));
        // RFC 6238's SHA-1 code at t = 59, 8 digits 94287082: its last 6 digits at 6 digits.
        assert_eq!(code(1), "287082");
        assert_eq!(verify_code(SECRET, "287082", 59, None), Some(1));
        assert_eq!(verify_code(SECRET, "287082", 89, None), Some(1));
        assert_eq!(verify_code(SECRET, "287082", 90, None), None);
    }

    #[test]
    fn window_at_time_zero_skips_negative_steps() {
        assert_eq!(verify_code(SECRET, &code(0), 0, None), Some(0));
        assert_eq!(verify_code(SECRET, &code(1), 0, None), Some(1));
        assert_eq!(verify_code(SECRET, &code(2), 0, None), None);
        assert_eq!(verify_code(SECRET, &code(0), 29, Some(0)), None);
    }

    #[test]
    fn window_at_the_end_of_time_does_not_overflow() {
        let now = step_of(u64::MAX);
        assert_eq!(verify_code(SECRET, &code(now), u64::MAX, None), Some(now));
        assert_eq!(
            verify_code(SECRET, &code(now + 1), u64::MAX, None),
            Some(now + 1)
        );
        assert_eq!(
            verify_code(SECRET, &code(now - 1), u64::MAX, None),
            Some(now - 1)
        );
        assert_eq!(
            verify_code(SECRET, &code(now), u64::MAX, Some(u64::MAX)),
            None
        );
    }

    #[test]
    fn same_code_in_two_steps_returns_the_latest() {
        // For this secret, steps 910737 and 910738 share the code 911617 (found by search).
        assert_eq!(code(910_737), "911617");
        assert_eq!(code(910_738), "911617");
        let time = 910_737 * STEP_SECS;
        // Both steps are in the window; the later is returned, so storing it blocks both.
        assert_eq!(verify_code(SECRET, "911617", time, None), Some(910_738));
        assert_eq!(verify_code(SECRET, "911617", time, Some(910_738)), None);
        // With only the earlier step used, the later one is still accepted.
        assert_eq!(
            verify_code(SECRET, "911617", time, Some(910_737)),
            Some(910_738)
        );
    }

    #[test]
    fn replay_is_rejected() {
        let time = 1_111_111_111;
        let now = step_of(time);
        let accepted = verify_code(SECRET, &code(now), time, None);
        assert_eq!(accepted, Some(now));
        // The same code again, with the accepted step stored: rejected.
        assert_eq!(verify_code(SECRET, &code(now), time, accepted), None);
        assert_eq!(verify_code(SECRET, &code(now), time + 1, accepted), None);
        // An older step inside the window: rejected too.
        assert_eq!(verify_code(SECRET, &code(now - 1), time, accepted), None);
        // The next step is still accepted.
        assert_eq!(
            verify_code(SECRET, &code(now + 1), time, accepted),
            Some(now + 1)
        );
        // After a future step was accepted, the current one is refused.
        assert_eq!(verify_code(SECRET, &code(now), time, Some(now + 1)), None);
        // A last step older than the window changes nothing.
        assert_eq!(
            verify_code(SECRET, &code(now - 1), time, Some(now - 2)),
            Some(now - 1)
        );
    }

    #[test]
    fn malformed_codes_are_rejected() {
        let time = 1_111_111_111;
        let good = code(step_of(time));
        assert_eq!(verify_code(SECRET, &good, time, None), Some(step_of(time)));
        let five = &good[..5];
        let seven = format!("{good}0");
        let spaced = format!("{} {}", &good[..3], &good[3..]);
        let padded = format!(" {good}");
        let trailing = format!("{good}\n");
        let letter = format!("{}a", &good[..5]);
        let plus = format!("+{}", &good[1..]);
        let full_width: String = good
            .chars()
            .map(|c| char::from_u32(c as u32 - '0' as u32 + 0xFF10).unwrap())
            .collect();
        for bad in [
            "",
            five,
            seven.as_str(),
            spaced.as_str(),
            padded.as_str(),
            trailing.as_str(),
            letter.as_str(),
            plus.as_str(),
            full_width.as_str(),
            "abcdef",
            "12345678",
        ] {
            assert_eq!(verify_code(SECRET, bad, time, None), None, "{bad:?}");
        }
    }

    #[test]
    fn wrong_secret_is_rejected() {
        let time = 1_111_111_111;
        let other = code_at_step(b"another secret", step_of(time), TotpAlgorithm::Sha1, 6);
        assert_ne!(other, code(step_of(time)));
        assert_eq!(verify_code(SECRET, &other, time, None), None);
    }

    #[test]
    fn otpauth_uri_sample() {
        assert_eq!(
            otpauth_uri("TwoFactorAuth", "alice@example.com", "JBSWY3DPEHPK3PXP"),
            "otpauth://totp/TwoFactorAuth:alice%40example.com?secret=JBSWY3DPEHPK3PXP\
             &issuer=TwoFactorAuth&algorithm=SHA1&digits=6&period=30"
        );
    }

    #[test]
    fn otpauth_uri_percent_encodes_issuer_and_account() {
        assert_eq!(
            otpauth_uri("Acme Co", "bob+2fa:x/y?&=#ü~_.-", "MZXW6"),
            "otpauth://totp/Acme%20Co:bob%2B2fa%3Ax%2Fy%3F%26%3D%23%C3%BC~_.-?secret=MZXW6\
             &issuer=Acme%20Co&algorithm=SHA1&digits=6&period=30"
        );
    }

    #[test]
    fn otpauth_uri_secret_round_trips() {
        let secret = [0xA5u8; 20];
        let b32 = base32_encode(&secret);
        let uri = otpauth_uri("I", "a", &b32);
        let value = uri
            .split("secret=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap();
        assert_eq!(base32_decode(value).as_deref(), Some(&secret[..]));
    }
}
