//! The raw ABI the JS glue calls: pointers and lengths into linear memory.
//!
//! This is the only module with `unsafe`: turning a pointer and a length
//! that JS hands over into a slice, and the allocator calls behind them.
//! Every function is exported under its plain name on `wasm32` (`alloc`,
//! `dealloc`, `verify`, `sign`); natively they keep mangled names and are
//! called by the unit tests below.
//!
//! On `wasm32` a `usize` and a pointer are an `i32` in the signature: JS must
//! read returned pointers as unsigned (`ptr >>> 0`).

use std::alloc::Layout;

use crate::{sign_bytes, verify_bytes, OUT_OF_MEMORY, SIGNATURE_LEN};

/// The layout of a block of `len` bytes as [`alloc`] makes it: at least one
/// byte (a zero-sized layout may not be passed to the allocator), align 1.
fn layout(len: usize) -> Option<Layout> {
    Layout::from_size_align(len.max(1), 1).ok()
}

/// Reserves `len` bytes and returns their address, or null (0) if the
/// memory cannot grow that far. Never traps.
#[cfg_attr(target_arch = "wasm32", export_name = "alloc")]
pub extern "C" fn alloc(len: usize) -> *mut u8 {
    let Some(layout) = layout(len) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `layout` has a non-zero size (see `layout`), as
    // `std::alloc::alloc` requires. A null result is passed on, not used.
    unsafe { std::alloc::alloc(layout) }
}

/// Gives back a block from [`alloc`]. Null is ignored.
///
/// # Safety
///
/// `ptr` is null or was returned by [`alloc`] called with this same `len`,
/// and has not been given back yet.
#[cfg_attr(target_arch = "wasm32", export_name = "dealloc")]
pub unsafe extern "C" fn dealloc(ptr: *mut u8, len: usize) {
    if ptr.is_null() {
        return;
    }
    let Some(layout) = layout(len) else {
        return;
    };
    // SAFETY: the caller promises `ptr` came from `alloc(len)`, which used
    // exactly this layout, and that it is still live.
    unsafe { std::alloc::dealloc(ptr, layout) }
}

/// The `len` bytes at `ptr` as a slice; empty whatever `ptr` is when
/// `len` is 0.
///
/// # Safety
///
/// If `len > 0`, `ptr .. ptr + len` lies within one live block from
/// [`alloc`], is initialised, and is not written while the slice lives.
unsafe fn input<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: non-null, and the caller promises the range is one live,
    // initialised allocation that nothing mutates meanwhile; `u8` has
    // alignment 1, and a block from `alloc` is at most `isize::MAX` long.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// 1 if the header at `sig_ptr` is the signature of the body under the
/// secret (as [`tfa_core::signature::verify_signature`] decides), 0 if not,
/// -1 if memory ran out.
///
/// # Safety
///
/// Each `(ptr, len)` pair satisfies the contract of `input`: it lies in a
/// live block from [`alloc`] (or `len` is 0).
#[cfg_attr(target_arch = "wasm32", export_name = "verify")]
pub unsafe extern "C" fn verify(
    secret_ptr: *const u8,
    secret_len: usize,
    body_ptr: *const u8,
    body_len: usize,
    sig_ptr: *const u8,
    sig_len: usize,
) -> i32 {
    // SAFETY: forwarded from this function's own contract.
    let (secret, body, sig) = unsafe {
        (
            input(secret_ptr, secret_len),
            input(body_ptr, body_len),
            input(sig_ptr, sig_len),
        )
    };
    match verify_bytes(secret, body, sig) {
        Some(true) => 1,
        Some(false) => 0,
        None => OUT_OF_MEMORY,
    }
}

/// Writes the 71 bytes `sha256=<64 lower-case hex>` of
/// [`tfa_core::signature::sign_payload`] at `out_ptr` and returns 71, or
/// returns -1 (writing nothing) if memory ran out.
///
/// # Safety
///
/// The secret and body pairs satisfy the contract of `input`; `out_ptr`
/// points to 71 writable bytes of a live block from [`alloc`] that do not
/// overlap the inputs.
#[cfg_attr(target_arch = "wasm32", export_name = "sign")]
pub unsafe extern "C" fn sign(
    secret_ptr: *const u8,
    secret_len: usize,
    body_ptr: *const u8,
    body_len: usize,
    out_ptr: *mut u8,
) -> i32 {
    // SAFETY: forwarded from this function's own contract.
    let (secret, body) = unsafe { (input(secret_ptr, secret_len), input(body_ptr, body_len)) };
    let Some(sig) = sign_bytes(secret, body) else {
        return OUT_OF_MEMORY;
    };
    // SAFETY: the caller promises 71 writable bytes at `out_ptr`, apart
    // from the inputs (which are no longer read); `sig` is a local array.
    unsafe { std::ptr::copy_nonoverlapping(sig.as_ptr(), out_ptr, SIGNATURE_LEN) };
    SIGNATURE_LEN as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfa_core::signature::sign_payload;

    /// Copies `parts` into one block from `alloc`, as the JS glue does, and
    /// returns the block and the address of each part.
    fn stage(parts: &[&[u8]], extra: usize) -> (*mut u8, usize, Vec<*mut u8>) {
        let total = parts.iter().map(|p| p.len()).sum::<usize>() + extra;
        let base = alloc(total);
        assert!(!base.is_null());
        let mut at = 0;
        let mut ptrs = Vec::new();
        for p in parts {
            // SAFETY: `base .. base + total` is a fresh block and
            // `at + p.len() <= total`.
            let dst = unsafe { base.add(at) };
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len()) };
            ptrs.push(dst);
            at += p.len();
        }
        // SAFETY: `at <= total`.
        ptrs.push(unsafe { base.add(at) });
        (base, total, ptrs)
    }

    #[test]
    fn abi_round_trip() {
        let secret = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let body = br#"{"id":"e1","event":"webhook.test"}"#;
        let (base, total, p) = stage(&[secret, body], SIGNATURE_LEN);
        // SAFETY: all pointers lie in the staged block; 71 bytes at p[2].
        let n = unsafe { sign(p[0], secret.len(), p[1], body.len(), p[2]) };
        assert_eq!(n, 71);
        // SAFETY: `sign` wrote 71 bytes at p[2].
        let out = unsafe { std::slice::from_raw_parts(p[2], 71) }.to_vec();
        assert_eq!(out, sign_payload(secret, body).as_bytes());
        // SAFETY: as above; the header is the 71 bytes just written.
        let ok = unsafe { verify(p[0], secret.len(), p[1], body.len(), p[2], 71) };
        assert_eq!(ok, 1);
        // SAFETY: as above, with a shorter body.
        let bad = unsafe { verify(p[0], secret.len(), p[1], body.len() - 1, p[2], 71) };
        assert_eq!(bad, 0);
        // SAFETY: `base` came from `alloc(total)`.
        unsafe { dealloc(base, total) };
    }

    #[test]
    fn empty_inputs_and_null_pointers() {
        // SAFETY: every length is 0, so no pointer is read; the output is a
        // local 71-byte array.
        let mut out = [0u8; 71];
        let n = unsafe { sign(std::ptr::null(), 0, std::ptr::null(), 0, out.as_mut_ptr()) };
        assert_eq!(n, 71);
        assert_eq!(&out[..], sign_payload(b"", b"").as_bytes());
        // SAFETY: lengths 0 except the header, which is the local array.
        let ok = unsafe { verify(std::ptr::null(), 0, std::ptr::null(), 0, out.as_ptr(), 71) };
        assert_eq!(ok, 1);
        // SAFETY: all lengths 0.
        let empty = unsafe {
            verify(
                std::ptr::null(),
                0,
                std::ptr::null(),
                0,
                std::ptr::null(),
                0,
            )
        };
        assert_eq!(empty, 0);
    }

    #[test]
    fn alloc_edges() {
        let p = alloc(0);
        assert!(!p.is_null());
        // SAFETY: from `alloc(0)`.
        unsafe { dealloc(p, 0) };
        // More than any address space holds: null, not a panic.
        assert!(alloc(usize::MAX).is_null());
        // SAFETY: null is ignored.
        unsafe { dealloc(std::ptr::null_mut(), 5) };
    }
}
