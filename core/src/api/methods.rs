//! The list of second-factor methods and removal of one by id.

use serde_json::{json, Value};

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, MethodRecord, UserRecord};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

fn method_json(m: &MethodRecord) -> Value {
    let mut v = json!({
        "id": m.id,
        "type": m.kind,
        "enabled": m.enabled,
        "verifiedAt": iso8601(m.verified_ms),
        "createdAt": iso8601(m.created_ms),
    });
    if let Some(p) = &m.phone {
        v["phoneNumber"] = json!(web::mask_phone(p));
    }
    if let Some(e) = &m.email {
        v["email"] = json!(web::mask_email(e));
    }
    v
}

fn method_json_of(u: &UserRecord, m: &MethodRecord) -> Value {
    let mut v = method_json(m);
    if m.kind == "webauthn" {
        v["credentialCount"] = json!(u.webauthn.len());
    }
    v
}

/// `GET /2fa/methods`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:read"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    let methods: Vec<Value> = auth
        .user
        .methods
        .iter()
        .map(|m| method_json_of(&auth.user, m))
        .collect();
    Ok(Outcome::Done(web::ok(200, json!({ "methods": methods }))))
}

/// `DELETE /2fa/methods/{methodId}`: refused for the last method while 2FA
/// is enabled.
pub fn delete(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    let auth = sessions::authenticate(ctx, Access::Scope("2fa:write"))?;
    ctx.limit(ratelimit::OTHER_2FA, &auth.user.id)?;
    if !util::is_uuid(id) {
        return Err(ApiError::NotFound);
    }
    let now = ctx.now_ms();
    let (kind, removed) = records::update(
        ctx.env,
        &records::user_key(&auth.user.id),
        |u: &mut UserRecord| {
            let m = u
                .methods
                .iter()
                .find(|m| m.id == id)
                .ok_or(ApiError::NotFound)?;
            let kind = m.kind.clone();
            let enabled = u.methods.iter().filter(|m| m.enabled).count();
            if u.two_factor_enabled && m.enabled && enabled <= 1 {
                return Err(ApiError::LastMethod);
            }
            u.methods.retain(|m| m.id != id);
            if kind == "totp" {
                u.totp_last_step = None;
            }
            // The webauthn method is all of the user's passkeys.
            let removed = if kind == "webauthn" {
                std::mem::take(&mut u.webauthn)
            } else {
                Vec::new()
            };
            u.refresh_two_factor();
            u.updated_ms = now;
            Ok((kind, removed))
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    crate::api::webauthn::release_claims(ctx, &removed);
    ctx.audit(
        Some(&auth.user.id),
        "2fa_disabled",
        true,
        json!({ "method": kind }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "2FA method removed" }),
    )))
}
