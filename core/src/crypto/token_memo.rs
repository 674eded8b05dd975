//! A [`Verifier`] that remembers the tokens it has accepted, for a gateway
//! that sees the same access token on request after request (the edge
//! filter: a client sends its token with every call for up to 15 minutes).
//!
//! [`Verifier::verify`] is a function of the token, the verifier's keys and
//! policy, and `now`; of its checks only two depend on `now` (`exp` and
//! `nbf`, with the leeway). So once a token has passed, the same token
//! passes again exactly when those two still hold: [`MemoVerifier::verify`]
//! answers a token it holds from its copy of the claims, re-checking `exp`
//! and `nbf` against the `now` it is given, and skips the decoding, the JSON
//! and the MAC. Any other token, a token one byte away from a held one
//! included, goes through [`Verifier::verify`].
//!
//! - Only accepted tokens are held, so a flood of bad tokens cannot fill it,
//!   and a refusal is never remembered.
//! - It is direct-mapped: [`SLOTS`] slots, a token goes to the slot of its
//!   FNV-1a hash, a newer accepted token takes the slot over. It never
//!   grows; tokens over [`MAX_TOKEN`] bytes are not held.
//! - A held token is recognised by comparing the whole token in constant
//!   time, never by its hash alone.
//! - It belongs to one verifier: a new configuration (other secrets,
//!   issuer, audience or leeway) makes a new `MemoVerifier`, empty.
//!
//! What it does not do: read the clock (`now` is an argument, as for
//! [`Verifier::verify`]), share anything between threads (it is not `Sync`:
//! one per worker, its slots behind a `RefCell`), or drop entries on its own
//! (an expired token stays until its slot is taken, and is refused with
//! [`TokenError::Expired`] meanwhile).

use std::cell::RefCell;

use crate::crypto::codes::ct_eq;
use crate::crypto::tokens::{check_time, Claims, TokenError, Verifier};

/// How many tokens are held at most.
pub const SLOTS: usize = 128;
/// Longest token held, in bytes (with [`SLOTS`], bounds the memory held).
pub const MAX_TOKEN: usize = 2048;

/// A held token and the claims it was accepted with.
type Held = (Box<str>, Claims);

/// A [`Verifier`] with a memo of the tokens it has accepted.
pub struct MemoVerifier {
    verifier: Verifier,
    slots: RefCell<Vec<Option<Held>>>,
}

impl MemoVerifier {
    /// Wraps `verifier`, with nothing held.
    pub fn new(verifier: Verifier) -> Self {
        MemoVerifier {
            verifier,
            slots: RefCell::new(vec![None; SLOTS]),
        }
    }

    /// What [`Verifier::verify`] answers for `token` at `now_secs`, from the
    /// memo when `token` is held; an accepted token is then held.
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, TokenError> {
        let slot = slot_of(token);
        if let Some((held, claims)) = &self.slots.borrow()[slot] {
            if ct_eq(held.as_bytes(), token.as_bytes()) {
                check_time(
                    claims.exp,
                    claims.nbf,
                    self.verifier.leeway_secs(),
                    now_secs,
                )?;
                return Ok(claims.clone());
            }
        }
        let claims = self.verifier.verify(token, now_secs)?;
        if token.len() <= MAX_TOKEN {
            self.slots.borrow_mut()[slot] = Some((token.into(), claims.clone()));
        }
        Ok(claims)
    }

    /// How many tokens are held now.
    pub fn held(&self) -> usize {
        self.slots.borrow().iter().flatten().count()
    }
}

/// The slot of `token`: its 64-bit FNV-1a hash modulo [`SLOTS`].
fn slot_of(token: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in token.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below SLOTS, so it fits in a usize.
    (h % SLOTS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::tokens::tests::{hs256_header, sign_raw};
    use crate::crypto::tokens::{Extra, TokenKeys, TokenKind};

    const ISS: &str = "tfa-api";
    const AUD: &str = "tfa-clients";
    const T0: u64 = 1_767_225_600;

    fn keys(secret: &str) -> TokenKeys {
        TokenKeys::new(secret.as_bytes(), b"r", b"t", b"d", ISS, AUD)
    }

    fn access(keys: &TokenKeys, sub: &str, iat: u64) -> String {
        let extra = Extra {
            sid: Some(format!("sid-{sub}")),
            mfa: Some(true),
            ..Extra::default()
        };
        keys.issue(TokenKind::Access, sub, extra, iat)
    }

    /// An access token that is not valid before `nbf` (the API never sets
    /// one; other issuers may), signed by hand.
    fn with_nbf(secret: &[u8], nbf: u64) -> String {
        let payload = serde_json::json!({
            "sub": "carol", "sid": "s", "mfa": false, "typ": "access",
            "iss": ISS, "aud": AUD, "iat": T0, "exp": T0 + 900, "nbf": nbf
        });
        sign_raw(&hs256_header(), &payload, secret)
    }

    fn verifier(leeway: u64) -> Verifier {
        Verifier::new(
            TokenKind::Access,
            &[b"access-secret-one".to_vec()],
            ISS,
            AUD,
            leeway,
        )
    }

    /// At every time around a token's life, in any order of calls, the memo
    /// answers what a plain verification answers: held tokens still expire
    /// (with the leeway), and what was refused stays refused.
    #[test]
    fn answers_what_the_verifier_answers_at_every_time() {
        let ours = keys("access-secret-one");
        let theirs = keys("another-secret");
        let valid = access(&ours, "alice", T0);
        let later = access(&ours, "bob", T0 + 600);
        let forged = access(&theirs, "alice", T0);
        let mut tampered = valid.clone();
        tampered.pop();
        tampered.push(if valid.ends_with('A') { 'B' } else { 'A' });
        let refresh = ours.issue(
            TokenKind::Refresh,
            "alice",
            Extra {
                sid: Some("s".into()),
                jti: Some("j".into()),
                ..Extra::default()
            },
            T0,
        );
        let not_before = with_nbf(b"access-secret-one", T0 + 100);
        let tokens = [
            &valid,
            &later,
            &not_before,
            &forged,
            &tampered,
            &refresh,
            &String::new(),
        ];
        let life = TokenKind::Access.lifetime_secs();
        let times = [
            0,
            T0,
            T0 + 69,
            T0 + 70,
            T0 + 99,
            T0 + 100,
            T0 + 1,
            T0 + life - 1,
            T0 + life,
            T0 + life + 29,
            T0 + life + 30,
            T0 + 600 + life + 30,
            u64::MAX,
        ];
        for leeway in [0, 30] {
            let plain = verifier(leeway);
            let memo = MemoVerifier::new(verifier(leeway));
            for round in 0..3 {
                // Forwards, backwards, then forwards again: held tokens are
                // asked about at times before and after the first answer.
                let mut order: Vec<u64> = times.to_vec();
                if round == 1 {
                    order.reverse();
                }
                for &now in &order {
                    for token in tokens {
                        assert_eq!(
                            memo.verify(token, now),
                            plain.verify(token, now),
                            "leeway {leeway}, now {now}, token {token:?}"
                        );
                    }
                }
            }
            assert!(memo.held() >= 1);
        }
    }

    /// Only accepted tokens are held; the memo never holds more than its
    /// slots, and tokens that share a slot are each still verified right.
    #[test]
    fn holds_only_accepted_tokens_and_never_more_than_its_slots() {
        let ours = keys("access-secret-one");
        let theirs = keys("another-secret");
        let memo = MemoVerifier::new(verifier(0));
        for i in 0..50 {
            let forged = access(&theirs, &format!("u{i}"), T0);
            assert_eq!(memo.verify(&forged, T0), Err(TokenError::BadSignature));
        }
        assert_eq!(memo.held(), 0);
        let tokens: Vec<String> = (0..3 * SLOTS)
            .map(|i| access(&ours, &format!("u{i}"), T0))
            .collect();
        for _ in 0..2 {
            for (i, t) in tokens.iter().enumerate() {
                let claims = memo.verify(t, T0 + 1).expect("a valid token");
                assert_eq!(claims.sub, format!("u{i}"));
            }
        }
        assert!(memo.held() <= SLOTS);
        assert!(memo.held() > SLOTS / 2, "{} held", memo.held());
    }

    #[test]
    fn slots_are_in_range_and_spread() {
        let used: std::collections::HashSet<usize> =
            (0..1000).map(|i| slot_of(&format!("token-{i}"))).collect();
        assert!(used.iter().all(|&s| s < SLOTS));
        assert!(used.len() > SLOTS * 9 / 10, "{} slots used", used.len());
    }
}
