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
//! its [`Store`] (see [`ports`] for the exact contract, which Spin's
//! key-value API plus `wasi:keyvalue` atomics satisfy). Messages that must
//! leave the machine (SMS through Twilio, e-mail through SMTP) are described
//! as [`Delivery`] values for the host to send. Logging is returned as lines.
//!
//! # How a host drives it
//! 1. Once: parse settings with [`Config::from_map`] (on error, answer every
//!    request with [`Service::unavailable_response`] and log the reason), log
//!    [`Config::warnings`], build a [`Service`].
//! 2. Per request: read the clock once, build an [`Env`] and a [`Request`],
//!    call [`Service::handle`].
//! 3. While the step is [`Step::Deliver`]: send the delivery, then call
//!    [`Service::resume`] with the pending state and the result.
//! 4. On [`Step::Respond`]: write the response.
//! 5. After writing it: call [`Service::complete`] with the reply's effects
//!    (persists audit records, sweeps expired keys, collects due webhook
//!    deliveries and retries) and log the lines it returns; send each
//!    webhook call it returns and report each result with
//!    [`Service::webhook_result`].
//!
//! # Endpoints and the modules that own them
//! Paths are below `API_BASE_PATH` (default `/api`).
//!
//! | endpoint | module |
//! |---|---|
//! | `GET /health`, `/health/live`, `/health/ready` | [`health`] |
//! | `POST /auth/register`, `POST /auth/login`, `GET /auth/me` | [`users`] |
//! | `POST /auth/refresh`, `/auth/logout`, `/auth/revoke-sessions`; `GET /auth/sessions`, `DELETE /auth/sessions/{id}` | [`sessions`] |
//! | `POST /2fa/totp/setup`, `/2fa/totp/verify-setup` (= `/2fa/totp/verify`), `DELETE /2fa/totp` | [`totp`] |
//! | `POST /2fa/sms/setup`, `/2fa/sms/verify-setup`, `/2fa/email/setup`, `/2fa/email/verify-setup`, `/2fa/send-code`, `/2fa/resend` | [`otp`] |
//! | `POST /2fa/verify`, `/2fa/verify-backup-code` (= `/2fa/verify-backup`) | [`mfa`] |
//! | `POST /2fa/backup-codes/generate`, `GET /2fa/backup-codes/count` | [`backup`] |
//! | `GET /2fa/methods`, `DELETE /2fa/methods/{id}` | [`methods`] |
//! | `GET /2fa/devices`, `DELETE /2fa/devices`, `DELETE /2fa/devices/{id}` | [`devices`] |
//! | `POST /auth/introspect` | [`sessions`] |
//! | `GET`/`POST /api-keys`, `DELETE /api-keys/{id}`, `POST /api-keys/{id}/rotate` | [`apikeys`] |
//! | `GET /audit-log` | [`audit`] |
//! | `GET`/`POST /webhooks`, `GET /webhooks/events`, `POST /webhooks/verify-signature`, `GET`/`DELETE /webhooks/{id}`, `POST /webhooks/{id}/test`, `GET /webhooks/{id}/deliveries` | [`webhooks`] |
//!
//! `GET /openapi.json` (the OpenAPI 3.1 document of all of the above) is
//! [`openapi`].
//!
//! Cross-cutting: [`router`] (the route table, 404/405/preflight), [`web`] (envelope, body
//! parsing, headers, CORS, CSRF, cookies), [`error`] (the one error enum),
//! [`ratelimit`], [`housekeeping`], [`audit`], [`secrets`], [`records`]
//! (key layout).

#![forbid(unsafe_code)]

pub mod signature;

#[cfg(feature = "service")]
pub mod apikeys;
#[cfg(feature = "service")]
pub mod audit;
#[cfg(feature = "service")]
pub mod backup;
#[cfg(feature = "service")]
pub mod config;
#[cfg(feature = "service")]
pub mod context;
#[cfg(feature = "service")]
pub mod crypto;
#[cfg(feature = "service")]
pub mod devices;
#[cfg(feature = "service")]
pub mod error;
#[cfg(feature = "service")]
pub mod health;
#[cfg(feature = "service")]
pub mod housekeeping;
#[cfg(feature = "service")]
pub mod http;
#[cfg(feature = "service")]
mod jwt_hmac;
#[cfg(feature = "service")]
pub mod lock;
#[cfg(feature = "service")]
pub mod methods;
#[cfg(feature = "service")]
pub mod mfa;
#[cfg(feature = "service")]
pub mod openapi;
#[cfg(feature = "service")]
pub mod otp;
#[cfg(feature = "service")]
pub mod outbox;
#[cfg(feature = "service")]
pub mod ports;
#[cfg(feature = "service")]
pub mod ratelimit;
#[cfg(feature = "service")]
pub mod records;
#[cfg(feature = "service")]
pub mod router;
#[cfg(feature = "service")]
pub mod secrets;
#[cfg(feature = "service")]
mod service;
#[cfg(feature = "service")]
pub mod sessions;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "service")]
pub mod tokens;
#[cfg(feature = "service")]
pub mod totp;
#[cfg(feature = "service")]
pub mod users;
#[cfg(feature = "service")]
pub mod util;
#[cfg(feature = "service")]
pub mod web;
#[cfg(feature = "service")]
pub mod webhooks;

#[cfg(feature = "service")]
pub use config::{Config, ConfigError};
#[cfg(feature = "service")]
pub use http::{Request, Response};
#[cfg(feature = "service")]
pub use outbox::{Completion, Delivery, DeliveryError, Effect, Pending, Reply, Step};
#[cfg(feature = "service")]
pub use ports::{Env, Rng, Store, StoreError};
#[cfg(feature = "service")]
pub use service::Service;
