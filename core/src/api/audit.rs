//! Audit records: built during a request, persisted after the response.
//!
//! Records are kept per user as `audit:{uid}:{n}` with `n` from the atomic
//! counter `auditn:{uid}`, so the newest are found without listing keys.
//! Events with no known user (a login for an unknown name) go under the user
//! id `-`. A record never carries a secret, a code or a token: handlers put
//! only ids, method names and reasons in `details`.

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::contract::ports::Env;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::util::{self, Decimal};
use crate::plumbing::web;

/// Every action name the service records.
pub const ACTIONS: &[&str] = &[
    "register",
    "login_success",
    "login_failed",
    "logout",
    "token_refreshed",
    "sessions_revoked",
    "2fa_setup_started",
    "2fa_enabled",
    "2fa_disabled",
    "2fa_verified",
    "2fa_failed",
    "code_sent",
    "backup_code_used",
    "backup_codes_regenerated",
    "trusted_device_added",
    "trusted_device_removed",
    "api_key_created",
    "api_key_revoked",
    "webhook_created",
    "webhook_deleted",
    "rate_limited",
    "webauthn_registered",
    "webauthn_removed",
    "webauthn_counter_regression",
];

pub use crate::contract::outbox::AuditRecord;

/// The sequence counter of `owner`'s audit records, `auditn:{owner}`.
fn count_key(owner: &str) -> String {
    util::key(&["auditn:", owner])
}

/// The key of `owner`'s audit record number `n`, `audit:{owner}:{n}`.
fn record_key(owner: &str, n: Decimal) -> String {
    util::key(&["audit:", owner, ":", n.as_str()])
}

/// Writes `record` to the store.
pub fn persist(env: &mut Env, record: &AuditRecord) -> Result<(), ApiError> {
    let owner = record.user_id.as_deref().unwrap_or("-");
    let n = env.store.increment(&count_key(owner), 1)?;
    crate::plumbing::records::save(env.store, &record_key(owner, Decimal::of_signed(n)), record)
}

/// Default and largest page of `GET /audit-log`.
pub const PAGE_DEFAULT: u64 = 50;
/// Largest page.
pub const PAGE_MAX: u64 = 100;

/// Query parameter `name`, which may be given at most once: with two values
/// (`?limit=5&limit=abc`) which one counts would depend on the parser, as
/// with duplicate keys in a body, so the request is refused.
fn single_query(ctx: &Ctx, name: &str) -> Result<Option<String>, ApiError> {
    let mut values = ctx.req.query_all(name);
    if values.len() > 1 {
        return Err(ApiError::validation(format!("{name} must be given once")));
    }
    Ok(values.pop())
}

/// `GET /audit-log?limit=&cursor=`: the caller's records, newest first.
/// `nextCursor` is an opaque string to pass back as `cursor`, or null at the
/// end.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("audit:read"))?;
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let limit = match single_query(ctx, "limit")? {
        None => PAGE_DEFAULT,
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("limit must be a whole number from 1 to 100"))?,
    };
    let newest = ctx
        .env
        .store
        .increment(&count_key(&auth.user.id), 0)?
        .max(0) as u64;
    let start = match single_query(ctx, "cursor")? {
        None => newest,
        Some(c) => c
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= newest)
            .ok_or_else(|| ApiError::validation("cursor is not valid"))?,
    };
    let end = start.saturating_sub(limit);
    let keys: Vec<String> = (end + 1..=start)
        .rev()
        .map(|n| record_key(&auth.user.id, Decimal::of(n)))
        .collect();
    let events: Vec<serde_json::Value> =
        crate::plumbing::records::load_each::<AuditRecord>(ctx.env.store, &keys)?
            .into_iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "action": r.action,
                    "success": r.success,
                    "ipAddress": r.ip_address,
                    "userAgent": r.user_agent,
                    "details": r.details,
                    "createdAt": r.created_at,
                })
            })
            .collect();
    let next = (end > 0).then(|| end.to_string());
    Ok(Outcome::Done(web::ok(
        200,
        serde_json::json!({ "events": events, "nextCursor": next }),
    )))
}
