//! Request plumbing shared by every endpoint: the per-request context
//! ([`context`]), the envelope, body parsing, headers, CORS and CSRF
//! ([`web`]), the store's key layout and record updates ([`records`],
//! [`lock`]), rate limits ([`ratelimit`]), expiry sweeps and time-bucketed
//! queues ([`housekeeping`]), signing keys ([`secrets`]) and small helpers
//! ([`util`]).
//!
//! # What this folder may import
//! [`crate::contract`], [`crate::crypto`] and itself; never [`crate::api`]
//! (an endpoint that needs to continue after a delivery implements
//! [`context::Resume`] instead of being named here). `scripts/check-layers.py`
//! checks it.

pub mod context;
pub mod housekeeping;
pub mod lock;
pub mod ratelimit;
pub mod records;
pub mod secrets;
pub mod util;
pub mod web;
