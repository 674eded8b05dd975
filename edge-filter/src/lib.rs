//! `edge-filter`: an Envoy HTTP filter (proxy-wasm ABI 0.2.1, built for
//! `wasm32-wasip1`) that checks the service's access tokens in front of
//! upstream apps that cannot be changed.
//!
//! # What it does
//! - Finds the token in `Authorization: Bearer …` or, failing that, in a
//!   configured cookie, and verifies it with [`tfa_core::tokens::Verifier`]
//!   (the very code the API uses): HS256 under any of several secrets
//!   (rotation), `typ` = `access`, exact `iss` and `aud`, `exp`/`nbf` with a
//!   configured clock skew, against the host's clock.
//! - Applies ordered rules (exact path or prefix, optional methods), each
//!   requiring `none`, `auth` or `mfa`, with a default rule. CORS preflights
//!   pass untouched.
//! - Removes client-sent copies of the headers it forwards (and of any
//!   other configured header) from every request, then, when a request
//!   passes with a token, sets them from the token's claims: the upstream
//!   can trust `x-user-id`, `x-user-mfa`, …
//! - Refuses browsers (`Accept: text/html`) with a 302 to the login page
//!   carrying the original URL, and API clients with the service's envelope
//!   (401 `Invalid or expired token`, 403 `Two-factor authentication
//!   required`, 503 when it cannot decide).
//! - Optionally asks the API (`POST /auth/introspect`, API key header)
//!   whether the token's session is still alive, caching answers in the
//!   host's shared data (positive and negative TTLs, written with CAS), with
//!   a timeout and a fail-open or fail-closed policy.
//! - Counts what it does in host metrics (`tfa_edge.*`).
//!
//! # What it does not do
//! It issues, refreshes and revokes nothing; it never reads the body; it
//! keeps no state besides the shared-data cache; it does not normalise
//! paths (let Envoy do that: `normalize_path`, `merge_slashes`); it trusts
//! only HS256 access tokens; it does not answer CORS preflights itself (the
//! upstream or Envoy's CORS filter does). Per-route switching off is
//! Envoy's business (`typed_per_filter_config` with
//! `envoy.config.route.v3.FilterConfig { disabled: true }`).
//!
//! # How Envoy drives it
//! 1. Envoy loads the module and calls `_initialize`, then
//!    `proxy_on_context_create` for the root context and `proxy_on_vm_start`.
//! 2. `proxy_on_configure`: the root context reads the plugin configuration
//!    (JSON), validates it ([`config::Config::parse`]) and builds the
//!    verifier and the metrics; a bad configuration returns `false` (Envoy
//!    refuses it) after an error log line naming the field.
//! 3. Per request, `proxy_on_context_create` makes an HTTP context and
//!    `proxy_on_request_headers` runs the whole decision: strip protected
//!    headers; preflight or `none` → continue; otherwise verify the token
//!    ([`policy::check_token`]; a token this configuration accepted before
//!    is answered from the worker's memo, `exp`/`nbf` checked again) at the
//!    host's time; on failure send the local
//!    response and stop; on success without introspection set the claim
//!    headers and continue.
//! 4. With introspection: a fresh cached answer decides at once; otherwise
//!    the filter dispatches `POST /auth/introspect` to the configured cluster
//!    and pauses the request.
//! 5. `proxy_on_http_call_response`: the answer is read
//!    ([`introspect::parse_response`]), cached, and the request is resumed
//!    with the claim headers or answered with the denial; no usable answer
//!    follows the fail-open / fail-closed policy.
//! 6. `proxy_on_done` / `proxy_on_delete` end the HTTP context; nothing is
//!    kept per request.
//!
//! The decision logic ([`config`], [`policy`], [`introspect`], [`headers`]) is plain Rust
//! with native unit tests; only the `filter` module (wasm32 only) talks to
//! the host, through `proxy_wasm::hostcalls`, and never traps on a host call
//! that the ABI allows to fail.

#![cfg_attr(not(target_arch = "wasm32"), forbid(unsafe_code))]

pub mod config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod headers;
pub mod introspect;
pub mod policy;

#[cfg(target_arch = "wasm32")]
mod filter;
