//! Health: `GET /health` (not wrapped in the envelope), `/health/live` and
//! `/health/ready`. The probe reads one key of the store; with one store
//! configured, `database` and `redis` report the same store.

use serde_json::json;

use crate::contract::error::ApiError;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::util::iso8601;
use crate::plumbing::web;

/// Version reported by `/health`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn probe(ctx: &mut Ctx) -> bool {
    ctx.env.store.get("health:probe").is_ok()
}

/// `GET /health`.
pub fn health(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.skip_maintenance();
    let up = probe(ctx);
    let state = if up { "up" } else { "down" };
    let body = json!({
        "status": if up { "healthy" } else { "unhealthy" },
        "checks": { "database": state, "redis": state },
        "timestamp": iso8601(ctx.now_ms()),
        "version": VERSION,
    });
    Ok(Outcome::Done(web::json_response(
        if up { 200 } else { 503 },
        &body,
    )))
}

/// `GET /health/live`: the process answers.
pub fn live(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    Ok(Outcome::Done(web::json_response(
        200,
        &json!({ "status": "alive", "timestamp": iso8601(ctx.now_ms()) }),
    )))
}

/// `GET /health/ready`: the store answers.
pub fn ready(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.skip_maintenance();
    let up = probe(ctx);
    Ok(Outcome::Done(web::json_response(
        if up { 200 } else { 503 },
        &json!({ "status": if up { "ready" } else { "unavailable" }, "timestamp": iso8601(ctx.now_ms()) }),
    )))
}
