//! TOTP enrolment and checking: setup (secret, QR code, backup codes held
//! pending for 15 minutes), verify-setup, removal, and the login check with
//! replay protection (a time step accepted once is never accepted again: the
//! user record's last step only moves forward, by a locked update).

use serde_json::json;

use crate::api::backup;
use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::crypto::{codes, qr, totp};
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, MethodRecord, PendingTotp, UserRecord};
use crate::plumbing::web;

/// How long a setup waits for its first code.
pub const PENDING_MS: u64 = 15 * 60 * 1000;

/// `POST /2fa/totp/setup`.
pub fn setup(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::SETUP, &auth.user.id)?;
    let raw: [u8; 20] = ctx.env.random();
    let secret = totp::base32_encode(&raw);
    let uri = totp::otpauth_uri(&ctx.config.totp_issuer, &auth.user.email, &secret);
    let qr = qr::qr_data_url(&uri).map_err(|_| ApiError::Internal)?;
    let (plain, hashes) = backup::new_set(ctx, &auth.user.id)?;
    let now = ctx.now_ms();
    let pending = PendingTotp {
        secret: secret.clone(),
        backup_hashes: hashes,
        exp_ms: now.checked_add(PENDING_MS).ok_or(ApiError::Internal)?,
    };
    records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.prune(now);
            u.pending_totp = Some(pending.clone());
            Ok(())
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&auth.user.id),
        "2fa_setup_started",
        true,
        json!({ "method": "totp" }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "secret": secret, "qrCode": qr, "otpauthUrl": uri, "backupCodes": plain }),
    )))
}

fn code_field(body: &web::Body) -> Result<String, ApiError> {
    let raw = web::req_str(body, "code")?;
    codes::normalize_otp_code(&raw).ok_or_else(|| ApiError::validation("code must be 6 digits"))
}

/// `POST /2fa/totp/verify-setup` (also `POST /2fa/totp/verify`).
pub fn verify_setup(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::VERIFY_SETUP, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let code = code_field(&body)?;
    let given_secret = web::opt_str(&body, "secret")?;
    let now = ctx.now_ms();
    let now_secs = ctx.now_secs();
    let method_id = ctx.uuid();
    let result = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            u.prune(now);
            let pending = u.pending_totp.clone().ok_or(ApiError::SetupNotInitiated)?;
            if let Some(s) = &given_secret {
                let same = codes::ct_eq(
                    s.trim().to_ascii_uppercase().as_bytes(),
                    pending.secret.as_bytes(),
                );
                if !same {
                    return Err(ApiError::InvalidCode);
                }
            }
            let raw = totp::base32_decode(&pending.secret).ok_or(ApiError::Internal)?;
            let step =
                totp::verify_code(&raw, &code, now_secs, None).ok_or(ApiError::InvalidCode)?;
            u.methods.retain(|m| m.kind != "totp");
            u.methods.push(MethodRecord {
                id: method_id.clone(),
                kind: "totp".into(),
                enabled: true,
                secret: Some(pending.secret.clone()),
                phone: None,
                email: None,
                verified_ms: now,
                created_ms: now,
            });
            u.totp_last_step = Some(step);
            u.backup = Some(backup::set_of(pending.backup_hashes.clone()));
            u.pending_totp = None;
            u.refresh_two_factor();
            u.updated_ms = now;
            Ok(())
        },
    )?;
    match result {
        None => Err(ApiError::InvalidToken),
        Some(()) => {
            ctx.audit(
                Some(&auth.user.id),
                "2fa_enabled",
                true,
                json!({ "method": "totp" }),
            );
            Ok(Outcome::Done(web::ok(
                200,
                json!({ "enabled": true, "method": "totp" }),
            )))
        }
    }
}

/// `DELETE /2fa/totp`: removes TOTP; when it was the last method 2FA is
/// disabled and backup codes are voided.
pub fn delete(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let now = ctx.now_ms();
    let still_enabled = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            if u.method("totp").is_none() {
                return Err(ApiError::NotFound);
            }
            u.methods.retain(|m| m.kind != "totp");
            u.totp_last_step = None;
            u.refresh_two_factor();
            u.updated_ms = now;
            Ok(u.two_factor_enabled)
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&auth.user.id),
        "2fa_disabled",
        true,
        json!({ "method": "totp", "twoFactorEnabled": still_enabled }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "TOTP disabled", "twoFactorEnabled": still_enabled }),
    )))
}

/// The time step of TOTP code `code` of `user` if it matches a step newer
/// than the last one accepted; reads only. The step is recorded (and so
/// spent) by the locked update that also links the new session; see
/// [`crate::api::mfa`]. None when the user has no TOTP or the code does not match
/// (or was used already).
pub fn matching_step(ctx: &Ctx, user: &UserRecord, code: &str) -> Result<Option<u64>, ApiError> {
    let Some(secret) = user.method("totp").and_then(|m| m.secret.clone()) else {
        return Ok(None);
    };
    let raw = totp::base32_decode(&secret).ok_or(ApiError::Internal)?;
    Ok(totp::verify_code(
        &raw,
        code,
        ctx.now_secs(),
        user.totp_last_step,
    ))
}
