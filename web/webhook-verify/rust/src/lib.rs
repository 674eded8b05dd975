//! Webhook signatures for browsers and Node: the very code the service signs
//! with ([`tfa_core::signature`]), compiled for `wasm32-unknown-unknown` behind
//! a small hand-written ABI with no imports.
//!
//! # What it does
//!
//! - `verify` answers whether a signature header (`sha256=<hex>` or the bare
//!   64 hex digits) is HMAC-SHA-256 of a body under a secret, by calling
//!   [`tfa_core::signature::verify_signature`], whose tag comparison is
//!   constant time.
//! - `sign` writes the 71 bytes of `sha256=<64 lower-case hex>` that
//!   [`tfa_core::signature::sign_payload`] produces, for tests and for
//!   services that forward webhooks.
//!
//! # What it does not do
//!
//! It does not decode text: the secret, the body and the header arrive as
//! bytes, already UTF-8 encoded by the JS glue. It does not read headers,
//! clocks or timestamps (no replay protection), knows no algorithm but
//! HMAC-SHA-256, and imports nothing from its host: no console, no random
//! source, no `wasm-bindgen`.
//!
//! # How JS drives it
//!
//! The module exports its `memory` and four functions (see [`abi`]):
//!
//! 1. `alloc(len) -> ptr` reserves `len` bytes (0 when memory cannot grow);
//!    JS takes a fresh view of `memory.buffer` afterwards, since growing
//!    memory detaches the old one, and copies the inputs in.
//! 2. `verify(secret_ptr, secret_len, body_ptr, body_len, sig_ptr, sig_len)`
//!    returns 1 (valid), 0 (invalid) or -1 (out of memory).
//!    `sign(secret_ptr, secret_len, body_ptr, body_len, out_ptr)` writes
//!    71 bytes at `out_ptr` and returns 71, or -1 (out of memory).
//! 3. `dealloc(ptr, len)` gives the block back, with the same `len`.
//!
//! Inputs of any length are accepted; a header that is not UTF-8 is simply
//! invalid. Nothing here panics on any input, so no call traps.

pub mod abi;

/// Length of what `sign` writes: `sha256=` and 64 hex digits.
pub const SIGNATURE_LEN: usize = 71;

/// `verify` and `sign` return this when memory could not be reserved.
pub const OUT_OF_MEMORY: i32 = -1;

/// Whether `header` signs `body` under `secret`, exactly as the service
/// decides it; `None` if memory for the check could not be reserved.
///
/// A header that is not UTF-8 cannot be a signature: false.
pub fn verify_bytes(secret: &[u8], body: &[u8], header: &[u8]) -> Option<bool> {
    let Ok(header) = core::str::from_utf8(header) else {
        return Some(false);
    };
    ensure_headroom()?;
    Some(tfa_core::signature::verify_signature(secret, body, header))
}

/// The signature header value the service sends for `body` under `secret`;
/// `None` if memory for it could not be reserved.
pub fn sign_bytes(secret: &[u8], body: &[u8]) -> Option<[u8; SIGNATURE_LEN]> {
    ensure_headroom()?;
    let sig = tfa_core::signature::sign_payload(secret, body);
    let mut out = [0u8; SIGNATURE_LEN];
    // `sign_payload` always returns exactly 71 ASCII bytes; a different
    // length would be a change of the service's format, caught by tests.
    let bytes = sig.as_bytes();
    let n = bytes.len().min(SIGNATURE_LEN);
    out[..n].copy_from_slice(&bytes[..n]);
    Some(out)
}

/// Core allocates a little (a 32-byte tag in `verify`, the 71-byte string in
/// `sign`), and an allocation failure there would abort, which in wasm is a
/// trap. Reserving and freeing a block first, fallibly, makes sure the
/// allocator holds free memory for those small requests without growing
/// the linear memory, and turns "no memory left" into an error code.
fn ensure_headroom() -> Option<()> {
    let mut reserve: Vec<u8> = Vec::new();
    reserve.try_reserve_exact(1024).ok()?;
    drop(reserve);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfa_core::signature::sign_payload;

    #[test]
    fn sign_is_core_sign() {
        for (secret, body) in [
            (&b""[..], &b""[..]),
            (b"k", b"body"),
            (&[0xaa; 200], &[0xff; 3000]),
        ] {
            let out = sign_bytes(secret, body).expect("memory");
            assert_eq!(out.as_slice(), sign_payload(secret, body).as_bytes());
        }
    }

    #[test]
    fn verify_is_core_verify() {
        let sig = sign_payload(b"s", b"b");
        assert_eq!(verify_bytes(b"s", b"b", sig.as_bytes()), Some(true));
        assert_eq!(verify_bytes(b"s", b"b", &sig.as_bytes()[7..]), Some(true));
        assert_eq!(verify_bytes(b"s", b"c", sig.as_bytes()), Some(false));
        assert_eq!(verify_bytes(b"t", b"b", sig.as_bytes()), Some(false));
        assert_eq!(verify_bytes(b"s", b"b", b""), Some(false));
        // Not UTF-8: false, not a panic.
        assert_eq!(verify_bytes(b"s", b"b", &[0xff; 71]), Some(false));
    }
}
