//! Backup codes: ten one-time codes per user, kept as keyed hashes
//! (HMAC-SHA-256 with a key derived from a server secret, salted with the
//! user id). Consumption is a compare-and-swap on the user record, so of any
//! number of concurrent uses of one code exactly one succeeds.

use serde_json::json;

use crate::context::{Ctx, Outcome};
use crate::crypto::codes;
use crate::error::ApiError;
use crate::ratelimit;
use crate::records::{self, BackupSet, BackupSlot, UserRecord};
use crate::sessions::{self, Access};
use crate::web;

/// Codes per set.
pub const SET_SIZE: usize = 10;

/// A fresh set: the plain codes (shown once) and their hashes (stored).
pub fn new_set(ctx: &mut Ctx, user_id: &str) -> Result<(Vec<String>, Vec<String>), ApiError> {
    let key = ctx.keys()?.backup;
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

/// Uses backup code `input` of `user_id`. Returns the number of codes left.
/// A malformed or unknown code is `InvalidCode`, a used one `BackupCodeUsed`.
pub fn consume(ctx: &mut Ctx, user_id: &str, input: &str) -> Result<usize, ApiError> {
    let code = codes::normalize_backup_code(input).ok_or(ApiError::InvalidCode)?;
    let hash = codes::keyed_hash(&ctx.keys()?.backup, user_id, &code);
    records::update(
        ctx.env.store,
        &format!("user:{user_id}"),
        |u: &mut UserRecord| {
            let set = u.backup.as_mut().ok_or(ApiError::InvalidCode)?;
            // Compare against every slot without stopping early.
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
        },
    )?
    .ok_or(ApiError::InvalidTempToken)
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
        ctx.env.store,
        &format!("user:{}", auth.user.id),
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
