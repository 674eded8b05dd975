//! `tfa-core`: every rule of the two-factor authentication service, with no I/O.
//!
//! (Crate documentation is completed as the modules land.)

#![forbid(unsafe_code)]

pub mod signature;

#[cfg(feature = "service")]
pub mod audit;
#[cfg(feature = "service")]
pub mod config;
#[cfg(feature = "service")]
pub mod crypto;
#[cfg(feature = "service")]
pub mod http;
#[cfg(feature = "service")]
pub mod otp;
#[cfg(feature = "service")]
pub mod outbox;
#[cfg(feature = "service")]
pub mod ports;
#[cfg(feature = "service")]
mod service;
#[cfg(feature = "service")]
pub mod tokens;

#[cfg(feature = "service")]
pub use config::{Config, ConfigError};
#[cfg(feature = "service")]
pub use http::{Request, Response};
#[cfg(feature = "service")]
pub use outbox::{Delivery, DeliveryError, Effect, Pending, Reply, Step};
#[cfg(feature = "service")]
pub use ports::{Env, Rng, Store, StoreError};
#[cfg(feature = "service")]
pub use service::Service;
