//! Primitives, each pinned by standard vectors or known answers.

pub mod codes;
pub mod password;
pub mod qr;
pub mod totp;
