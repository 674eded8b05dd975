//! Passkeys (WebAuthn) as a second-factor method: enrolment
//! (`/2fa/webauthn/register/options`, `/2fa/webauthn/register/verify`) and
//! management of the user's credentials (`/2fa/webauthn/credentials`).
//!
//! The ceremony checks themselves are [`crate::crypto::webauthn`]; this
//! module owns the challenges and the stored credentials.
//!
//! Challenges: 32 random bytes, kept for [`CHALLENGE_MS`] as
//! `wach:{challenge}` (base64url) with the purpose and the user they were
//! issued for. The browser sends the challenge back inside
//! `clientDataJSON`; a verification claims it with
//! `increment(wachu:{challenge}) == 1` before anything else, so of any
//! number of concurrent (or replayed) verifications exactly one gets to use
//! it (the same single-use rule as temp tokens). Both keys are scheduled for
//! removal at expiry.
//!
//! Credentials live in the user record ([`WebauthnCredential`]); the
//! credential ID is claimed once across all users (`wacid:{credentialId}`,
//! a counter), so one authenticator credential cannot be registered twice.
//! While a user has at least one credential, the user has a `webauthn`
//! [`MethodRecord`], which is what makes 2FA count as on and what
//! `/2fa/methods` lists.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::backup;
use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::crypto::cose;
use crate::crypto::webauthn::{
    self as wa, b64url_decode, b64url_encode, Expected, RegistrationResponse, RelyingParty,
    WebauthnError,
};
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, MethodRecord, UserRecord, WebauthnCredential};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

/// How long a challenge stays usable.
pub const CHALLENGE_MS: u64 = 5 * 60 * 1000;
/// Longest credential name.
pub const MAX_NAME_CHARS: usize = 64;
/// Most credentials per user.
pub const MAX_CREDENTIALS: usize = 20;

/// An outstanding challenge.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChallengeRecord {
    /// `register`, `login` (second step) or `passkey` (passwordless).
    pub purpose: String,
    /// The user it was issued to (none for passwordless).
    #[serde(default)]
    pub user_id: Option<String>,
    /// Whether the options required user verification.
    pub user_verification: bool,
    pub exp_ms: u64,
}

/// The relying party of the settings.
pub fn relying_party(ctx: &Ctx) -> RelyingParty {
    RelyingParty::new(&ctx.config.webauthn_rp_id, &ctx.config.webauthn_origins)
}

/// The key of an issued challenge's record, `wach:{challenge}`.
fn challenge_key(challenge: &str) -> String {
    util::key(&["wach:", challenge])
}

/// The key of the counter that lets a challenge be spent once,
/// `wachu:{challenge}`.
fn challenge_use_key(challenge: &str) -> String {
    util::key(&["wachu:", challenge])
}

/// The key that claims a credential id for one user, `wacid:{id}`.
fn credential_claim_key(credential_id: &str) -> String {
    util::key(&["wacid:", credential_id])
}

/// A verification failure as the client sees it: 400 with the check that
/// failed.
pub fn refused(e: &WebauthnError) -> ApiError {
    ApiError::validation(format!("passkey: {e}"))
}

/// Draws a challenge for `purpose` and stores it; returns it (base64url).
pub fn issue_challenge(
    ctx: &mut Ctx,
    purpose: &str,
    user_id: Option<&str>,
    user_verification: bool,
) -> Result<String, ApiError> {
    let raw: [u8; 32] = ctx.env.random();
    let challenge = b64url_encode(&raw);
    let exp_ms = ctx
        .now_ms()
        .checked_add(CHALLENGE_MS)
        .ok_or(ApiError::Internal)?;
    let key = challenge_key(&challenge);
    records::save(
        ctx.env.store,
        &key,
        &ChallengeRecord {
            purpose: purpose.to_string(),
            user_id: user_id.map(str::to_string),
            user_verification,
            exp_ms,
        },
    )?;
    ctx.expire(Expiry::record(&key, exp_ms));
    ctx.expire(Expiry::counter(&challenge_use_key(&challenge), exp_ms));
    Ok(challenge)
}

/// Spends the challenge named in `client_data_json` (once, atomically) and
/// returns it with its record; `PasskeyChallenge` when it is unknown,
/// expired, spent, for another purpose or another user.
pub fn spend_challenge(
    ctx: &mut Ctx,
    client_data_json: &[u8],
    purpose: &str,
    user_id: Option<&str>,
) -> Result<(Vec<u8>, ChallengeRecord), ApiError> {
    let cd = wa::parse_client_data(client_data_json).map_err(|e| refused(&e))?;
    if cd.challenge.len() != 32 {
        return Err(ApiError::PasskeyChallenge);
    }
    let name = b64url_encode(&cd.challenge);
    let record: ChallengeRecord =
        records::load(ctx.env.store, &challenge_key(&name))?.ok_or(ApiError::PasskeyChallenge)?;
    if ctx.env.store.increment(&challenge_use_key(&name), 1)? != 1 {
        return Err(ApiError::PasskeyChallenge);
    }
    // Spent: the record is no longer needed (the counter stays until expiry).
    ctx.env.store.delete(&challenge_key(&name))?;
    if record.exp_ms <= ctx.now_ms()
        || record.purpose != purpose
        || record.user_id.as_deref() != user_id
    {
        return Err(ApiError::PasskeyChallenge);
    }
    Ok((cd.challenge, record))
}

fn credential_descriptor(c: &WebauthnCredential) -> Value {
    let mut v = json!({ "type": "public-key", "id": c.credential_id });
    if !c.transports.is_empty() {
        v["transports"] = json!(c.transports);
    }
    v
}

/// `allowCredentials` / `excludeCredentials` for `user`.
pub fn descriptors(user: &UserRecord) -> Vec<Value> {
    user.webauthn.iter().map(credential_descriptor).collect()
}

/// The public view of a credential.
pub fn credential_json(c: &WebauthnCredential) -> Value {
    json!({
        "id": c.id,
        "credentialId": c.credential_id,
        "name": c.name,
        "algorithm": match c.algorithm {
            cose::ES256 => "ES256",
            cose::EDDSA => "EdDSA",
            _ => "RS256",
        },
        "transports": c.transports,
        "backupEligible": c.backup_eligible,
        "backedUp": c.backed_up,
        "createdAt": iso8601(c.created_ms),
        "lastUsedAt": c.last_used_ms.map(iso8601),
    })
}

fn clean_name(name: Option<String>, default: &str) -> Result<String, ApiError> {
    let Some(name) = name else {
        return Ok(default.to_string());
    };
    if name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "name must not contain control characters",
        ));
    }
    let trimmed = name.trim();
    if trimmed.is_empty() || trimmed.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::validation(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters"
        )));
    }
    Ok(trimmed.to_string())
}

/// Keeps the `webauthn` method record in step with the credentials.
fn sync_method(u: &mut UserRecord, method_id: &str, now: u64) {
    let has = u.methods.iter().any(|m| m.kind == "webauthn");
    if u.webauthn.is_empty() {
        u.methods.retain(|m| m.kind != "webauthn");
    } else if !has {
        u.methods.push(MethodRecord {
            id: method_id.to_string(),
            kind: "webauthn".into(),
            enabled: true,
            secret: None,
            phone: None,
            email: None,
            verified_ms: now,
            created_ms: now,
        });
    }
    u.refresh_two_factor();
}

/// `POST /2fa/webauthn/register/options`.
pub fn register_options(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::SETUP, &auth.user.id)?;
    let user = &auth.user;
    let challenge = issue_challenge(ctx, "register", Some(&user.id), false)?;
    let options = json!({
        "rp": { "id": ctx.config.webauthn_rp_id, "name": ctx.config.webauthn_rp_name },
        "user": {
            "id": b64url_encode(user.id.as_bytes()),
            "name": user.email,
            "displayName": user.username,
        },
        "challenge": challenge,
        "pubKeyCredParams": cose::SUPPORTED_ALGORITHMS
            .iter()
            .map(|alg| json!({ "type": "public-key", "alg": alg }))
            .collect::<Vec<_>>(),
        "timeout": CHALLENGE_MS,
        "excludeCredentials": descriptors(user),
        "authenticatorSelection": {
            "residentKey": "preferred",
            "requireResidentKey": false,
            "userVerification": "preferred",
        },
        "attestation": "none",
        "extensions": { "credProps": true },
    });
    Ok(Outcome::Done(web::ok(200, options)))
}

/// `POST /2fa/webauthn/register/verify` `{ credential, name? }`.
pub fn register_verify(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::VERIFY_SETUP, &auth.user.id)?;
    let body = web::parse_body(ctx.req)?;
    let credential = body
        .get("credential")
        .filter(|v| v.is_object())
        .ok_or_else(|| ApiError::validation("credential must be an object"))?;
    // The name is checked before the challenge is spent.
    let name = clean_name(
        web::opt_str(&body, "name")?,
        &format!("Passkey {}", auth.user.webauthn.len() + 1),
    )?;
    let response = RegistrationResponse::from_json(credential).map_err(|e| refused(&e))?;
    let user_id = auth.user.id.clone();
    let (challenge, record) =
        spend_challenge(ctx, &response.client_data_json, "register", Some(&user_id))?;
    let rp = relying_party(ctx);
    let new = wa::verify_registration(
        &rp,
        &response,
        &Expected {
            challenge: &challenge,
            user_verification: record.user_verification,
        },
    )
    .map_err(|e| refused(&e))?;
    if auth.user.webauthn.len() >= MAX_CREDENTIALS {
        return Err(ApiError::validation(format!(
            "at most {MAX_CREDENTIALS} passkeys per user"
        )));
    }
    let credential_id = b64url_encode(&new.credential_id);
    let claim = credential_claim_key(&credential_id);
    if ctx.env.store.increment(&claim, 1)? != 1 {
        return Err(ApiError::PasskeyRegistered);
    }
    let now = ctx.now_ms();
    let stored = WebauthnCredential {
        id: ctx.uuid(),
        credential_id,
        public_key: b64url_encode(&new.public_key),
        algorithm: new.algorithm,
        sign_count: new.sign_count,
        transports: new.transports.clone(),
        backup_eligible: new.backup_eligible,
        backed_up: new.backed_up,
        aaguid: crate::crypto::signature::to_hex(&new.aaguid),
        name,
        created_ms: now,
        last_used_ms: None,
    };
    let first = !auth.user.two_factor_enabled;
    let fresh_codes = if first {
        Some(backup::new_set(ctx, &user_id)?)
    } else {
        None
    };
    let method_id = ctx.uuid();
    let result = records::update(
        ctx.env,
        &records::user_key(&user_id),
        |u: &mut UserRecord| {
            if u.webauthn.len() >= MAX_CREDENTIALS {
                return Err(ApiError::validation(format!(
                    "at most {MAX_CREDENTIALS} passkeys per user"
                )));
            }
            let was_on = u.two_factor_enabled;
            u.webauthn.push(stored.clone());
            sync_method(u, &method_id, now);
            if !was_on {
                if let Some((_, hashes)) = &fresh_codes {
                    u.backup = Some(backup::set_of(hashes.clone()));
                }
            }
            u.updated_ms = now;
            Ok(was_on)
        },
    );
    let was_on = match result {
        Ok(Some(was_on)) => was_on,
        Ok(None) => {
            ctx.env.store.delete(&claim)?;
            return Err(ApiError::InvalidToken);
        }
        Err(e) => {
            ctx.env.store.delete(&claim)?;
            return Err(e);
        }
    };
    ctx.audit(
        Some(&user_id),
        "webauthn_registered",
        true,
        json!({ "credentialId": stored.id, "algorithm": stored.algorithm }),
    );
    let mut data = json!({ "credential": credential_json(&stored) });
    if !was_on {
        ctx.audit(
            Some(&user_id),
            "2fa_enabled",
            true,
            json!({ "method": "webauthn" }),
        );
        if let Some((plain, _)) = fresh_codes {
            data["backupCodes"] = json!(plain);
        }
    }
    Ok(Outcome::Done(web::ok(201, data)))
}

/// `GET /2fa/webauthn/credentials`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let list: Vec<Value> = auth.user.webauthn.iter().map(credential_json).collect();
    Ok(Outcome::Done(web::ok(200, json!({ "credentials": list }))))
}

/// `PATCH /2fa/webauthn/credentials/{credentialId}` `{ name }`.
pub fn rename(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    if !util::is_uuid(id) || !auth.user.webauthn.iter().any(|c| c.id == id) {
        return Err(ApiError::NotFound);
    }
    let body = web::parse_body(ctx.req)?;
    let name = clean_name(Some(web::req_str(&body, "name")?), "")?;
    let now = ctx.now_ms();
    let renamed = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            let c = u
                .webauthn
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or(ApiError::NotFound)?;
            c.name = name.clone();
            let out = c.clone();
            u.updated_ms = now;
            Ok(out)
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "credential": credential_json(&renamed) }),
    )))
}

/// `DELETE /2fa/webauthn/credentials/{credentialId}`: the last credential
/// of the last method turns 2FA off (as for TOTP).
pub fn delete(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    if !util::is_uuid(id) {
        return Err(ApiError::NotFound);
    }
    let now = ctx.now_ms();
    let (removed, still_enabled) = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            let pos = u
                .webauthn
                .iter()
                .position(|c| c.id == id)
                .ok_or(ApiError::NotFound)?;
            let removed = u.webauthn.remove(pos);
            sync_method(u, "", now);
            u.updated_ms = now;
            Ok((removed, u.two_factor_enabled))
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    release_claims(ctx, std::slice::from_ref(&removed));
    ctx.audit(
        Some(&auth.user.id),
        "webauthn_removed",
        true,
        json!({ "credentialId": removed.id }),
    );
    if !still_enabled {
        ctx.audit(
            Some(&auth.user.id),
            "2fa_disabled",
            true,
            json!({ "method": "webauthn", "twoFactorEnabled": false }),
        );
    }
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Passkey removed", "twoFactorEnabled": still_enabled }),
    )))
}

/// Frees the credential IDs of removed credentials for registration again.
/// The removal is done: a store failure here is logged, not answered.
pub fn release_claims(ctx: &mut Ctx, removed: &[WebauthnCredential]) {
    for c in removed {
        if ctx
            .env
            .store
            .delete(&credential_claim_key(&c.credential_id))
            .is_err()
        {
            ctx.log(format!(
                "passkey claim wacid:{} not released (store unavailable)",
                c.credential_id
            ));
        }
    }
}

/// The stored credential of `user` with credential ID `raw_id`.
pub fn find<'u>(user: &'u UserRecord, raw_id: &[u8]) -> Option<&'u WebauthnCredential> {
    user.webauthn
        .iter()
        .find(|c| b64url_decode(&c.credential_id).as_deref() == Some(raw_id))
}

// ---------------------------------------------------------------------------
// Second step of a login

/// The request options of an assertion for `user` (JSON form, for
/// `PublicKeyCredential.parseRequestOptionsFromJSON`).
fn request_options(ctx: &Ctx, challenge: &str, allow: Vec<Value>, uv: &str) -> Value {
    json!({
        "challenge": challenge,
        "timeout": CHALLENGE_MS,
        "rpId": ctx.config.webauthn_rp_id,
        "allowCredentials": allow,
        "userVerification": uv,
    })
}

/// `POST /2fa/webauthn/options` `{ tempToken }`.
pub fn login_options(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::PASSKEY, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "tempToken")?;
    let claims = crate::api::mfa::temp_claims(ctx, &token)?;
    let user: UserRecord = records::load(ctx.env.store, &records::user_key(&claims.sub))?
        .ok_or(ApiError::InvalidTempToken)?;
    if user.webauthn.is_empty() {
        return Err(ApiError::NoMethod);
    }
    let challenge = issue_challenge(ctx, "login", Some(&user.id), false)?;
    let options = request_options(ctx, &challenge, descriptors(&user), "preferred");
    Ok(Outcome::Done(web::ok(200, options)))
}

/// Verifies an assertion of `user` against the challenge it names, spending
/// the challenge; on a counter regression writes the audit record
/// `webauthn_counter_regression`. Returns the credential's service id and
/// the verified assertion.
pub fn check_assertion(
    ctx: &mut Ctx,
    user: &UserRecord,
    credential: &Value,
    purpose: &str,
    challenge_user: Option<&str>,
    user_handle_required: bool,
) -> Result<(String, wa::Assertion), ApiError> {
    let response = wa::AuthenticationResponse::from_json(credential).map_err(|e| refused(&e))?;
    let (challenge, record) =
        spend_challenge(ctx, &response.client_data_json, purpose, challenge_user)?;
    let stored = find(user, &response.raw_id).ok_or_else(|| {
        refused(&WebauthnError::CredentialMismatch(
            "the credential is not one of this user's passkeys",
        ))
    })?;
    let public_key = b64url_decode(&stored.public_key).ok_or(ApiError::Internal)?;
    let raw_id = b64url_decode(&stored.credential_id).ok_or(ApiError::Internal)?;
    let rp = relying_party(ctx);
    let result = wa::verify_authentication(
        &rp,
        &response,
        &Expected {
            challenge: &challenge,
            user_verification: record.user_verification,
        },
        &wa::StoredCredential {
            credential_id: &raw_id,
            public_key: &public_key,
            sign_count: stored.sign_count,
            backup_eligible: stored.backup_eligible,
            user_handle: user.id.as_bytes(),
        },
        user_handle_required,
    );
    match result {
        Ok(a) => Ok((stored.id.clone(), a)),
        Err(e) => {
            if let WebauthnError::CounterRegression {
                stored: s,
                received,
            } = e
            {
                ctx.audit(
                    Some(&user.id),
                    "webauthn_counter_regression",
                    false,
                    json!({ "credentialId": stored.id, "storedCount": s, "receivedCount": received }),
                );
            }
            Err(refused(&e))
        }
    }
}

/// `POST /2fa/verify-webauthn` `{ tempToken, credential, trustDevice?,
/// deviceName? }`: the same answer as `/2fa/verify`.
pub fn verify_login(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    use crate::api::mfa;
    ctx.limit(ratelimit::PASSKEY, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "tempToken")?;
    let credential = body
        .get("credential")
        .filter(|v| v.is_object())
        .ok_or_else(|| ApiError::validation("credential must be an object"))?
        .clone();
    let trust = web::opt_bool(&body, "trustDevice")?;
    let name = crate::api::devices::clean_name(web::opt_str(&body, "deviceName")?)?;
    let (claims, user) = mfa::begin(ctx, &token)?;
    if user.webauthn.is_empty() {
        return Err(ApiError::NoMethod);
    }
    let (id, assertion) =
        match check_assertion(ctx, &user, &credential, "login", Some(&user.id), false) {
            Ok(v) => v,
            Err(e) => {
                if matches!(e, ApiError::Validation(_) | ApiError::PasskeyChallenge) {
                    mfa::record_failure(ctx, &user.id, "webauthn")?;
                }
                return Err(e);
            }
        };
    let (tokens, _) = mfa::exchange(
        ctx,
        &claims,
        &user,
        mfa::Spend::Passkey {
            key: if assertion_be(&user, &id) {
                "swk"
            } else {
                "hwk"
            },
            id: id.clone(),
            sign_count: assertion.sign_count,
            backed_up: assertion.backed_up,
        },
    )?;
    Ok(mfa::verified(
        ctx,
        &user,
        &tokens,
        trust,
        name,
        json!({ "method": "webauthn", "credentialId": id, "trustDevice": trust }),
    ))
}

// ---------------------------------------------------------------------------
// Passwordless sign-in with a discoverable credential

/// `POST /auth/passkey/options` (no authentication; limited per IP):
/// request options without `allowCredentials` (the authenticator offers
/// its discoverable credentials) and with user verification required.
pub fn passkey_options(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::PASSKEY, &ctx.ip.clone())?;
    let challenge = issue_challenge(ctx, "passkey", None, true)?;
    let options = request_options(ctx, &challenge, Vec::new(), "required");
    Ok(Outcome::Done(web::ok(200, options)))
}

/// `POST /auth/passkey/verify` `{ credential }`: the user is the one the
/// credential's `userHandle` names; UV is required; the answer is a full
/// session that counts as multi-factor (as `/2fa/verify`'s).
pub fn passkey_verify(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::PASSKEY, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let credential = body
        .get("credential")
        .filter(|v| v.is_object())
        .ok_or_else(|| ApiError::validation("credential must be an object"))?
        .clone();
    let response = wa::AuthenticationResponse::from_json(&credential).map_err(|e| refused(&e))?;
    let unknown = || {
        refused(&WebauthnError::CredentialMismatch(
            "the credential is not registered",
        ))
    };
    let user_id = response
        .user_handle
        .as_deref()
        .and_then(|h| std::str::from_utf8(h).ok())
        .filter(|id| util::is_uuid(id))
        .ok_or_else(|| {
            refused(&WebauthnError::Malformed(
                "credential.response.userHandle is required (discoverable credential)".into(),
            ))
        })?
        .to_string();
    let Some(user) = records::load::<UserRecord>(ctx.env.store, &records::user_key(&user_id))?
    else {
        // Spend the challenge all the same: one try per challenge.
        let _ = spend_challenge(ctx, &response.client_data_json, "passkey", None);
        return Err(unknown());
    };
    let (id, assertion) = check_assertion(ctx, &user, &credential, "passkey", None, true)?;
    let now = ctx.now_ms();
    records::update(
        ctx.env,
        &records::user_key(&user_id),
        |u: &mut UserRecord| {
            let c = u
                .webauthn
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or_else(unknown)?;
            if c.sign_count != 0
                && assertion.sign_count != 0
                && assertion.sign_count <= c.sign_count
            {
                return Err(ApiError::PasskeyChallenge);
            }
            c.sign_count = c.sign_count.max(assertion.sign_count);
            c.backed_up = assertion.backed_up;
            c.last_used_ms = Some(now);
            Ok(())
        },
    )?
    .ok_or_else(unknown)?;
    let key = if assertion_be(&user, &id) {
        "swk"
    } else {
        "hwk"
    };
    // UV was required: possession plus the authenticator's PIN or
    // biometric, so the session counts as multi-factor.
    let amr: &[&str] = &[key, "mfa"];
    crate::api::users::finish_login(
        ctx,
        &user,
        true,
        amr,
        json!({ "method": "webauthn", "passwordless": true, "credentialId": id }),
    )
}

/// Whether the credential `id` of `user` is backup eligible (a synced
/// passkey: `swk` in `amr`; otherwise a device-bound key: `hwk`).
fn assertion_be(user: &UserRecord, id: &str) -> bool {
    user.webauthn
        .iter()
        .any(|c| c.id == id && c.backup_eligible)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn keys_keep_their_spelling() {
        assert_eq!(challenge_key("c-_1"), "wach:c-_1");
        assert_eq!(challenge_use_key("c-_1"), "wachu:c-_1");
        assert_eq!(credential_claim_key("AQID"), "wacid:AQID");
    }
}
