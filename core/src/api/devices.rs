//! Trusted devices: granted by `POST /2fa/verify` with `trustDevice`, used at
//! login to skip the second factor for 30 days, listed and removed by the
//! user.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::crypto::tokens::{Extra, TokenKind};
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, Ref, UserRecord};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

/// How long trust lasts.
pub const TRUST_MS: u64 = 30 * 24 * 3600 * 1000;
/// Longest device name kept.
pub const MAX_NAME_CHARS: usize = 100;
/// Most trusted devices a user keeps: trusting one more ends the oldest.
/// Every sign-in reads the user record that lists them, so the list must
/// not grow without bound (the same reason as `sessions::MAX_SESSIONS`).
pub const MAX_DEVICES: usize = 20;

/// A trusted device as stored at `dev:{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    pub id: String,
    pub user_id: String,
    pub device_name: Option<String>,
    pub ip_address: String,
    pub user_agent: String,
    pub created_ms: u64,
    pub last_used_ms: u64,
    pub exp_ms: u64,
}

fn key(id: &str) -> String {
    util::key(&["dev:", id])
}

fn device_json(d: &DeviceRecord) -> Value {
    json!({
        "id": d.id,
        "deviceName": d.device_name,
        "ipAddress": d.ip_address,
        "userAgent": d.user_agent,
        "createdAt": iso8601(d.created_ms),
        "lastUsedAt": iso8601(d.last_used_ms),
        "expiresAt": iso8601(d.exp_ms),
    })
}

/// Trims a device name and caps it at 100 characters; control characters
/// are a validation error.
pub fn clean_name(name: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(name) = name else { return Ok(None) };
    if name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "deviceName must not contain control characters",
        ));
    }
    let trimmed: String = name.trim().chars().take(MAX_NAME_CHARS).collect();
    Ok((!trimmed.is_empty()).then_some(trimmed))
}

/// Trusts the caller's device for `user_id`; returns the device token.
pub fn trust(ctx: &mut Ctx, user_id: &str, name: Option<String>) -> Result<String, ApiError> {
    let keys = ctx.keys()?;
    let now = ctx.now_ms();
    let exp_ms = now.checked_add(TRUST_MS).ok_or(ApiError::Internal)?;
    let device = DeviceRecord {
        id: ctx.uuid(),
        user_id: user_id.to_string(),
        device_name: name,
        ip_address: ctx.ip.clone(),
        user_agent: ctx.ua.clone(),
        created_ms: now,
        last_used_ms: now,
        exp_ms,
    };
    records::save(ctx.env.store, &key(&device.id), &device)?;
    ctx.expire(Expiry::record(&key(&device.id), exp_ms));
    let over = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            u.devices.push(Ref {
                id: device.id.clone(),
                exp_ms,
            });
            let over = u.devices.len().saturating_sub(MAX_DEVICES);
            Ok(u.devices[..over].to_vec())
        },
    )?
    .unwrap_or_default();
    ctx.audit(
        Some(user_id),
        "trusted_device_added",
        true,
        json!({ "deviceId": device.id }),
    );
    evict(ctx, user_id, &over);
    Ok(keys.tokens.issue(
        TokenKind::Device,
        user_id,
        Extra {
            did: Some(device.id.clone()),
            ..Extra::default()
        },
        ctx.now_secs(),
    ))
}

/// True when `token` is a valid device token of `user` whose device record
/// exists and has not expired; updates its `lastUsedAt`.
pub fn trusted(ctx: &mut Ctx, user: &UserRecord, token: &str) -> Result<bool, ApiError> {
    let keys = ctx.keys()?;
    let Ok(claims) = keys.tokens.verify(TokenKind::Device, token, ctx.now_secs()) else {
        return Ok(false);
    };
    let did = claims.did.unwrap_or_default();
    if claims.sub != user.id || !util::is_uuid(&did) {
        return Ok(false);
    }
    let now = ctx.now_ms();
    let ok = records::update(ctx.env, &key(&did), |d: &mut DeviceRecord| {
        if d.user_id != user.id || d.exp_ms <= now {
            return Ok(false);
        }
        d.last_used_ms = now;
        Ok(true)
    })?;
    Ok(ok == Some(true))
}

/// Ends the oldest devices beyond [`MAX_DEVICES`] (still listed when the
/// new one was linked): deletes each record, so its token stops working at
/// once, then drops the deleted ones from the user record. The new device
/// is trusted already, so nothing here is an error for the caller: a store
/// failure is logged and the devices stay listed (removable) until the
/// next trust ends them.
fn evict(ctx: &mut Ctx, user_id: &str, over: &[Ref]) {
    let ended = sessions::end_linked(
        ctx,
        user_id,
        over,
        key,
        |u| &mut u.devices,
        ("device", MAX_DEVICES),
    );
    if ended.is_empty() {
        return;
    }
    ctx.audit(
        Some(user_id),
        "trusted_device_removed",
        true,
        json!({ "reason": "device_limit", "removedCount": ended.len(), "deviceIds": ended }),
    );
}

fn live(ctx: &mut Ctx, user: &UserRecord) -> Result<Vec<DeviceRecord>, ApiError> {
    let keys: Vec<String> = user.devices.iter().map(|r| key(&r.id)).collect();
    let now = ctx.now_ms();
    let mut out: Vec<DeviceRecord> = records::load_each::<DeviceRecord>(ctx.env.store, &keys)?
        .into_iter()
        .filter(|d| d.exp_ms > now && d.user_id == user.id)
        .collect();
    out.sort_by_key(|d| std::cmp::Reverse(d.created_ms));
    Ok(out)
}

/// `GET /2fa/devices`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let devices: Vec<Value> = live(ctx, &auth.user)?.iter().map(device_json).collect();
    Ok(Outcome::Done(web::ok(200, json!({ "devices": devices }))))
}

/// `DELETE /2fa/devices/{deviceId}`.
pub fn delete(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    if !util::is_uuid(id) {
        return Err(ApiError::NotFound);
    }
    let found: Option<DeviceRecord> = records::load(ctx.env.store, &key(id))?;
    if !found.is_some_and(|d| d.user_id == auth.user.id && d.exp_ms > ctx.env.now_ms) {
        return Err(ApiError::NotFound);
    }
    records::remove(ctx.env, &key(id))?;
    let now = ctx.now_ms();
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.prune(now);
            u.devices.retain(|r| r.id != id);
            Ok(())
        },
    )?;
    ctx.audit(
        Some(&auth.user.id),
        "trusted_device_removed",
        true,
        json!({ "deviceId": id }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Device removed" }),
    )))
}

/// `DELETE /2fa/devices`.
pub fn delete_all(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let live_count = live(ctx, &auth.user)?.len();
    let now = ctx.now_ms();
    let refs = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.prune(now);
            Ok(std::mem::take(&mut u.devices))
        },
    )?
    .unwrap_or_default();
    for r in &refs {
        records::remove(ctx.env, &key(&r.id))?;
    }
    ctx.audit(
        Some(&auth.user.id),
        "trusted_device_removed",
        true,
        json!({ "removedCount": live_count }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "All trusted devices removed", "removedCount": live_count }),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn keys_keep_their_spelling() {
        assert_eq!(key("d1"), "dev:d1");
    }
}
