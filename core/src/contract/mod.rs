//! The host contract: the types a host and core exchange. Settings
//! ([`config`]), the request and response ([`http`]), the ports a host
//! provides ([`ports`]: clock, randomness, key-value store), what core asks
//! the host to do ([`outbox`]: deliveries, effects, webhook calls), and the
//! one error enum of the API ([`error`]). The driver that uses them is
//! [`crate::Service`].
//!
//! # What this folder may import
//! Only [`crate::crypto`] (for parameter types) and itself: never
//! [`crate::plumbing`] or [`crate::api`]. `scripts/check-layers.py` checks it.

pub mod config;
pub mod error;
pub mod http;
pub mod outbox;
pub mod ports;
