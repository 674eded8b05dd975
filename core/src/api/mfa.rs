//! The second step of a login: temp tokens, `POST /2fa/verify`,
//! `POST /2fa/verify-backup-code`, and the per-account lock.
//!
//! A temp token (5 minutes) names its `jti`. One counter hangs off it,
//! `tt:{jti}`, and says two things: its low part counts attempts (each
//! verification reserves one before checking; the token is dead once more
//! than 5 have been made, so 5 wrong codes kill it), and [`EXCHANGED`] is
//! added once when the token is exchanged for a session (and taken off again
//! when the exchange loses a race for its code). A counter at or above
//! `TEMP_ATTEMPTS` is therefore a dead token, whichever the reason, and one
//! `increment` both reserves an attempt and checks that the token is still
//! unused. The counter is scheduled for removal when the token expires.
//!
//! Independently of IP rate limits, an account gets at most 20 consecutive
//! failed second-factor attempts (`mfafail:{uid}`); the 20th locks second-factor
//! verification for it for 15 minutes (`mfalock:{uid}`).

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::backup;
use crate::api::devices;
use crate::api::otp;
use crate::api::sessions;
use crate::api::totp;
use crate::api::users::SignedIn;
use crate::contract::error::{ApiError, RateInfo};
use crate::crypto::codes;
use crate::crypto::tokens::{Claims, Extra, TokenKind};
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, Kept, UserRecord};
use crate::plumbing::util;
use crate::plumbing::web;

/// Attempts a temp token allows.
pub const TEMP_ATTEMPTS: i64 = 5;
/// What an exchange adds to a temp token's counter `tt:{jti}`. Attempts
/// are counted in the low part: even refused ones keep adding 1, but 2^40
/// of them (a trillion requests within the token's 5 minutes) cannot be
/// made, so the low part never reaches it.
pub const EXCHANGED: i64 = 1 << 40;
/// Consecutive failures that lock an account's second factor.
pub const LOCK_AFTER: i64 = 20;
/// How long the lock lasts.
pub const LOCK_MS: u64 = 15 * 60 * 1000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lock {
    exp_ms: u64,
}

/// Issues a temp token for `user_id` and schedules its counter's removal.
pub fn issue_temp(ctx: &mut Ctx, user_id: &str) -> Result<String, ApiError> {
    let keys = ctx.keys()?;
    let jti = util::random_hex(ctx.env, 16);
    let now = ctx.now_secs();
    let exp_ms = now
        .saturating_add(TokenKind::Temp.lifetime_secs())
        .saturating_mul(1000);
    ctx.expire(Expiry::counter(&counter_key(&jti), exp_ms));
    ctx.user_id = Some(user_id.to_string());
    Ok(keys.tokens.issue(
        TokenKind::Temp,
        user_id,
        Extra {
            jti: Some(jti),
            ..Extra::default()
        },
        now,
    ))
}

/// The counter of the temp token `jti`: attempts, plus [`EXCHANGED`] once
/// it is exchanged.
fn counter_key(jti: &str) -> String {
    util::key(&["tt:", jti])
}

/// The second-factor failure counter of `user_id`.
fn fail_key(user_id: &str) -> String {
    util::key(&["mfafail:", user_id])
}

/// The second-factor lock record of `user_id`.
fn lock_key(user_id: &str) -> String {
    util::key(&["mfalock:", user_id])
}

/// A temp token that verifies, has attempts left and has not been
/// exchanged; else `InvalidTempToken`.
pub fn temp_claims(ctx: &mut Ctx, token: &str) -> Result<Claims, ApiError> {
    let (claims, jti) = verified_temp(ctx, token)?;
    if ctx.env.store.increment(&counter_key(&jti), 0)? >= TEMP_ATTEMPTS {
        return Err(ApiError::InvalidTempToken);
    }
    ctx.user_id = Some(claims.sub.clone());
    Ok(claims)
}

/// The claims and `jti` of a temp token whose signature, kind and time
/// verify; else `InvalidTempToken`. Says nothing about its counter.
fn verified_temp(ctx: &mut Ctx, token: &str) -> Result<(Claims, String), ApiError> {
    let keys = ctx.keys()?;
    let claims = keys
        .tokens
        .verify(TokenKind::Temp, token, ctx.now_secs())
        .map_err(|_| ApiError::InvalidTempToken)?;
    let jti = claims.jti.clone().ok_or(ApiError::InvalidTempToken)?;
    Ok((claims, jti))
}

/// Refuses a locked account's second factor with the lock's 429, unless
/// the temp token `jti` was exchanged already: a used token is refused as
/// that, whatever the account's state.
fn check_lock(ctx: &mut Ctx, user_id: &str, jti: &str) -> Result<(), ApiError> {
    let lock: Option<Lock> = records::load(ctx.env.store, &lock_key(user_id))?;
    match lock {
        Some(l) if l.exp_ms > ctx.env.now_ms => {
            // Only a locked account pays for this read.
            if ctx.env.store.increment(&counter_key(jti), 0)? >= EXCHANGED {
                return Err(ApiError::InvalidTempToken);
            }
            let reset = l.exp_ms.div_ceil(1000);
            Err(ApiError::RateLimited(RateInfo {
                limit: LOCK_AFTER as u32,
                remaining: 0,
                reset_secs: reset,
                retry_after_secs: reset.saturating_sub(ctx.now_secs()),
            }))
        }
        _ => Ok(()),
    }
}

pub(crate) fn record_failure(ctx: &mut Ctx, user_id: &str, method: &str) -> Result<(), ApiError> {
    ctx.audit(
        Some(user_id),
        "2fa_failed",
        false,
        json!({ "method": method }),
    );
    let key = fail_key(user_id);
    if ctx.env.store.increment(&key, 1)? >= LOCK_AFTER {
        let exp_ms = ctx.now_ms().saturating_add(LOCK_MS);
        let lock = lock_key(user_id);
        records::save(ctx.env.store, &lock, &Lock { exp_ms })?;
        ctx.expire(Expiry::record(&lock, exp_ms));
        ctx.env.store.delete(&key)?;
        ctx.log(format!(
            "second factor locked for user {user_id} after {LOCK_AFTER} failures"
        ));
    }
    Ok(())
}

/// Everything the verification endpoints do before checking a code:
/// token, lock, one reserved attempt, the user. A token whose attempts are
/// used up, or that was exchanged, is refused by the reservation itself;
/// when the account is locked too, the lock is what the client is told for
/// a used-up token, and `InvalidTempToken` for an exchanged one.
pub(crate) fn begin(ctx: &mut Ctx, token: &str) -> Result<(Claims, Kept<UserRecord>), ApiError> {
    let (claims, jti) = verified_temp(ctx, token)?;
    ctx.user_id = Some(claims.sub.clone());
    check_lock(ctx, &claims.sub, &jti)?;
    // Reserving the attempt is also the check that one was left and that
    // the token is unused: no separate read of the counter first.
    if ctx.env.store.increment(&counter_key(&jti), 1)? > TEMP_ATTEMPTS {
        return Err(ApiError::InvalidTempToken);
    }
    let user = records::load_kept(ctx.env.store, &records::user_key(&claims.sub))?
        .ok_or(ApiError::InvalidTempToken)?;
    Ok((claims, user))
}

/// What a successful verification spends.
pub(crate) enum Spend {
    /// The backup code with this stored hash.
    Backup(String),
    /// This TOTP time step.
    TotpStep(u64),
    /// This SMS / e-mail login code.
    Code(crate::plumbing::records::OtpCode),
    /// A verified passkey assertion: the credential (service id) and the
    /// counter and backup state to record.
    #[cfg_attr(not(feature = "webauthn"), allow(dead_code))]
    Passkey {
        /// `hwk` or `swk` for `amr`.
        key: &'static str,
        id: String,
        sign_count: u32,
        backed_up: bool,
    },
}

/// Exchanges the temp token (once) for a session with `mfa` set, spending
/// `spend` in the same locked update of the user record that links the
/// session: either both happen or neither does, so a store that fails at any
/// point never leaves a backup code, TOTP step or SMS / e-mail code spent
/// without a session.
/// Returns the tokens and the number of backup codes left.
///
/// Order: claim the temp token (add [`EXCHANGED`] to `tt:{jti}`), store the
/// new session record (unreachable until linked: no token names it), then
/// the locked update, which starts from `user` (the record [`begin`] read)
/// when the record is unchanged since.
/// When the store fails before the locked update, the code is unspent and
/// the temp token is used up (the user logs in again). When another request
/// spent the code first, the temp token is given back and the attempt counts
/// as a failure.
pub(crate) fn exchange(
    ctx: &mut Ctx,
    claims: &Claims,
    user: &Kept<UserRecord>,
    spend: Spend,
) -> Result<(sessions::Tokens, usize), ApiError> {
    let keys = ctx.keys()?;
    let jti = claims.jti.clone().unwrap_or_default();
    let counter = counter_key(&jti);
    // Unused before this addition: the attempts alone, below EXCHANGED.
    if ctx.env.store.increment(&counter, EXCHANGED)? >= EXCHANGED.saturating_mul(2) {
        return Err(ApiError::InvalidTempToken);
    }
    let second = match &spend {
        Spend::Backup(_) | Spend::TotpStep(_) => "otp",
        Spend::Code(c) if c.method == "sms" => "sms",
        Spend::Code(_) => "mail",
        Spend::Passkey { key, .. } => key,
    };
    let session = sessions::prepare_amr(ctx, &claims.sub, true, &["pwd", second, "mfa"])?;
    let now = ctx.now_ms();
    let linked = records::update_kept(
        ctx.env,
        &records::user_key(&claims.sub),
        user,
        |u: &mut UserRecord| {
            let left = match &spend {
                Spend::Backup(hash) => backup::mark_used(u, hash)?,
                Spend::TotpStep(step) => {
                    if u.totp_last_step.is_some_and(|last| *step <= last) {
                        return Err(ApiError::InvalidCode);
                    }
                    u.totp_last_step = Some(*step);
                    0
                }
                Spend::Code(code) => {
                    otp::spend_login_code(u, code, now)?;
                    0
                }
                Spend::Passkey {
                    id,
                    sign_count,
                    backed_up,
                    ..
                } => {
                    let c = u
                        .webauthn
                        .iter_mut()
                        .find(|c| c.id == *id)
                        .ok_or(ApiError::InvalidCode)?;
                    // Re-checked under the lock: two assertions verified at
                    // once cannot both move the counter to one value.
                    if c.sign_count != 0 && *sign_count != 0 && *sign_count <= c.sign_count {
                        return Err(ApiError::InvalidCode);
                    }
                    c.sign_count = c.sign_count.max(*sign_count);
                    c.backed_up = *backed_up;
                    c.last_used_ms = Some(now);
                    0
                }
            };
            Ok((left, sessions::link(u, &session, now)))
        },
    );
    let (left, over) = match linked {
        Ok(Some(linked)) => linked,
        Ok(None) => {
            sessions::discard(ctx, &session);
            return Err(ApiError::InvalidTempToken);
        }
        Err(e) => {
            sessions::discard(ctx, &session);
            if matches!(e, ApiError::InvalidCode | ApiError::BackupCodeUsed) {
                // Lost a race for the code: this token may try again.
                ctx.env.store.increment(&counter, -EXCHANGED)?;
                let method = match &spend {
                    Spend::Backup(_) => "backup",
                    Spend::TotpStep(_) => "totp",
                    Spend::Code(c) => c.method.as_str(),
                    Spend::Passkey { .. } => "webauthn",
                };
                record_failure(ctx, &claims.sub, method)?;
            }
            return Err(e);
        }
    };
    // The session is issued: from here on nothing may turn this into an
    // error, or the client would lose a session its code has paid for.
    if ctx.env.store.delete(&fail_key(&claims.sub)).is_err() {
        ctx.log(format!(
            "failure counter of user {} not reset (store unavailable)",
            claims.sub
        ));
    }
    sessions::evict(ctx, &claims.sub, &over);
    Ok((sessions::issue(ctx, &keys, &session), left))
}

/// `POST /2fa/verify`.
pub fn verify(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::VERIFY, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "tempToken")?;
    let code = codes::normalize_otp_code(&web::req_str(&body, "code")?)
        .ok_or_else(|| ApiError::validation("code must be 6 digits"))?;
    let trust = web::opt_bool(&body, "trustDevice")?;
    let name = devices::clean_name(web::opt_str(&body, "deviceName")?)?;
    let only = otp::parse_method(web::opt_str(&body, "method")?)?;
    let (claims, user) = begin(ctx, &token)?;
    if !user.two_factor_enabled {
        return Err(ApiError::NoMethod);
    }
    let mut spend = None;
    if only.is_none_or(|m| m == "totp") {
        spend = totp::matching_step(ctx, &user, &code)?.map(Spend::TotpStep);
    }
    if spend.is_none() && only != Some("totp") {
        spend = otp::login_match(ctx, &user.id, only.and_then(otp::channel_of), &code)?
            .map(Spend::Code);
    }
    let Some(spend) = spend else {
        record_failure(ctx, &user.id, only.unwrap_or("any"))?;
        return Err(ApiError::InvalidCode);
    };
    let (tokens, _) = exchange(ctx, &claims, &user, spend)?;
    Ok(verified(
        ctx,
        &user,
        &tokens,
        trust,
        name,
        json!({ "method": only.unwrap_or("code"), "trustDevice": trust }),
    ))
}

/// The answer of a passed second step (`/2fa/verify`, `/2fa/verify-webauthn`):
/// the session's tokens and the user, plus a device token when `trust` asks
/// for one, and the `2fa_verified` audit record with `detail`.
pub fn verified(
    ctx: &mut Ctx,
    user: &UserRecord,
    tokens: &sessions::Tokens,
    trust: bool,
    name: Option<String>,
    detail: serde_json::Value,
) -> Outcome {
    let mut data = SignedIn::of(tokens, user);
    if trust {
        // The session is issued already: a device that cannot be stored is
        // left out of the answer rather than failing it.
        match devices::trust(ctx, &user.id, name) {
            Ok(t) => data.device_token = Some(t),
            Err(e) => ctx.log(format!(
                "trusted device for user {} not stored: {e:?}",
                user.id
            )),
        }
    }
    ctx.audit_of(user, "2fa_verified", true, detail);
    Outcome::Done(web::ok_with(200, &data))
}

/// `POST /2fa/verify-backup-code` (also `/2fa/verify-backup`); the code may
/// be sent as `backupCode` or `code`.
pub fn verify_backup(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::VERIFY_BACKUP, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "tempToken")?;
    let code = web::req_str_any(&body, &["backupCode", "code"])?;
    if code.chars().count() > 64 {
        return Err(ApiError::validation("backupCode is too long"));
    }
    let (claims, user) = begin(ctx, &token)?;
    let hash = match backup::check(ctx, &user, &code) {
        Ok(hash) => hash,
        Err(e @ (ApiError::InvalidCode | ApiError::BackupCodeUsed)) => {
            record_failure(ctx, &user.id, "backup")?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let (tokens, remaining) = exchange(ctx, &claims, &user, Spend::Backup(hash))?;
    ctx.audit_of(
        &user,
        "backup_code_used",
        true,
        json!({ "remainingCodes": remaining }),
    );
    Ok(Outcome::Done(web::ok_with(
        200,
        &SignedIn {
            remaining_codes: Some(remaining),
            ..SignedIn::of(&tokens, &user)
        },
    )))
}
