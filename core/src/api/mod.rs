//! The endpoints: one module per resource, each owning the rules of its
//! routes, and [`router`], the table that says which handler serves which
//! path and method.
//!
//! # What this folder may import
//! Everything below it: [`crate::plumbing`] (request context, envelope,
//! records, rate limits), [`crate::contract`] (the types hosts exchange)
//! and [`crate::crypto`]. Endpoint modules may use each other. Nothing
//! outside this folder names an endpoint module: the driver
//! ([`crate::Service`]) comes in through the three functions of this file,
//! and `scripts/check-layers.py` (run by `scripts/test.sh`) fails if any
//! file outside `api/` reaches past them.

pub mod apikeys;
pub mod audit;
pub mod backup;
pub mod devices;
pub mod health;
pub mod methods;
pub mod mfa;
pub mod openapi;
pub mod otp;
pub mod router;
pub mod sessions;
pub mod totp;
pub mod users;
#[cfg(feature = "webauthn")]
pub mod webauthn;
/// Without the `webauthn` feature the passkey routes answer 404.
#[cfg(not(feature = "webauthn"))]
#[path = "webauthn_off.rs"]
pub mod webauthn;
pub mod webhooks;

use crate::contract::error::ApiError;
use crate::contract::outbox::{Completion, Effect};
use crate::contract::ports::Env;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping;

/// Serves the request in `ctx`: finds its route and runs the handler.
pub(crate) fn dispatch(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    router::dispatch(ctx)
}

/// What follows a response: files the expiries of what the request created,
/// persists audit records, derives webhook events
/// from them and fans them out, and, when the request asked for
/// maintenance, picks up retries that came due and sweeps expired records.
pub(crate) fn after_response(env: &mut Env, effects: Vec<Effect>) -> Completion {
    let mut out = Completion::default();
    let mut maintenance = false;
    for effect in effects {
        match effect {
            Effect::Audit(record, hooks) => {
                if let Some((user_id, event, data)) = webhooks::event_of(&record) {
                    match webhooks::fan_out(env, &user_id, hooks, event, data) {
                        Ok(calls) => out.webhooks.extend(calls),
                        Err(_) => out
                            .log
                            .push(format!("webhooks: event {event} could not be queued")),
                    }
                }
                if audit::persist(env, &record).is_err() {
                    out.log.push(format!(
                        "audit record {} ({}) could not be stored",
                        record.id, record.action
                    ));
                }
            }
            Effect::Log(line) => out.log.push(line),
            Effect::Webhook(call) => out.webhooks.push(call),
            Effect::Expire(expiry) => {
                if housekeeping::schedule(env, &expiry).is_err() {
                    out.log.push(format!(
                        "housekeeping: {} not filed for removal (store unavailable)",
                        expiry.key()
                    ));
                }
            }
            Effect::Maintenance => maintenance = true,
        }
    }
    // One read (`sched:next`) tells whether either queue has a bucket
    // due; only then are their pointers read and their buckets done.
    if maintenance && housekeeping::anything_due(env) {
        let (retries, result) = webhooks::due(env);
        out.webhooks.extend(retries);
        let retried = result.is_ok();
        if !retried {
            out.log
                .push("webhooks: retry queue unavailable".to_string());
        }
        let swept = housekeeping::tick(env).is_ok();
        if !swept {
            out.log.push("housekeeping: store unavailable".to_string());
        }
        if retried && swept {
            housekeeping::note_next_due(env, &[&webhooks::RETRY_QUEUE]);
        }
    }
    out
}

/// Records the outcome of a webhook call (see [`crate::Service::webhook_result`]).
pub(crate) fn webhook_result(
    env: &mut Env,
    delivery_id: &str,
    result: Result<u16, String>,
) -> Vec<String> {
    webhooks::record_result(env, delivery_id, result).unwrap_or_else(|_| {
        vec![format!(
            "webhook delivery {delivery_id}: result not recorded (store unavailable)"
        )]
    })
}
