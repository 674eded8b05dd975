//! Small pure helpers: identifiers and timestamps.

use crate::contract::ports::Env;

/// A random (version 4) UUID in its canonical text form.
///
/// Written digit by digit, like [`iso8601`]: a verification makes two (the
/// session's and the audit record's), and each took about 10,000 wasm
/// instructions when it was `format!` over `to_hex`'s text (callgrind of
/// `POST /2fa/verify`, 2026-12-05).
pub fn uuid_v4(env: &mut Env) -> String {
    let mut b: [u8; 16] = env.random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    uuid_text(&b)
}

/// The canonical text of the UUID `b`: [`to_hex`]'s 32 lower-case digits
/// in groups of 8, 4, 4, 4 and 12, joined by `-`.
///
/// [`to_hex`]: crate::crypto::signature::to_hex
fn uuid_text(b: &[u8; 16]) -> String {
    let mut out = crate::crypto::signature::to_hex(b);
    out.reserve_exact(4);
    for at in [8, 13, 18, 23] {
        out.insert(at, '-');
    }
    out
}

/// `parts` joined into a store key: one allocation and a copy (why not
/// `format!`: [`Decimal`]). Not inlined: one copy of `concat` serves every
/// key.
#[inline(never)]
pub fn key(parts: &[&str]) -> String {
    parts.concat()
}

/// The entry counter of a bucketed queue's `bucket`, `{queue}n:{bucket}`:
/// housekeeping's expiries (`hk:`) and the webhook retry queue (`wq:`) are
/// both a counter per time bucket and numbered entries.
pub fn bucket_count_key(queue: &str, bucket: u64) -> String {
    key(&[queue, "n:", Decimal::of(bucket).as_str()])
}

/// The key of entry number `n` of a bucketed queue's `bucket`,
/// `{queue}e:{bucket}:{n}` (see [`bucket_count_key`]).
pub fn bucket_entry_key(queue: &str, bucket: u64, n: Decimal) -> String {
    key(&[queue, "e:", Decimal::of(bucket).as_str(), ":", n.as_str()])
}

/// The decimal digits of a number, as `to_string` writes them, on the
/// stack: for store keys with a number in them (`audit:{user}:{n}`,
/// `hk:e:{bucket}:{n}`, `lk:{name}:{period}`, `rl:{rule}:{subject}:{start}`,
/// `wq:e:{bucket}:{n}`), joined by [`key`].
///
/// Keys on a request's path are built without `format!`, which cost 1,200
/// to 2,300 wasm instructions a key (callgrind of `POST /2fa/verify`,
/// 2026-12-05: about twenty keys a verification); [`key`] is one
/// allocation and a copy.
pub struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    /// The digits of `n`.
    #[inline(never)]
    pub fn of(mut n: u64) -> Decimal {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            // `n % 10` is below 10: the cast and the sum cannot overflow.
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { buf, start }
    }

    /// The digits of `n`, after a `-` when it is negative (a store's
    /// counters are `i64`).
    pub fn of_signed(n: i64) -> Decimal {
        let mut d = Decimal::of(n.unsigned_abs());
        if n < 0 {
            // At most 19 digits (9,223,372,036,854,775,808): room for the sign.
            d.start -= 1;
            d.buf[d.start] = b'-';
        }
        d
    }

    /// The digits, most significant first; no sign, no leading zeros.
    #[inline(never)]
    pub fn as_str(&self) -> &str {
        // Only ASCII digits are ever written from `start` on.
        std::str::from_utf8(&self.buf[self.start..]).unwrap_or("0")
    }
}

/// True for a canonical lower-case UUID (what [`uuid_v4`] makes). Ids from
/// paths are checked with it before they reach a store key.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// A random token of `n` bytes as lower-case hex.
pub fn random_hex(env: &mut Env, n: usize) -> String {
    let mut b = vec![0u8; n];
    env.rng.fill(&mut b);
    crate::crypto::signature::to_hex(&b)
}

/// ISO 8601 / RFC 3339 UTC timestamp with milliseconds, e.g.
/// `2024-01-02T03:04:05.678Z`.
///
/// Written digit by digit: every user and session in a response carries
/// two of these, and `format!` with seven padded fields cost about 8,000
/// wasm instructions each (callgrind of `GET /auth/me`), this about 400.
pub fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    if y > 9999 {
        // Five-digit years (from the year 10000 on) are not fixed-width.
        return iso8601_formatted(ms);
    }
    let mut out = *b"0000-00-00T00:00:00.000Z";
    digits(&mut out[0..4], y);
    digits(&mut out[5..7], m);
    digits(&mut out[8..10], d);
    digits(&mut out[11..13], rem / 3600);
    digits(&mut out[14..16], (rem % 3600) / 60);
    digits(&mut out[17..19], rem % 60);
    digits(&mut out[20..23], millis);
    out.iter().map(|&b| char::from(b)).collect()
}

/// [`iso8601`] by `format!`: its path for five-digit years, and the
/// reference its tests compare the digit-by-digit writer with.
fn iso8601_formatted(ms: u64) -> String {
    let secs = ms / 1000;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(secs / 86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

/// Writes the last `dst.len()` decimal digits of `v` into `dst`.
fn digits(dst: &mut [u8], mut v: u64) {
    for slot in dst.iter_mut().rev() {
        // `v % 10` is below 10, so the cast and the sum cannot overflow.
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (H. Hinnant's algorithm, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso8601(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        assert_eq!(iso8601(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(iso8601(253_402_300_800_000), "10000-01-01T00:00:00.000Z");
    }

    /// The digit-by-digit writer agrees with `format!` on instants spread
    /// over four centuries (every day boundary and odd times between).
    #[test]
    fn iso8601_matches_the_formatted_fields() {
        let mut ms = 0u64;
        while ms < 12_700_000_000_000 {
            assert_eq!(iso8601(ms), iso8601_formatted(ms), "at {ms} ms");
            ms += 86_399_987 * 7 + 13;
        }
    }

    /// The digit-by-digit writer agrees with the hex text cut into its
    /// five groups, on all-zero, all-one and mixed bytes.
    #[test]
    fn uuid_text_matches_the_grouped_hex() {
        let mut mixed = [0u8; 16];
        for (i, b) in mixed.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        for b in [[0u8; 16], [0xff; 16], mixed] {
            let h = crate::crypto::signature::to_hex(&b);
            let grouped = format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            );
            assert_eq!(uuid_text(&b), grouped);
            assert!(is_uuid(&uuid_text(&b)));
        }
    }

    #[test]
    fn decimal_writes_what_to_string_writes() {
        let mut n = 1u64;
        for v in [
            0,
            1,
            9,
            10,
            99,
            100,
            1_700_000_000_123,
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(Decimal::of(v).as_str(), v.to_string());
        }
        while let Some(next) = n.checked_mul(7) {
            assert_eq!(Decimal::of(n).as_str(), n.to_string());
            assert_eq!(Decimal::of(n - 1).as_str(), (n - 1).to_string());
            n = next;
        }
        for v in [0, 1, -1, 42, -42, i64::MAX, i64::MIN, i64::MIN + 1] {
            assert_eq!(Decimal::of_signed(v).as_str(), v.to_string());
        }
    }

    #[test]
    fn uuid_shape() {
        assert!(is_uuid("123e4567-e89b-42d3-a456-426614174000"));
        assert!(!is_uuid("123e4567-e89b-42d3-a456-42661417400"));
        assert!(!is_uuid("../../../../e89b-42d3-a456-426614174000"));
        assert!(!is_uuid("123E4567-E89B-42D3-A456-426614174000"));
    }
}
