//! One-time codes (six digits, sent by e-mail or SMS) and backup codes (ten
//! characters from `A`–`Z0`–`9`): drawing them uniformly from the host's
//! random source, normalising what a user types, and the keyed hashes under
//! which they are stored.
//!
//! What this module does not do: it keeps no state (expiry, attempt counts,
//! single use and storage are the callers' business), reads no clock, and
//! never asks the OS for randomness: random bytes come from the
//! [`Rng`] port.
//!
//! Codes are stored as [`keyed_hash`]es, an HMAC under a key
//! [derived](derive_key) from a server secret and salted per user, so a
//! leaked store alone does not let one test guesses offline; compare stored
//! hashes with [`ct_eq`].

use crate::contract::ports::Rng;
use crate::crypto::signature::{hmac_sha256, to_hex};

/// The 36 characters of a backup code, in index order.
const BACKUP_ALPHABET: &[u8; 36] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Length of a backup code.
const BACKUP_LEN: usize = 10;

/// Number of digits of a one-time code.
const OTP_LEN: usize = 6;

/// 10^6: the number of distinct one-time codes.
const OTP_SPACE: u32 = 1_000_000;

/// The largest multiple of [`OTP_SPACE`] that fits in 2^32: random `u32`s at
/// or above it are rejected so that `x % OTP_SPACE` is uniform.
const OTP_LIMIT: u32 = (u32::MAX / OTP_SPACE) * OTP_SPACE;

/// The largest multiple of 36 that fits in a byte (252): random bytes at or
/// above it are rejected so that `b % 36` is uniform.
const BACKUP_LIMIT: u8 = (u8::MAX / 36) * 36;

/// 6 decimal digits, uniform (rejection sampling on random u32s, no modulo bias).
///
/// Each attempt fills 4 bytes from `rng`, read as a little-endian `u32`;
/// values of 4 294 000 000 or more are drawn again (a chance of about 1 in
/// 4 400), the rest give `value % 1_000_000`, zero-padded to six digits.
/// A generator that only ever returns rejected values (e.g. all `0xff`)
/// makes this loop forever.
pub fn otp_code(rng: &mut dyn Rng) -> String {
    loop {
        let mut buf = [0u8; 4];
        rng.fill(&mut buf);
        let x = u32::from_le_bytes(buf);
        if x < OTP_LIMIT {
            return format!("{:06}", x % OTP_SPACE);
        }
    }
}

/// 10 characters from A–Z0–9, uniform (rejection sampling on random bytes).
///
/// Random bytes are drawn 16 at a time; bytes of 252 or more are skipped
/// (a chance of 1 in 64 each), the others pick `BACKUP_ALPHABET[b % 36]`
/// (`A`–`Z` then `0`–`9`). A generator that only ever returns bytes of 252
/// or more makes this loop forever.
pub fn backup_code(rng: &mut dyn Rng) -> String {
    let mut out = String::with_capacity(BACKUP_LEN);
    let mut buf = [0u8; 16];
    while out.len() < BACKUP_LEN {
        rng.fill(&mut buf);
        for &b in &buf {
            if out.len() == BACKUP_LEN {
                break;
            }
            if b < BACKUP_LIMIT {
                out.push(char::from(BACKUP_ALPHABET[usize::from(b % 36)]));
            }
        }
    }
    out
}

/// Upper-cases, removes spaces and hyphens; Some only if the result is exactly 10 chars of A–Z0–9.
///
/// Only ASCII letters are upper-cased and only ASCII spaces (`' '`) and
/// hyphens (`'-'`) are removed, so no non-ASCII input (full-width letters,
/// `ß`, dotless `ı`, …) can turn into an accepted code.
pub fn normalize_backup_code(input: &str) -> Option<String> {
    let mut out = String::with_capacity(BACKUP_LEN);
    for c in input.chars() {
        match c {
            ' ' | '-' => {}
            'a'..='z' | 'A'..='Z' | '0'..='9' => {
                if out.len() == BACKUP_LEN {
                    return None;
                }
                out.push(c.to_ascii_uppercase());
            }
            _ => return None,
        }
    }
    (out.len() == BACKUP_LEN).then_some(out)
}

/// Trims surrounding whitespace and removes inner spaces; Some only if exactly 6 ASCII digits.
///
/// "Surrounding whitespace" is any Unicode whitespace at either end; inside,
/// only ASCII spaces (`' '`) are removed. Non-ASCII digits are rejected.
pub fn normalize_otp_code(input: &str) -> Option<String> {
    let mut out = String::with_capacity(OTP_LEN);
    for c in input.trim().chars() {
        match c {
            ' ' => {}
            '0'..='9' => {
                if out.len() == OTP_LEN {
                    return None;
                }
                out.push(c);
            }
            _ => return None,
        }
    }
    (out.len() == OTP_LEN).then_some(out)
}

/// HMAC-SHA-256(server_secret, "tfa-core/" + purpose): a per-purpose key from a server secret.
///
/// Different purposes give independent keys, so a hash made for one use can
/// never be replayed as another's.
pub fn derive_key(server_secret: &[u8], purpose: &str) -> [u8; 32] {
    let mut label = Vec::with_capacity("tfa-core/".len() + purpose.len());
    label.extend_from_slice(b"tfa-core/");
    label.extend_from_slice(purpose.as_bytes());
    hmac_sha256(server_secret, &label)
}

/// Lower-case hex of HMAC-SHA-256(key, salt || 0x00 || code). Salt is per user (e.g. the user id).
///
/// The `0x00` separator keeps salt and code apart as long as the salt holds
/// no NUL character (user ids do not).
pub fn keyed_hash(key: &[u8; 32], salt: &str, code: &str) -> String {
    let mut msg = Vec::with_capacity(salt.len() + 1 + code.len());
    msg.extend_from_slice(salt.as_bytes());
    msg.push(0x00);
    msg.extend_from_slice(code.as_bytes());
    to_hex(&hmac_sha256(key, &msg))
}

/// Constant-time equality of two byte strings (false for different lengths, without early exit on content).
///
/// Lengths are not secret: different lengths return `false` at once. For
/// equal lengths every byte is visited and the differences are OR-ed
/// together; the accumulator passes through [`std::hint::black_box`] so the
/// optimiser cannot turn the loop into an early exit.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff = std::hint::black_box(diff | (x ^ y));
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ports::Rng;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// SplitMix64: a small, seeded, deterministic generator for tests.
    struct SplitMix64(u64);

    impl SplitMix64 {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    impl Rng for SplitMix64 {
        fn fill(&mut self, dest: &mut [u8]) {
            for chunk in dest.chunks_mut(8) {
                let bytes = self.next_u64().to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
        }
    }

    /// Hands out a fixed script of bytes, then zeros.
    struct Scripted(VecDeque<u8>);

    impl Scripted {
        fn new(bytes: &[u8]) -> Self {
            Scripted(bytes.iter().copied().collect())
        }
    }

    impl Rng for Scripted {
        fn fill(&mut self, dest: &mut [u8]) {
            for d in dest {
                *d = self.0.pop_front().unwrap_or(0);
            }
        }
    }

    #[test]
    fn splitmix_known_answer() {
        // Reference output of SplitMix64 seeded with 0.
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn limits() {
        assert_eq!(OTP_LIMIT, 4_294_000_000);
        assert_eq!(BACKUP_LIMIT, 252);
        assert_eq!(BACKUP_ALPHABET.len(), 36);
    }

    #[test]
    fn otp_deterministic_and_well_formed() {
        let a: Vec<String> = {
            let mut r = SplitMix64(42);
            (0..50).map(|_| otp_code(&mut r)).collect()
        };
        let b: Vec<String> = {
            let mut r = SplitMix64(42);
            (0..50).map(|_| otp_code(&mut r)).collect()
        };
        assert_eq!(a, b);
        let c: Vec<String> = {
            let mut r = SplitMix64(43);
            (0..50).map(|_| otp_code(&mut r)).collect()
        };
        assert_ne!(a, c);
        for code in &a {
            assert_eq!(code.len(), 6);
            assert!(code.bytes().all(|b| b.is_ascii_digit()), "{code}");
            assert_eq!(normalize_otp_code(code).as_deref(), Some(code.as_str()));
        }
    }

    #[test]
    fn otp_rejection_sampling_known_answers() {
        // Little-endian u32s: 0 -> "000000".
        assert_eq!(otp_code(&mut Scripted::new(&[0, 0, 0, 0])), "000000");
        // 4_293_999_999 is the largest accepted value -> "999999".
        let max_ok = (OTP_LIMIT - 1).to_le_bytes();
        assert_eq!(otp_code(&mut Scripted::new(&max_ok)), "999999");
        // 4_294_000_000 and u32::MAX are rejected; the next draw is used.
        let mut script = Vec::new();
        script.extend_from_slice(&OTP_LIMIT.to_le_bytes());
        script.extend_from_slice(&u32::MAX.to_le_bytes());
        script.extend_from_slice(&1_234_567u32.to_le_bytes());
        let mut r = Scripted::new(&script);
        assert_eq!(otp_code(&mut r), "234567");
        assert!(r.0.is_empty(), "consumed exactly three u32s");
        // Leading zeros are kept.
        assert_eq!(otp_code(&mut Scripted::new(&7u32.to_le_bytes())), "000007");
    }

    #[test]
    fn backup_deterministic_and_well_formed() {
        let mut r1 = SplitMix64(7);
        let mut r2 = SplitMix64(7);
        for _ in 0..100 {
            let a = backup_code(&mut r1);
            assert_eq!(a, backup_code(&mut r2));
            assert_eq!(a.len(), 10);
            assert!(a.bytes().all(|b| BACKUP_ALPHABET.contains(&b)), "{a}");
            assert_eq!(normalize_backup_code(&a).as_deref(), Some(a.as_str()));
        }
        assert_ne!(
            backup_code(&mut SplitMix64(1)),
            backup_code(&mut SplitMix64(2))
        );
    }

    #[test]
    fn backup_rejection_sampling_known_answers() {
        // 252..=255 are skipped; 0 -> 'A', 25 -> 'Z', 26 -> '0', 35 -> '9',
        // 36 -> 'A', 251 = 6*36 + 35 -> '9'.
        let script = [252, 255, 0, 25, 26, 35, 36, 251, 253, 1, 2, 3, 4];
        let mut r = Scripted::new(&script);
        assert_eq!(backup_code(&mut r), "AZ09A9BCDE");
        // Needs more than one batch of 16 when many bytes are rejected.
        let mut script = vec![255u8; 20];
        script.extend_from_slice(&[2; 10]);
        assert_eq!(backup_code(&mut Scripted::new(&script)), "CCCCCCCCCC");
    }

    /// Pearson's chi-square statistic of `counts` against a uniform law.
    fn chi_square(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        counts
            .iter()
            .map(|&c| {
                let d = c as f64 - expected;
                d * d / expected
            })
            .sum()
    }

    #[test]
    fn otp_rough_uniformity() {
        let mut r = SplitMix64(0x5eed);
        let mut per_position = [[0u64; 10]; 6];
        let mut buckets = [0u64; 100]; // first two digits together
        for _ in 0..20_000 {
            let code = otp_code(&mut r);
            for (i, b) in code.bytes().enumerate() {
                per_position[i][usize::from(b - b'0')] += 1;
            }
            let lead: usize = code[..2].parse().expect("digits");
            buckets[lead] += 1;
        }
        // 9 degrees of freedom: p = 0.001 at 27.9. Seeded, so not flaky.
        for (i, counts) in per_position.iter().enumerate() {
            let x2 = chi_square(counts);
            assert!(x2 < 30.0, "position {i}: chi-square {x2}");
        }
        // 99 degrees of freedom: p = 0.001 at 148.2.
        let x2 = chi_square(&buckets);
        assert!(x2 < 150.0, "leading pair: chi-square {x2}");
    }

    #[test]
    fn backup_rough_uniformity() {
        let mut r = SplitMix64(0xbac0);
        let mut counts = [0u64; 36];
        let mut first = [0u64; 36];
        for _ in 0..20_000 {
            let code = backup_code(&mut r);
            for (i, b) in code.bytes().enumerate() {
                let idx = BACKUP_ALPHABET
                    .iter()
                    .position(|&a| a == b)
                    .expect("in alphabet");
                counts[idx] += 1;
                if i == 0 {
                    first[idx] += 1;
                }
            }
        }
        // 35 degrees of freedom: p = 0.001 at 66.6.
        let x2 = chi_square(&counts);
        assert!(x2 < 70.0, "all characters: chi-square {x2}");
        let x2 = chi_square(&first);
        assert!(x2 < 70.0, "first character: chi-square {x2}");
    }

    #[test]
    fn modulo_without_rejection_would_be_biased() {
        // Sanity check of the test itself: the naive `b % 36` over all 256
        // byte values favours indices 0..4 (8 hits against 7), which the
        // rejection limit removes.
        let mut naive = [0u32; 36];
        let mut fair = [0u32; 36];
        for b in 0..=255u8 {
            naive[usize::from(b % 36)] += 1;
            if b < BACKUP_LIMIT {
                fair[usize::from(b % 36)] += 1;
            }
        }
        assert_eq!(naive[0], 8);
        assert_eq!(naive[35], 7);
        assert!(fair.iter().all(|&c| c == 7));
    }

    #[test]
    fn backup_normalisation_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("ABCDEFGHIJ", Some("ABCDEFGHIJ")),
            ("abcdefghij", Some("ABCDEFGHIJ")),
            ("aBcDe12345", Some("ABCDE12345")),
            ("abcde-fghij", Some("ABCDEFGHIJ")),
            (" ABCDE FGHIJ ", Some("ABCDEFGHIJ")),
            ("--ab cd-ef gh-ij--", Some("ABCDEFGHIJ")),
            ("0123456789", Some("0123456789")),
            ("ABCDEFGHI", None),
            ("ABCDEFGHIJK", None),
            ("abcde-fghi", None),
            ("ABCDE_FGHIJ", None),
            ("ABCDE.FGHIJ", None),
            ("ABCDE\tFGHIJ", None),
            ("ABCDE\nFGHIJ", None),
            ("ＡBCDEFGHIJ", None),
            ("ßABCDEFGH", None),
            ("ıABCDEFGHI", None),
            ("ABCDEFGHI\u{0130}", None),
            ("ABCDEFGHI\u{212a}", None),
            ("", None),
            ("          ", None),
            ("----------", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                normalize_backup_code(input).as_deref(),
                *want,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn otp_normalisation_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("123456", Some("123456")),
            ("000000", Some("000000")),
            (" 123456 ", Some("123456")),
            ("\t123456\n", Some("123456")),
            ("123 456", Some("123456")),
            ("1 2 3 4 5 6", Some("123456")),
            ("12345", None),
            ("1234567", None),
            ("123-456", None),
            ("123\t456", None),
            ("12345a", None),
            ("+12345", None),
            ("١٢٣٤٥٦", None),
            ("１２３４５６", None),
            ("", None),
            ("      ", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                normalize_otp_code(input).as_deref(),
                *want,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn derive_key_known_construction() {
        let secret = b"server secret";
        assert_eq!(
            derive_key(secret, "backup"),
            hmac_sha256(secret, b"tfa-core/backup")
        );
        assert_ne!(derive_key(secret, "backup"), derive_key(secret, "otp"));
        assert_ne!(
            derive_key(secret, "otp"),
            derive_key(b"other secret", "otp")
        );
        assert_eq!(derive_key(secret, ""), hmac_sha256(secret, b"tfa-core/"));
    }

    #[test]
    fn keyed_hash_construction_and_separation() {
        let key = derive_key(b"server secret", "backup");
        let h = keyed_hash(&key, "user-1", "ABCDEFGHIJ");
        assert_eq!(h, to_hex(&hmac_sha256(&key, b"user-1\0ABCDEFGHIJ")));
        assert_eq!(h.len(), 64);
        assert!(h
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        // Deterministic.
        assert_eq!(h, keyed_hash(&key, "user-1", "ABCDEFGHIJ"));
        // Differs by salt, by key and by code.
        assert_ne!(h, keyed_hash(&key, "user-2", "ABCDEFGHIJ"));
        let other_key = derive_key(b"server secret", "otp");
        assert_ne!(h, keyed_hash(&other_key, "user-1", "ABCDEFGHIJ"));
        assert_ne!(h, keyed_hash(&key, "user-1", "ABCDEFGHIK"));
        // The separator keeps salt and code apart.
        assert_ne!(keyed_hash(&key, "ab", "c"), keyed_hash(&key, "a", "bc"));
    }

    #[test]
    fn ct_eq_cases() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"bbc"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"ab", b"abc"));
        assert!(!ct_eq(b"", b"a"));
        let x = [0x55u8; 64];
        for i in 0..64 {
            for bit in 0..8 {
                let mut y = x;
                y[i] ^= 1 << bit;
                assert!(!ct_eq(&x, &y), "byte {i} bit {bit}");
            }
        }
    }

    /// A valid backup code with separators inserted and letters in random case.
    fn decorated_backup() -> impl Strategy<Value = (String, String)> {
        proptest::collection::vec(("[A-Z0-9]", "[ -]{0,2}", any::<bool>()), 10).prop_flat_map(
            |parts| {
                "[ -]{0,3}".prop_map(move |tail| {
                    let mut clean = String::new();
                    let mut decorated = String::new();
                    for (c, sep, lower) in &parts {
                        clean.push_str(c);
                        decorated.push_str(sep);
                        if *lower {
                            decorated.push_str(&c.to_ascii_lowercase());
                        } else {
                            decorated.push_str(c);
                        }
                    }
                    decorated.push_str(&tail);
                    (clean, decorated)
                })
            },
        )
    }

    proptest! {
        #[test]
        fn prop_backup_normalise_idempotent(x in prop_oneof![any::<String>(), "[a-zA-Z0-9 _-]{0,16}"]) {
            if let Some(y) = normalize_backup_code(&x) {
                prop_assert_eq!(y.len(), 10);
                prop_assert_eq!(normalize_backup_code(&y), Some(y.clone()));
            }
        }

        #[test]
        fn prop_otp_normalise_idempotent(x in prop_oneof![any::<String>(), "[0-9 a\t]{0,10}"]) {
            if let Some(y) = normalize_otp_code(&x) {
                prop_assert_eq!(y.len(), 6);
                prop_assert_eq!(normalize_otp_code(&y), Some(y.clone()));
            }
        }

        #[test]
        fn prop_decorated_backup_normalises_back((clean, decorated) in decorated_backup()) {
            prop_assert_eq!(normalize_backup_code(&decorated), Some(clean));
        }

        #[test]
        fn prop_spaced_otp_normalises_back(digits in "[0-9]{6}", lead in "[ \t]{0,3}", mid in " {0,2}") {
            let spaced = format!("{lead}{}{mid}{}{lead}", &digits[..3], &digits[3..]);
            prop_assert_eq!(normalize_otp_code(&spaced), Some(digits));
        }

        #[test]
        fn prop_ct_eq_matches_eq(a in proptest::collection::vec(any::<u8>(), 0..40),
                                 b in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(ct_eq(&a, &b), a == b);
            prop_assert!(ct_eq(&a, &a));
        }

        #[test]
        fn prop_codes_well_formed(seed in any::<u64>()) {
            let mut r = SplitMix64(seed);
            let otp = otp_code(&mut r);
            prop_assert_eq!(normalize_otp_code(&otp), Some(otp.clone()));
            let backup = backup_code(&mut r);
            prop_assert_eq!(normalize_backup_code(&backup), Some(backup.clone()));
        }
    }
}
