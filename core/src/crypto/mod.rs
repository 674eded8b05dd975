//! Primitives with no 2FA rule in them, each pinned by standard vectors or
//! known answers: webhook signatures ([`signature`], the only module built
//! without the `service` feature, for the browser package), JWTs
//! ([`tokens`], on the HMAC-only provider of `jwt_hmac`), one-time codes and
//! key derivation ([`codes`], [`totp`]), passwords ([`password`]), QR
//! codes ([`qr`]) and WebAuthn verification ([`webauthn`], on the COSE keys
//! of [`cose`]; feature `webauthn`).
//!
//! # What this folder may import
//! Itself and [`crate::contract::ports`] (the `Rng` that code generation
//! takes); nothing of [`crate::plumbing`] or [`crate::api`].
//! `scripts/check-layers.py` checks it.

pub mod signature;

#[cfg(feature = "service")]
pub mod codes;
#[cfg(feature = "webauthn")]
pub mod cose;
#[cfg(feature = "service")]
mod jwt_hmac;
#[cfg(feature = "service")]
pub mod password;
#[cfg(feature = "service")]
pub mod qr;
#[cfg(feature = "service")]
pub mod token_memo;
#[cfg(feature = "service")]
pub mod tokens;
#[cfg(feature = "service")]
pub mod totp;
#[cfg(feature = "webauthn")]
pub mod webauthn;
