//! `tfa-core`: every rule of the two-factor authentication service, with no
//! I/O.
//!
//! # What it does
//! It serves the whole HTTP API of the service as a pure function of a
//! request, the current time, random bytes and a key-value store: users and
//! passwords (Argon2id), sessions and JWTs, TOTP, SMS and e-mail codes,
//! backup codes, trusted devices, rate limits, the envelope and every error
//! case, security headers, CORS and CSRF. It also holds the primitives the
//! other front-ends share: token verification for the Envoy filter
//! ([`tokens::Verifier`]) and webhook signatures for the browser package
//! ([`signature`], the only module built without the `service` feature).
//!
//! # What it does not do
//! No clock, no randomness source, no network, no files, no threads: time is
//! the `now_ms` of an [`Env`], random bytes come from its [`Rng`], storage is
//! its [`Store`] (see [`contract::ports`] for the exact contract, which Spin's
//! key-value API plus `wasi:keyvalue` atomics satisfy). Messages that must
//! leave the machine (SMS through Twilio, e-mail through SMTP) are described
//! as [`Delivery`] values for the host to send. Logging is returned as lines.
//!
//! # How a host drives it
//! 1. Once: parse settings with [`Config::from_settings`] (or
//!    [`Config::from_map`]; on error, answer every
//!    request with [`Service::unavailable_response`] and log the reason), log
//!    [`Config::warnings`], build a [`Service`].
//! 2. Per request: read the clock once, build an [`Env`] and a [`Request`],
//!    call [`Service::handle`].
//! 3. While the step is [`Step::Deliver`]: send the delivery, then call
//!    [`Service::resume`] with the pending state and the result.
//! 4. On [`Step::Respond`]: write the response.
//! 5. After writing it: call [`Service::complete`] with the reply's effects
//!    (files the expiries of what it created, persists audit records,
//!    sweeps expired keys, collects due webhook
//!    deliveries and retries) and log the lines it returns; send each
//!    webhook call it returns and report each result with
//!    [`Service::webhook_result`].
//!
//! # Endpoints and the modules that own them
//! Paths are below `API_BASE_PATH` (default `/api`).
//!
//! | endpoint | module |
//! |---|---|
//! | `GET /health`, `/health/live`, `/health/ready` | [`api::health`] |
//! | `POST /auth/register`, `POST /auth/login`, `GET /auth/me` | [`api::users`] |
//! | `POST /auth/refresh`, `/auth/logout`, `/auth/revoke-sessions`; `GET /auth/sessions`, `DELETE /auth/sessions/{id}` | [`api::sessions`] |
//! | `POST /2fa/totp/setup`, `/2fa/totp/verify-setup` (= `/2fa/totp/verify`), `DELETE /2fa/totp` | [`api::totp`] |
//! | `POST /2fa/sms/setup`, `/2fa/sms/verify-setup`, `/2fa/email/setup`, `/2fa/email/verify-setup`, `/2fa/send-code`, `/2fa/resend` | [`api::otp`] |
//! | `POST /2fa/verify`, `/2fa/verify-backup-code` (= `/2fa/verify-backup`) | [`api::mfa`] |
//! | `POST /2fa/backup-codes/generate`, `GET /2fa/backup-codes/count` | [`api::backup`] |
//! | `POST /2fa/webauthn/register/options`, `/2fa/webauthn/register/verify`; `GET /2fa/webauthn/credentials`, `PATCH`/`DELETE /2fa/webauthn/credentials/{id}`; `POST /2fa/webauthn/options`, `/2fa/verify-webauthn`; `POST /auth/passkey/options`, `/auth/passkey/verify` | [`api::webauthn`] |
//! | `GET /2fa/methods`, `DELETE /2fa/methods/{id}` | [`api::methods`] |
//! | `GET /2fa/devices`, `DELETE /2fa/devices`, `DELETE /2fa/devices/{id}` | [`api::devices`] |
//! | `POST /auth/introspect` | [`api::sessions`] |
//! | `GET`/`POST /api-keys`, `DELETE /api-keys/{id}`, `POST /api-keys/{id}/rotate` | [`api::apikeys`] |
//! | `GET /audit-log` | [`api::audit`] |
//! | `GET`/`POST /webhooks`, `GET /webhooks/events`, `POST /webhooks/verify-signature`, `GET`/`DELETE /webhooks/{id}`, `POST /webhooks/{id}/test`, `GET /webhooks/{id}/deliveries` | [`api::webhooks`] |
//!
//! `GET /openapi.json` (the OpenAPI 3.1 document of all of the above) is
//! [`api::openapi`].
//!
//! # Layers (folders)
//! - [`service`](Service) — the driver above everything: [`Service`] and
//!   the [`Step`] it returns; it enters the endpoints only through
//!   [`api`]'s door.
//! - [`api`] — the endpoints above (one module per resource) and the route
//!   table ([`api::router`]: 404/405/preflight).
//! - [`plumbing`] — what every endpoint shares: [`plumbing::context`],
//!   [`plumbing::web`] (envelope, body parsing, headers, CORS, CSRF,
//!   cookies), [`plumbing::records`] (key layout), [`plumbing::lock`],
//!   [`plumbing::ratelimit`], [`plumbing::housekeeping`],
//!   [`plumbing::secrets`], [`plumbing::util`]. Never imports [`api`].
//! - [`contract`] — the types hosts exchange with core:
//!   [`contract::config`], [`contract::http`], [`contract::ports`],
//!   [`contract::outbox`], [`contract::error`] (the one error enum).
//!   Imports only [`crypto`].
//! - [`crypto`] — primitives without a 2FA rule: [`signature`], [`tokens`],
//!   [`crypto::codes`], [`crypto::totp`], [`crypto::password`],
//!   [`crypto::qr`], and (feature `webauthn`, on by default, off in the
//!   edge filter) `crypto::webauthn` with `crypto::cose`.
//!
//! `scripts/check-layers.py` (in `scripts/test.sh`) keeps imports running
//! one way; `docs/architecture.md` has the same table.

#![forbid(unsafe_code)]

pub mod crypto;

#[cfg(feature = "service")]
pub mod api;
#[cfg(feature = "service")]
pub mod contract;
#[cfg(feature = "service")]
pub mod plumbing;
#[cfg(feature = "service")]
mod service;
#[cfg(feature = "testing")]
pub mod testing;

/// The primitives other front-ends share, at the paths they have always
/// used: webhook signatures (browser package) and token verification (edge
/// filter).
pub use crypto::signature;
#[cfg(feature = "service")]
pub use crypto::tokens;

#[cfg(feature = "service")]
pub use contract::config::{Config, ConfigError};
#[cfg(feature = "service")]
pub use contract::http::{Request, Response};
#[cfg(feature = "service")]
pub use contract::outbox::{Completion, Delivery, DeliveryError, Effect, Reply};
#[cfg(feature = "service")]
pub use contract::ports::{Env, Rng, Store, StoreError};
#[cfg(feature = "service")]
pub use service::{Pending, Service, Step};
