//! Webhooks: registration, event fan-out, signed deliveries with persisted
//! retries, the delivery log, and signature verification.
//!
//! Handlers never deliver anything. An audit-worthy action becomes an
//! [`Effect::Audit`] record; after the response, [`crate::Service::complete`] turns
//! it into one delivery record per subscribed hook (`whd:{id}`) and hands the
//! host one signed [`WebhookCall`] each. The host reports each outcome to
//! [`crate::Service::webhook_result`], which records the attempt and, on
//! failure, queues a retry on the back-off schedule (30 s, 2 min, 10 min,
//! 1 h, 6 h; then the delivery is given up). Retries wait in a time-bucketed
//! queue (`wq:…`, claimed with `increment` like housekeeping) that every later
//! `complete` drains as it comes due (except after `GET /health` and
//! `/health/ready`), so they survive restarts and are
//! processed after later requests. With no traffic, nothing is retried until a
//! request arrives: a scheduler calling `GET {base}/health/live` every 30 s
//! drives them. A hook is disabled after 20 consecutive failed attempts.
//!
//! Payload `{ id, event, timestamp, data }`; headers `X-Webhook-Id`,
//! `X-Webhook-Event`, `X-Webhook-Timestamp` and `X-Webhook-Signature:
//! sha256=<hex>` = HMAC-SHA-256 keyed with the secret string as returned
//! (its 64 hex characters as bytes) over the raw body.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::contract::outbox::{AuditRecord, Effect, HttpCall};
use crate::contract::ports::Env;
use crate::crypto::signature;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, UserRecord};
use crate::plumbing::util::{self, iso8601, Decimal};
use crate::plumbing::web;

/// Every event name.
pub const EVENTS: &[&str] = &[
    "user.registered",
    "user.login",
    "user.logout",
    "2fa.enabled",
    "2fa.disabled",
    "2fa.verified",
    "2fa.failed",
    "backup_code.used",
    "device.trusted",
    "device.removed",
    "session.revoked",
    "webhook.test",
    "passkey.registered",
    "passkey.removed",
    "passkey.counter_regression",
];
/// Delays before the retries, in seconds.
pub const BACKOFF_SECS: [u64; 5] = [30, 120, 600, 3600, 21_600];
/// Consecutive failed attempts that disable a hook.
pub const DISABLE_AFTER: u32 = 20;
/// Hooks per user.
pub const MAX_HOOKS_PER_USER: usize = 10;
/// Deliveries kept per hook (older ones are deleted).
pub const KEEP_DELIVERIES: usize = 50;
/// Counts every delivery created (read with `increment(key, 0)`). With
/// [`DELIVERIES_SETTLED`] it gives the deliveries still pending
/// ([`pending_deliveries`]); hosts read both for their metrics.
pub const DELIVERIES_CREATED: &str = "whn:created";
/// Counts every delivery that left `pending`: succeeded, given up, or
/// removed while pending (the retention limit, its hook deleted). Each
/// leaves `pending` in one locked record update, so each is counted once.
pub const DELIVERIES_SETTLED: &str = "whn:settled";
const QUEUE_BUCKET_MS: u64 = 30_000;
const QUEUE_BUCKETS_PER_TICK: u64 = 20;

/// A registered hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRecord {
    pub id: String,
    pub user_id: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
    pub active: bool,
    pub created_ms: u64,
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Newest last.
    #[serde(default)]
    pub deliveries: Vec<String>,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub at_ms: u64,
    pub status_code: Option<u16>,
    pub error: Option<String>,
}

/// One event sent to one hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRecord {
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub event: String,
    pub timestamp: String,
    /// The exact body sent (and signed).
    pub payload: String,
    pub attempts: Vec<Attempt>,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    pub next_attempt_ms: Option<u64>,
    pub created_ms: u64,
}

pub use crate::contract::outbox::WebhookCall;

fn hook_key(id: &str) -> String {
    util::key(&["wh:", id])
}
fn delivery_key(id: &str) -> String {
    util::key(&["whd:", id])
}

/// The webhook event an audit record announces, if any: (user, event, the
/// payload's `data`: the record's details plus `userId` and `ipAddress`).
/// Successful actions announce theirs ([`event_for`]); a failed second
/// factor announces `2fa.failed`.
pub fn event_of(record: &AuditRecord) -> Option<(String, &'static str, Value)> {
    let user_id = record.user_id.as_deref()?;
    let event = match (record.success, record.action.as_str()) {
        (true, action) => event_for(action, &record.details)?,
        (false, "2fa_failed") => "2fa.failed",
        (false, "webauthn_counter_regression") => "passkey.counter_regression",
        (false, _) => return None,
    };
    let mut data = record.details.clone();
    if let Some(obj) = data.as_object_mut() {
        obj.insert("userId".into(), Value::String(user_id.to_string()));
        obj.insert("ipAddress".into(), Value::String(record.ip_address.clone()));
    }
    Some((user_id.to_string(), event, data))
}

/// The event a successful audit action announces, if any.
pub fn event_for(action: &str, details: &Value) -> Option<&'static str> {
    Some(match action {
        "register" => "user.registered",
        "login_success" if details.get("stage").is_none() => "user.login",
        "logout" => "user.logout",
        "2fa_enabled" => "2fa.enabled",
        "2fa_disabled" => "2fa.disabled",
        "2fa_verified" => "2fa.verified",
        "2fa_failed" => "2fa.failed",
        "backup_code_used" => "backup_code.used",
        "trusted_device_added" => "device.trusted",
        "trusted_device_removed" => "device.removed",
        "sessions_revoked" => "session.revoked",
        "webauthn_registered" => "passkey.registered",
        "webauthn_removed" => "passkey.removed",
        _ => return None,
    })
}

/// Checks a webhook URL: `https` (or `http` outside production), no user
/// info, and no loopback, private, link-local, metadata or other internal
/// target unless `allow_private`.
pub fn check_url(url: &str, production: bool, allow_private: bool) -> Result<(), ApiError> {
    let bad = |why: &str| ApiError::validation(format!("url {why}"));
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c == ' ') {
        return Err(bad("must be a valid URL"));
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("must be a valid URL"))?;
    match scheme {
        "https" => {}
        "http" if !production => {}
        _ => return Err(bad("must use https")),
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(bad("must not contain credentials"));
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("must be a valid URL"))?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return Err(bad("must be a valid URL"));
        }
        let ip: core::net::Ipv6Addr = h.parse().map_err(|_| bad("must be a valid URL"))?;
        if !allow_private && internal_v6(&ip) {
            return Err(bad("must not point at a private or internal address"));
        }
        return Ok(());
    } else {
        let (h, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if port.is_some_and(|p| !valid_port(p)) {
            return Err(bad("must be a valid URL"));
        }
        h.to_ascii_lowercase()
    };
    let labels: Vec<&str> = host.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if host.is_empty() || host.len() > 253 || !labels.iter().all(label_ok) {
        return Err(bad("must be a valid URL"));
    }
    let numeric = labels
        .last()
        .is_some_and(|l| l.chars().all(|c| c.is_ascii_digit()) || l.starts_with("0x"));
    if numeric {
        // Only plain dotted-quad IPv4 literals; other numeric forms are refused.
        let ip: core::net::Ipv4Addr = host.parse().map_err(|_| bad("must be a valid URL"))?;
        if !allow_private && internal_v4(&ip) {
            return Err(bad("must not point at a private or internal address"));
        }
        return Ok(());
    }
    let internal_name = host == "localhost"
        || ["localhost", "local", "internal", "localdomain", "home.arpa"]
            .iter()
            .any(|s| host.ends_with(&format!(".{s}")))
        || labels.len() < 2;
    if !allow_private && internal_name {
        return Err(bad("must not point at a private or internal address"));
    }
    Ok(())
}

fn valid_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok_and(|n| n > 0)
}

fn internal_v4(ip: &core::net::Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || a >= 240
}

fn internal_v6(ip: &core::net::Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return internal_v4(&v4);
    }
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || first == 0x2001 && ip.segments()[1] == 0x0db8
}

fn view(h: &WebhookRecord) -> Value {
    json!({
        "id": h.id,
        "url": h.url,
        "events": h.events,
        "active": h.active,
        "createdAt": iso8601(h.created_ms),
        "consecutiveFailures": h.consecutive_failures,
    })
}

fn delivery_view(d: &DeliveryRecord) -> Value {
    json!({
        "id": d.id,
        "eventId": d.event_id,
        "event": d.event,
        "status": d.status,
        "createdAt": iso8601(d.created_ms),
        "nextAttemptAt": d.next_attempt_ms.map(iso8601),
        "attempts": d.attempts.iter().map(|a| json!({
            "at": iso8601(a.at_ms),
            "statusCode": a.status_code,
            "error": a.error,
        })).collect::<Vec<_>>(),
    })
}

/// `GET /webhooks/events` (public).
pub fn events(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    Ok(Outcome::Done(web::ok(200, json!({ "events": EVENTS }))))
}

fn parse_events(body: &web::Body) -> Result<Vec<String>, ApiError> {
    web::req_names(body, "events", EVENTS)
}

/// `POST /webhooks`.
pub fn create(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let url = web::req_str(&body, "url")?.trim().to_string();
    check_url(
        &url,
        ctx.config.production,
        ctx.config.webhook_allow_private,
    )?;
    let events = parse_events(&body)?;
    let too_many =
        || ApiError::validation(format!("at most {MAX_HOOKS_PER_USER} webhooks per user"));
    if auth.user.webhooks.len() >= MAX_HOOKS_PER_USER {
        return Err(too_many());
    }
    let hook = WebhookRecord {
        id: ctx.uuid(),
        user_id: auth.user.id.clone(),
        url,
        events,
        secret: util::random_hex(ctx.env, 32),
        active: true,
        created_ms: ctx.now_ms(),
        consecutive_failures: 0,
        deliveries: vec![],
    };
    records::save(ctx.env.store, &hook_key(&hook.id), &hook)?;
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            if u.webhooks.len() >= MAX_HOOKS_PER_USER {
                return Err(too_many());
            }
            u.webhooks.push(hook.id.clone());
            Ok(())
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&auth.user.id),
        "webhook_created",
        true,
        json!({ "webhookId": hook.id }),
    );
    let mut data = view(&hook);
    data["secret"] = json!(hook.secret);
    Ok(Outcome::Done(web::ok(201, data)))
}

fn owned(ctx: &mut Ctx, user: &UserRecord, id: &str) -> Result<WebhookRecord, ApiError> {
    if !util::is_uuid(id) || !user.webhooks.iter().any(|h| h == id) {
        return Err(ApiError::NotFound);
    }
    let h: WebhookRecord =
        records::load(ctx.env.store, &hook_key(id))?.ok_or(ApiError::NotFound)?;
    if h.user_id != user.id {
        return Err(ApiError::NotFound);
    }
    Ok(h)
}

/// `GET /webhooks`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let keys: Vec<String> = auth.user.webhooks.iter().map(|id| hook_key(id)).collect();
    let hooks: Vec<Value> = records::load_each::<WebhookRecord>(ctx.env.store, &keys)?
        .into_iter()
        .filter(|h| h.user_id == auth.user.id)
        .map(|h| view(&h))
        .collect();
    Ok(Outcome::Done(web::ok(200, json!({ "webhooks": hooks }))))
}

/// `GET /webhooks/{id}`.
pub fn get(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let h = owned(ctx, &auth.user, id)?;
    Ok(Outcome::Done(web::ok(200, view(&h))))
}

/// `DELETE /webhooks/{id}`: the hook and its delivery log.
pub fn delete(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let h = owned(ctx, &auth.user, id)?;
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.webhooks.retain(|x| x != id);
            Ok(())
        },
    )?;
    records::remove(ctx.env, &hook_key(id))?;
    for d in &h.deliveries {
        remove_delivery(ctx.env, d)?;
    }
    ctx.audit(
        Some(&auth.user.id),
        "webhook_deleted",
        true,
        json!({ "webhookId": id }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Webhook deleted" }),
    )))
}

/// `GET /webhooks/{id}/deliveries`: newest first.
pub fn deliveries(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let h = owned(ctx, &auth.user, id)?;
    let keys: Vec<String> = h.deliveries.iter().rev().map(|d| delivery_key(d)).collect();
    let list: Vec<Value> = records::load_each::<DeliveryRecord>(ctx.env.store, &keys)?
        .iter()
        .map(delivery_view)
        .collect();
    Ok(Outcome::Done(web::ok(200, json!({ "deliveries": list }))))
}

/// `POST /webhooks/{id}/test`: a `webhook.test` event to this hook only,
/// delivered after the response.
pub fn test(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let h = owned(ctx, &auth.user, id)?;
    let data =
        json!({ "userId": auth.user.id, "webhookId": h.id, "message": "This is a test event" });
    let call = new_delivery(ctx.env, &h, "webhook.test", data)?;
    let delivery_id = call.delivery_id.clone();
    ctx.effects.push(Effect::Webhook(call));
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Test event queued", "deliveryId": delivery_id }),
    )))
}

/// `POST /webhooks/verify-signature`.
pub fn verify_signature(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("webhooks:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let id = web::req_str(&body, "webhookId")?;
    let payload = web::opt_str(&body, "payload")?
        .ok_or_else(|| ApiError::validation("payload is required"))?;
    let sig = web::req_str(&body, "signature")?;
    let h = owned(ctx, &auth.user, &id)?;
    if signature::verify_signature(h.secret.as_bytes(), payload.as_bytes(), &sig) {
        Ok(Outcome::Done(web::ok(200, json!({ "valid": true }))))
    } else {
        Err(ApiError::InvalidSignature)
    }
}

fn call_for(hook: &WebhookRecord, d: &DeliveryRecord) -> WebhookCall {
    WebhookCall {
        delivery_id: d.id.clone(),
        call: HttpCall {
            method: "POST".into(),
            url: hook.url.clone(),
            headers: vec![
                ("Content-Type".into(), "application/json".into()),
                ("Content-Length".into(), d.payload.len().to_string()),
                ("User-Agent".into(), "tfa-webhooks/1".into()),
                ("X-Webhook-Id".into(), d.event_id.clone()),
                ("X-Webhook-Event".into(), d.event.clone()),
                ("X-Webhook-Timestamp".into(), d.timestamp.clone()),
                (
                    "X-Webhook-Signature".into(),
                    signature::sign_payload(hook.secret.as_bytes(), d.payload.as_bytes()),
                ),
            ],
            body: d.payload.clone().into_bytes(),
        },
    }
}

/// Creates a delivery of `event` to `hook` and returns its first attempt.
fn new_delivery(
    env: &mut Env,
    hook: &WebhookRecord,
    event: &str,
    data: Value,
) -> Result<WebhookCall, ApiError> {
    let event_id = util::uuid_v4(env);
    let timestamp = iso8601(env.now_ms);
    let payload =
        json!({ "id": event_id, "event": event, "timestamp": timestamp, "data": data }).to_string();
    let d = DeliveryRecord {
        id: util::uuid_v4(env),
        webhook_id: hook.id.clone(),
        event_id,
        event: event.to_string(),
        timestamp,
        payload,
        attempts: vec![],
        status: "pending".into(),
        next_attempt_ms: Some(env.now_ms),
        created_ms: env.now_ms,
    };
    records::save(env.store, &delivery_key(&d.id), &d)?;
    env.store.increment(DELIVERIES_CREATED, 1)?;
    let dropped = records::update(env, &hook_key(&hook.id), |h: &mut WebhookRecord| {
        h.deliveries.push(d.id.clone());
        let excess = h.deliveries.len().saturating_sub(KEEP_DELIVERIES);
        Ok(h.deliveries.drain(..excess).collect::<Vec<_>>())
    })?
    .unwrap_or_default();
    for old in dropped {
        remove_delivery(env, &old)?;
    }
    Ok(call_for(hook, &d))
}

/// Removes a delivery record; one that was still pending is first marked
/// `removed` under its lock and counted as settled. A delivery read as
/// settled is removed without the lock: no state leads back to `pending`.
fn remove_delivery(env: &Env, id: &str) -> Result<(), ApiError> {
    let key = delivery_key(id);
    let read: Option<DeliveryRecord> = records::load(env.store, &key)?;
    if read.is_some_and(|d| d.status != "pending") {
        return records::remove(env, &key);
    }
    let was_pending = records::update(env, &key, |d: &mut DeliveryRecord| {
        let pending = d.status == "pending";
        if pending {
            d.status = "removed".into();
            d.next_attempt_ms = None;
        }
        Ok(pending)
    })?;
    if was_pending == Some(true) {
        env.store.increment(DELIVERIES_SETTLED, 1)?;
    }
    records::remove(env, &key)
}

/// Deliveries created and not yet settled, from the two counters, each
/// read by `read_counter` (a store's `increment(key, 0)`: core's own store
/// or a host's, for its metrics); 0 when a failure between a record's
/// write and its count left them uneven.
pub fn pending_deliveries<E>(
    mut read_counter: impl FnMut(&str) -> Result<i64, E>,
) -> Result<u64, E> {
    let created = read_counter(DELIVERIES_CREATED)?;
    let settled = read_counter(DELIVERIES_SETTLED)?;
    Ok(created.saturating_sub(settled).max(0).unsigned_abs())
}

/// Fans an event out to the user's subscribed, active hooks: those of
/// `known` (the user record's list as the request read it), else of the
/// user record read now.
pub fn fan_out(
    env: &mut Env,
    user_id: &str,
    known: Option<Vec<String>>,
    event: &str,
    data: Value,
) -> Result<Vec<WebhookCall>, ApiError> {
    let ids = match known {
        Some(ids) => ids,
        None => match records::load::<UserRecord>(env.store, &records::user_key(user_id))? {
            Some(user) => user.webhooks,
            None => return Ok(vec![]),
        },
    };
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let keys: Vec<String> = ids.iter().map(|id| hook_key(id)).collect();
    let hooks: Vec<WebhookRecord> = records::load_each::<WebhookRecord>(env.store, &keys)?
        .into_iter()
        .filter(|h| h.active && h.user_id == user_id && h.events.iter().any(|e| e == event))
        .collect();
    hooks
        .iter()
        .map(|h| new_delivery(env, h, event, data.clone()))
        .collect()
}

/// The retry queue's key prefix: `wq:n:{bucket}`, `wq:e:{bucket}:{n}`
/// ([`util::bucket_count_key`], [`util::bucket_entry_key`]).
const QUEUE: &str = "wq:";

fn enqueue(env: &mut Env, delivery_id: &str, at_ms: u64) -> Result<(), ApiError> {
    let b = at_ms.div_ceil(QUEUE_BUCKET_MS);
    let n = env.store.increment(&util::bucket_count_key(QUEUE, b), 1)?;
    env.store.set(
        &util::bucket_entry_key(QUEUE, b, Decimal::of_signed(n)),
        delivery_id.as_bytes(),
    )?;
    Ok(())
}

/// Records the outcome of an attempt (`Ok(status)` for any HTTP answer,
/// `Err(reason)` when none came); 2xx is success. Failures are retried on
/// the back-off schedule; returns log lines.
pub fn record_result(
    env: &mut Env,
    delivery_id: &str,
    result: Result<u16, String>,
) -> Result<Vec<String>, ApiError> {
    let now = env.now_ms;
    let ok = matches!(result, Ok(200..=299));
    let attempt = match &result {
        Ok(code) => Attempt {
            at_ms: now,
            status_code: Some(*code),
            error: None,
        },
        Err(e) => Attempt {
            at_ms: now,
            status_code: None,
            error: Some(e.chars().filter(|c| !c.is_control()).take(200).collect()),
        },
    };
    let Some((d, settled)) =
        records::update(env, &delivery_key(delivery_id), |d: &mut DeliveryRecord| {
            let was_pending = d.status == "pending";
            d.attempts.push(attempt.clone());
            if ok {
                d.status = "succeeded".into();
                d.next_attempt_ms = None;
            } else if let Some(delay) = BACKOFF_SECS.get(d.attempts.len() - 1) {
                d.next_attempt_ms = Some(now.saturating_add(delay.saturating_mul(1000)));
            } else {
                d.status = "failed".into();
                d.next_attempt_ms = None;
            }
            Ok((d.clone(), was_pending && d.status != "pending"))
        })?
    else {
        return Ok(vec![]);
    };
    if settled {
        env.store.increment(DELIVERIES_SETTLED, 1)?;
    }
    let mut log = Vec::new();
    if let Some(at) = d.next_attempt_ms {
        enqueue(env, &d.id, at)?;
    } else if d.status == "failed" {
        log.push(format!(
            "webhook delivery {} given up after {} attempts",
            d.id,
            d.attempts.len()
        ));
    }
    let disabled = records::update(env, &hook_key(&d.webhook_id), |h: &mut WebhookRecord| {
        if ok {
            h.consecutive_failures = 0;
        } else {
            h.consecutive_failures = h.consecutive_failures.saturating_add(1);
            if h.consecutive_failures >= DISABLE_AFTER && h.active {
                h.active = false;
                return Ok(true);
            }
        }
        Ok(false)
    })?;
    if disabled == Some(true) {
        log.push(format!(
            "webhook {} disabled after {DISABLE_AFTER} consecutive failures",
            d.webhook_id
        ));
    }
    Ok(log)
}

pub(crate) const RETRY_QUEUE: crate::plumbing::housekeeping::BucketQueue =
    crate::plumbing::housekeeping::BucketQueue {
        ptr: "wq:ptr",
        claim: "wq:c",
        bucket_ms: QUEUE_BUCKET_MS,
        max_per_call: QUEUE_BUCKETS_PER_TICK,
        start_behind: 1,
        after: forget_bucket,
    };

/// Retries that have come due (a few queue buckets per call), through the
/// same bucket sweeper as housekeeping; with the first error, if any (the
/// calls of finished buckets are returned all the same).
pub fn due(env: &mut Env) -> (Vec<WebhookCall>, Result<(), ApiError>) {
    let (calls, result) = crate::plumbing::housekeeping::drain_due(env, &RETRY_QUEUE, drain);
    (calls.into_iter().flatten().collect(), result)
}

/// The due retries of one queue bucket. Entries stay until the pointer has
/// moved past the bucket ([`forget_bucket`]): if anything fails first, the
/// bucket is drained again later, and a delivery already attempted is not
/// due any more, so nothing is lost or sent twice.
fn drain(env: &mut Env, bucket: u64) -> Result<Vec<WebhookCall>, ApiError> {
    let n = env
        .store
        .increment(&util::bucket_count_key(QUEUE, bucket), 0)?
        .max(0) as u64;
    let mut calls = Vec::new();
    for i in 1..=n {
        let entry = util::bucket_entry_key(QUEUE, bucket, Decimal::of(i));
        let Some(id) = env
            .store
            .get(&entry)?
            .and_then(|v| String::from_utf8(v).ok())
        else {
            continue;
        };
        let Some(d) = records::load::<DeliveryRecord>(env.store, &delivery_key(&id))? else {
            continue;
        };
        let due = d.status == "pending" && d.next_attempt_ms.is_some_and(|t| t <= env.now_ms);
        let hook: Option<WebhookRecord> = records::load(env.store, &hook_key(&d.webhook_id))?;
        if let Some(h) = hook.filter(|h| h.active && due) {
            calls.push(call_for(&h, &d));
        }
    }
    Ok(calls)
}

/// Drops a drained bucket's entries (best effort: a leftover entry points at
/// a delivery that is no longer due).
fn forget_bucket(env: &mut Env, bucket: u64) {
    let count_key = util::bucket_count_key(QUEUE, bucket);
    let n = env.store.increment(&count_key, 0).unwrap_or(0).max(0) as u64;
    for i in 1..=n {
        let _ = env
            .store
            .delete(&util::bucket_entry_key(QUEUE, bucket, Decimal::of(i)));
    }
    let _ = env.store.delete(&count_key);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn keys_keep_their_spelling() {
        assert_eq!(hook_key("h1"), "wh:h1");
        assert_eq!(delivery_key("d1"), "whd:d1");
        assert_eq!(util::bucket_count_key(QUEUE, 29_415_480), "wq:n:29415480");
        assert_eq!(
            util::bucket_entry_key(QUEUE, 7, Decimal::of(12)),
            "wq:e:7:12"
        );
        assert_eq!(
            util::bucket_entry_key(QUEUE, 7, Decimal::of_signed(-1)),
            "wq:e:7:-1"
        );
    }
}
