//! Backup codes: ten one-time codes per user, kept as keyed hashes
//! (HMAC-SHA-256 with a key derived from a server secret, salted with the
//! user id). Consumption is a locked update of the user record, so of any
//! number of concurrent uses of one code exactly one succeeds.

use serde_json::json;

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::crypto::codes;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, BackupSet, BackupSlot, UserRecord};
use crate::plumbing::web;

/// Codes per set.
pub const SET_SIZE: usize = 10;

/// A fresh set: the plain codes (shown once) and their hashes (stored).
pub fn new_set(ctx: &mut Ctx, user_id: &str) -> Result<(Vec<String>, Vec<String>), ApiError> {
    let key = ctx.keys()?.backup();
    let plain: Vec<String> = (0..SET_SIZE)
        .map(|_| codes::backup_code(ctx.env.rng))
        .collect();
    let hashes = plain
        .iter()
        .map(|c| codes::keyed_hash(&key, user_id, c))
        .collect();
    Ok((plain, hashes))
}

/// A stored set from hashes.
pub fn set_of(hashes: Vec<String>) -> BackupSet {
    BackupSet {
        codes: hashes
            .into_iter()
            .map(|hash| BackupSlot { hash, used: false })
            .collect(),
    }
}

/// The stored hash of backup code `input` of `user`, if it is an unused code
/// of the user's set; reads only (the code is spent by [`mark_used`] inside
/// the locked update that also links the new session). A malformed or
/// unknown code is `InvalidCode`, a used one `BackupCodeUsed`.
pub fn check(ctx: &mut Ctx, user: &UserRecord, input: &str) -> Result<String, ApiError> {
    let code = codes::normalize_backup_code(input).ok_or(ApiError::InvalidCode)?;
    let hash = codes::keyed_hash(&ctx.keys()?.backup(), &user.id, &code);
    let set = user.backup.as_ref().ok_or(ApiError::InvalidCode)?;
    if slot_of(set, &hash).ok_or(ApiError::InvalidCode)?.used {
        return Err(ApiError::BackupCodeUsed);
    }
    Ok(hash)
}

/// The slot holding `hash`, comparing against every slot without stopping
/// early.
fn slot_of<'s>(set: &'s BackupSet, hash: &str) -> Option<&'s BackupSlot> {
    let mut found = None;
    for slot in &set.codes {
        if codes::ct_eq(slot.hash.as_bytes(), hash.as_bytes()) {
            found = Some(slot);
        }
    }
    found
}

/// Marks the code with `hash` used in `u` (inside a locked update);
/// returns the number of codes left. `InvalidCode` when the set no longer
/// holds it (replaced meanwhile), `BackupCodeUsed` when another request
/// spent it first.
pub fn mark_used(u: &mut UserRecord, hash: &str) -> Result<usize, ApiError> {
    let set = u.backup.as_mut().ok_or(ApiError::InvalidCode)?;
    let mut found = None;
    for (i, slot) in set.codes.iter().enumerate() {
        if codes::ct_eq(slot.hash.as_bytes(), hash.as_bytes()) {
            found = Some(i);
        }
    }
    let i = found.ok_or(ApiError::InvalidCode)?;
    if set.codes[i].used {
        return Err(ApiError::BackupCodeUsed);
    }
    set.codes[i].used = true;
    Ok(set.codes.iter().filter(|c| !c.used).count())
}

/// `POST /2fa/backup-codes/generate`: a new set; earlier codes stop working.
pub fn generate(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    if !auth.user.two_factor_enabled {
        return Err(ApiError::NoMethod);
    }
    let (plain, hashes) = new_set(ctx, &auth.user.id)?;
    let now = ctx.now_ms();
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            if !u.two_factor_enabled {
                return Err(ApiError::NoMethod);
            }
            u.backup = Some(set_of(hashes.clone()));
            u.updated_ms = now;
            Ok(())
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&auth.user.id),
        "backup_codes_regenerated",
        true,
        json!({}),
    );
    Ok(Outcome::Done(web::ok(200, json!({ "backupCodes": plain }))))
}

/// `GET /2fa/backup-codes/count`.
pub fn count(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let (remaining, total) = match &auth.user.backup {
        Some(set) => (
            set.codes.iter().filter(|c| !c.used).count(),
            set.codes.len(),
        ),
        None => (0, 0),
    };
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "remaining": remaining, "total": total }),
    )))
}
