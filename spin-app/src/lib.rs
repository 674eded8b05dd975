//! The two-factor-auth service as a Spin HTTP component (`wasi:http` 0.2).
//!
//! All the rules live in `tfa_core`; this crate is only the host driver that
//! lends core its I/O through Spin's APIs. For each request it does, in order:
//!
//! 1. **Read settings.** For every name in [`tfa_core::contract::config::SETTING_NAMES`]
//!    it takes the Spin variable of the lower-cased name, falling back to
//!    the upper-case process environment variable (what `spin up -e NAME=…`
//!    sets). Empty values count as unset. The variables come in one host
//!    call, `wasi:config/store.get-all` (Spin 3.x and 4.x); only if that
//!    fails are they asked one by one (`spin_sdk::variables::get`).
//! 2. **Parse them** with [`tfa_core::Config::from_settings`]. On error it answers
//!    503 `{"success":false,"error":"Service unavailable"}` and logs the
//!    reason to stderr.
//! 3. **Build a [`tfa_core::Request`]**: method, path and query, headers
//!    (except the `spin-*` headers the host adds), the body, and the peer
//!    address from the `spin-client-addr` header with its port stripped. A
//!    body longer than 65536 bytes is not read further: the component answers
//!    413 `{"success":false,"error":"Request body too large"}` itself.
//! 4. **Call `Service::handle`** with an [`tfa_core::Env`] made of the store
//!    (Spin key-value store `default`, plus `wasi:keyvalue` atomics and batch
//!    on the same store), the rng (`wasi:random`) and the clock (read once).
//! 5. **While the step is `Step::Deliver`**, perform the delivery (an SMS is
//!    sent as the exact HTTP request core built, over `wasi:http` outbound
//!    HTTP with connect and response time limits, see `outbound.rs`; an
//!    e-mail is handed to the mailer component as a
//!    `tfa_smtp::relay::RelayRequest`, `POST http://tfa-mailer.spin.internal/send`
//!    over the same outbound HTTP: Spin's local service chaining, see the
//!    `tfa-mailer` crate) and call `Service::resume` with its result.
//! 6. **Write the reply's response** and finish its body, so the client has
//!    its answer.
//! 7. **Then run the after-response effects** with `Service::complete`.
//!
//! Store failures never trap: each becomes a [`tfa_core::StoreError`], which
//! core turns into 503 `Service unavailable`.
//!
//! The Spin glue is compiled for `wasm32` only; the helpers in [`util`] are
//! target-independent so they can be unit-tested natively.

pub mod util;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod outbound;
