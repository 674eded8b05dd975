//! Sessions: creation at login, the check behind every authenticated request,
//! refresh with rotation and reuse detection, logout, revocation, listing.
//!
//! A session is the record `sess:{sid}`; an access token names it in `sid`
//! and is accepted only while the record exists, so logout and revocation take
//! effect at once. The refresh token carries the session's current `jti`;
//! refresh swaps in a new one with a locked update ([`records::update`]). Presenting a rotated-out
//! refresh token deletes the session (reuse detection).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::contract::error::ApiError;
use crate::crypto::tokens::{Extra, TokenKind};
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, Ref, UserRecord};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub id: String,
    pub user_id: String,
    /// The `jti` of the only refresh token currently valid.
    pub jti: String,
    /// A second factor was passed (or a trusted device used).
    pub mfa: bool,
    /// How the user signed in (RFC 8176 values), carried into every access
    /// token of the session as `amr`.
    #[serde(default)]
    pub amr: Vec<String>,
    pub ip_address: String,
    pub user_agent: String,
    pub created_ms: u64,
    pub last_used_ms: u64,
    pub exp_ms: u64,
}

/// An authenticated caller: a user, through a session (bearer token) or an
/// API key.
pub struct Auth {
    /// The user (the key's owner for an API key).
    pub user: UserRecord,
    /// The session, when authenticated by an access token.
    pub session: Option<SessionRecord>,
    /// The key's id, when authenticated by an API key.
    pub key_id: Option<String>,
}

/// What an endpoint accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only a session (bearer access token); an API key is refused.
    Session,
    /// A session, or an API key holding this scope (or `*`).
    Scope(&'static str),
}

/// Tokens of a new or refreshed session.
pub struct Tokens {
    /// Access token.
    pub access: String,
    /// Refresh token.
    pub refresh: String,
}

fn key(sid: &str) -> String {
    util::key(&["sess:", sid])
}

const REFRESH_MS: u64 = 7 * 24 * 3600 * 1000;

/// Live sessions one user may hold. Linking one more ends the oldest
/// (by creation) beyond this number, as Google does with an account's
/// refresh tokens: without a cap a client that logs in again and again
/// without logging out grows the user record, which every authenticated
/// request reads, and `GET /auth/sessions` without bound.
pub const MAX_SESSIONS: usize = 100;

/// Creates a session for `user` and issues its tokens; sets the refresh
/// cookie.
pub fn create(ctx: &mut Ctx, user_id: &str, mfa: bool) -> Result<Tokens, ApiError> {
    let amr = if mfa {
        &["pwd", "mfa"][..]
    } else {
        &["pwd"][..]
    };
    create_amr(ctx, user_id, mfa, amr)
}

/// [`create`] with the authentication methods of the sign-in (`amr`).
pub fn create_amr(
    ctx: &mut Ctx,
    user_id: &str,
    mfa: bool,
    amr: &[&str],
) -> Result<Tokens, ApiError> {
    let keys = ctx.keys()?;
    let record = prepare_amr(ctx, user_id, mfa, amr)?;
    let now = ctx.now_ms();
    let linked = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| Ok(link(u, &record, now)),
    )?;
    let Some(over) = linked else {
        ctx.env.store.delete(&key(&record.id))?;
        return Err(ApiError::InvalidToken);
    };
    evict(ctx, user_id, &over);
    Ok(issue(ctx, &keys, &record))
}

/// The first half of [`create`]: stores the record of a new session (and
/// schedules its removal) without linking it to the user or issuing
/// tokens. Until a caller [`link`]s it in the user record and issues its
/// tokens, nobody can use it: its id is random and no token names it. Lets a
/// caller link the session in the same locked update that consumes a
/// second factor, so that a code is never spent without a session.
pub fn prepare(ctx: &mut Ctx, user_id: &str, mfa: bool) -> Result<SessionRecord, ApiError> {
    let amr = if mfa {
        &["pwd", "mfa"][..]
    } else {
        &["pwd"][..]
    };
    prepare_amr(ctx, user_id, mfa, amr)
}

/// [`prepare`] with the authentication methods of the sign-in.
pub fn prepare_amr(
    ctx: &mut Ctx,
    user_id: &str,
    mfa: bool,
    amr: &[&str],
) -> Result<SessionRecord, ApiError> {
    let now = ctx.now_ms();
    let sid = ctx.uuid();
    let jti = util::random_hex(ctx.env, 16);
    let exp_ms = now.checked_add(REFRESH_MS).ok_or(ApiError::Internal)?;
    let record = SessionRecord {
        id: sid.clone(),
        user_id: user_id.to_string(),
        jti,
        mfa,
        amr: amr.iter().map(|m| m.to_string()).collect(),
        ip_address: ctx.ip.clone(),
        user_agent: ctx.ua.clone(),
        created_ms: now,
        last_used_ms: now,
        exp_ms,
    };
    let key = key(&sid);
    records::save(ctx.env.store, &key, &record)?;
    ctx.expire(Expiry::record(&key, exp_ms));
    Ok(record)
}

/// Links a [`prepare`]d session to its user (inside a locked update).
/// Returns the oldest sessions beyond [`MAX_SESSIONS`], still linked: the
/// caller hands them to [`evict`] once the update is stored. A reference
/// leaves the user record only after its session record is gone, so a
/// session is never both usable and missing from the list that
/// `POST /auth/revoke-sessions` ends.
#[must_use = "sessions beyond MAX_SESSIONS are ended by evict"]
pub fn link(u: &mut UserRecord, record: &SessionRecord, now_ms: u64) -> Vec<Ref> {
    u.prune(now_ms);
    u.sessions.push(Ref {
        id: record.id.clone(),
        exp_ms: record.exp_ms,
    });
    let over = u.sessions.len().saturating_sub(MAX_SESSIONS);
    u.sessions[..over].to_vec()
}

/// Ends the sessions [`link`] found beyond [`MAX_SESSIONS`]: deletes each
/// record, then drops the deleted ones from the user record. Runs after a
/// session has been issued, so nothing here is an error for the caller: a
/// store failure is logged and the sessions stay linked (revocable, listed)
/// until the user's next sign-in ends them.
pub fn evict(ctx: &mut Ctx, user_id: &str, over: &[Ref]) {
    let ended = end_linked(
        ctx,
        user_id,
        over,
        key,
        |u| &mut u.sessions,
        ("session", MAX_SESSIONS),
    );
    if ended.is_empty() {
        return;
    }
    ctx.audit(
        Some(user_id),
        "sessions_revoked",
        true,
        json!({ "reason": "session_limit", "revokedCount": ended.len(), "sessionIds": ended }),
    );
}

/// Ends records a user's list links beyond its limit (sessions, trusted
/// devices): deletes each record (`key` of its id), then drops the deleted
/// ones from the list that `list` picks in the user record. The ids ended;
/// store failures are logged (`noun` names the kind, `limit` its limit),
/// never errors: what could not be deleted stays linked, so still listed
/// and removable.
pub(crate) fn end_linked(
    ctx: &mut Ctx,
    user_id: &str,
    over: &[Ref],
    key: fn(&str) -> String,
    list: fn(&mut UserRecord) -> &mut Vec<Ref>,
    (noun, limit): (&str, usize),
) -> Vec<String> {
    let mut ended = Vec::with_capacity(over.len());
    for r in over {
        match records::remove(ctx.env, &key(&r.id)) {
            Ok(()) => ended.push(r.id.clone()),
            Err(_) => ctx.log(format!(
                "{noun} {} beyond the limit of {limit} not ended (store unavailable)",
                r.id
            )),
        }
    }
    if ended.is_empty() {
        return ended;
    }
    let now = ctx.now_ms();
    let unlinked = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            list(u).retain(|r| !ended.contains(&r.id));
            Ok(())
        },
    );
    if unlinked.is_err() {
        ctx.log(format!(
            "ended {noun}s of user {user_id} still listed (store unavailable)"
        ));
    }
    ended
}

/// Removes a [`prepare`]d session that was never linked, as far as the store
/// allows (otherwise housekeeping removes it when it expires).
pub fn discard(ctx: &mut Ctx, record: &SessionRecord) {
    if ctx.env.store.delete(&key(&record.id)).is_err() {
        ctx.log(format!(
            "session {} was prepared but not linked; housekeeping removes it",
            record.id
        ));
    }
}

/// The access and refresh tokens of session `s`; sets the refresh cookie.
pub fn issue(ctx: &mut Ctx, keys: &crate::plumbing::secrets::Keys, s: &SessionRecord) -> Tokens {
    let now = ctx.now_secs();
    let access = keys.tokens.issue(
        TokenKind::Access,
        &s.user_id,
        Extra {
            sid: Some(s.id.clone()),
            mfa: Some(s.mfa),
            amr: (!s.amr.is_empty()).then(|| s.amr.clone()),
            ..Extra::default()
        },
        now,
    );
    let refresh = keys.tokens.issue(
        TokenKind::Refresh,
        &s.user_id,
        Extra {
            sid: Some(s.id.clone()),
            jti: Some(s.jti.clone()),
            ..Extra::default()
        },
        now,
    );
    ctx.header("Set-Cookie", web::refresh_cookie(ctx.config, &refresh));
    ctx.user_id = Some(s.user_id.clone());
    Tokens { access, refresh }
}

/// Loads a live session.
pub fn load(ctx: &mut Ctx, sid: &str) -> Result<Option<SessionRecord>, ApiError> {
    if !util::is_uuid(sid) {
        return Ok(None);
    }
    let s: Option<SessionRecord> = records::load(ctx.env.store, &key(sid))?;
    Ok(s.filter(|s| s.exp_ms > ctx.env.now_ms))
}

/// The check behind every authenticated endpoint: a valid access token
/// whose session and user still exist, or (where `access` allows it) an
/// API key with the scope.
pub fn authenticate(ctx: &mut Ctx, access: Access) -> Result<Auth, ApiError> {
    if let Some(key) = crate::api::apikeys::presented(ctx.req) {
        let Access::Scope(scope) = access else {
            return Err(ApiError::InvalidToken);
        };
        let key = key.to_string();
        return crate::api::apikeys::authenticate(ctx, &key, scope);
    }
    let token = web::bearer(ctx.req)
        .ok_or(ApiError::InvalidToken)?
        .to_string();
    let keys = ctx.keys()?;
    let claims = keys
        .tokens
        .verify(TokenKind::Access, &token, ctx.now_secs())
        .map_err(|_| ApiError::InvalidToken)?;
    let sid = claims.sid.unwrap_or_default();
    let session = load(ctx, &sid)?
        .filter(|s| s.user_id == claims.sub)
        .ok_or(ApiError::InvalidToken)?;
    let user: UserRecord = records::load(ctx.env.store, &records::user_key(&claims.sub))?
        .ok_or(ApiError::InvalidToken)?;
    let now = ctx.now_ms();
    let session = if now.saturating_sub(session.last_used_ms) >= 60_000 {
        records::update(ctx.env, &key(&sid), |s: &mut SessionRecord| {
            s.last_used_ms = now;
            Ok(s.clone())
        })?
        .ok_or(ApiError::InvalidToken)?
    } else {
        session
    };
    ctx.user_id = Some(user.id.clone());
    Ok(Auth {
        user,
        session: Some(session),
        key_id: None,
    })
}

/// [`authenticate`] for endpoints that need a session; returns it.
pub fn authenticate_session(ctx: &mut Ctx) -> Result<(UserRecord, SessionRecord), ApiError> {
    let auth = authenticate(ctx, Access::Session)?;
    let session = auth.session.ok_or(ApiError::InvalidToken)?;
    Ok((auth.user, session))
}

/// Deletes session `sid` of `user_id` (record and the user's reference).
pub fn end(ctx: &mut Ctx, user_id: &str, sid: &str) -> Result<(), ApiError> {
    records::remove(ctx.env, &key(sid))?;
    let now = ctx.now_ms();
    records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            u.sessions.retain(|r| r.id != sid);
            Ok(())
        },
    )?;
    Ok(())
}

/// `POST /auth/refresh`.
pub fn refresh(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let body = web::parse_body(ctx.req)?;
    let (token, from_cookie) = match web::cookie(ctx.req, web::REFRESH_COOKIE) {
        Some(t) => (t, true),
        None => (
            web::opt_str(&body, "refreshToken")?.unwrap_or_default(),
            false,
        ),
    };
    if from_cookie {
        web::check_csrf(ctx.req, ctx.config)?;
    }
    let keys = ctx.keys()?;
    let claims = keys
        .tokens
        .verify(TokenKind::Refresh, &token, ctx.now_secs())
        .ok();
    let subject = claims
        .as_ref()
        .map(|c| c.sub.clone())
        .unwrap_or_else(|| ctx.ip.clone());
    ctx.limit(ratelimit::REFRESH, &subject)?;
    let claims = claims.ok_or(ApiError::InvalidRefreshToken)?;
    let sid = claims.sid.clone().unwrap_or_default();
    let presented = claims.jti.clone().unwrap_or_default();
    let Some(current) = load(ctx, &sid)? else {
        return Err(ApiError::InvalidRefreshToken);
    };
    if current.user_id != claims.sub {
        return Err(ApiError::InvalidRefreshToken);
    }
    let new_jti = util::random_hex(ctx.env, 16);
    let now = ctx.now_ms();
    let exp_ms = now.checked_add(REFRESH_MS).ok_or(ApiError::Internal)?;
    // Everything that can fail comes before the rotation: once the new jti
    // is stored, only its tokens remain to be issued (no store access), so
    // a failing store can never leave a rotated session whose new refresh
    // token the client did not get (its old one would then count as reuse
    // and end the session). Asking for a later sweep (filed after the
    // response, failed or not) and extending the user's reference first is
    // harmless if the rotation then does not happen.
    ctx.expire(Expiry::record(&key(&sid), exp_ms));
    records::update(
        ctx.env,
        &records::user_key(&claims.sub),
        |u: &mut UserRecord| {
            for r in u.sessions.iter_mut().filter(|r| r.id == sid) {
                r.exp_ms = r.exp_ms.max(exp_ms);
            }
            Ok(())
        },
    )?;
    let rotated = records::update(ctx.env, &key(&sid), |s: &mut SessionRecord| {
        if !crate::crypto::codes::ct_eq(s.jti.as_bytes(), presented.as_bytes()) {
            return Ok(None);
        }
        s.jti = new_jti.clone();
        s.last_used_ms = now;
        s.exp_ms = exp_ms;
        Ok(Some(s.clone()))
    })?
    .flatten();
    let Some(session) = rotated else {
        // An old refresh token: someone replayed it. End the whole session.
        end(ctx, &claims.sub, &sid)?;
        ctx.audit(
            Some(&claims.sub),
            "sessions_revoked",
            true,
            json!({ "reason": "refresh_token_reuse", "sessionId": sid }),
        );
        return Err(ApiError::InvalidRefreshToken);
    };
    let tokens = issue(ctx, &keys, &session);
    ctx.audit(
        Some(&claims.sub),
        "token_refreshed",
        true,
        json!({ "sessionId": sid }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "accessToken": tokens.access, "refreshToken": tokens.refresh }),
    )))
}

/// `POST /auth/logout`: by bearer token, or by the refresh cookie (CSRF
/// checked) when no bearer token is sent.
pub fn logout(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user_id, sid) =
        if web::bearer(ctx.req).is_some() || crate::api::apikeys::presented(ctx.req).is_some() {
            let (user, session) = authenticate_session(ctx)?;
            (user.id, session.id)
        } else {
            let token = web::cookie(ctx.req, web::REFRESH_COOKIE).ok_or(ApiError::InvalidToken)?;
            web::check_csrf(ctx.req, ctx.config)?;
            let keys = ctx.keys()?;
            let claims = keys
                .tokens
                .verify(TokenKind::Refresh, &token, ctx.now_secs())
                .map_err(|_| ApiError::InvalidToken)?;
            (claims.sub, claims.sid.unwrap_or_default())
        };
    end(ctx, &user_id, &sid)?;
    ctx.header("Set-Cookie", web::clear_refresh_cookie(ctx.config));
    ctx.audit(Some(&user_id), "logout", true, json!({ "sessionId": sid }));
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Logged out successfully" }),
    )))
}

/// Ends every session of `user_id`; returns how many there were.
pub fn end_all(ctx: &mut Ctx, user_id: &str) -> Result<usize, ApiError> {
    let now = ctx.now_ms();
    let sids = records::update(
        ctx.env,
        &records::user_key(user_id),
        |u: &mut UserRecord| {
            u.prune(now);
            Ok(std::mem::take(&mut u.sessions))
        },
    )?
    .unwrap_or_default();
    for r in &sids {
        records::remove(ctx.env, &key(&r.id))?;
    }
    Ok(sids.len())
}

/// `POST /auth/revoke-sessions`.
pub fn revoke_all(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = authenticate_session(ctx)?;
    let n = end_all(ctx, &user.id)?;
    ctx.header("Set-Cookie", web::clear_refresh_cookie(ctx.config));
    ctx.audit(
        Some(&user.id),
        "sessions_revoked",
        true,
        json!({ "revokedCount": n }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "All sessions revoked", "revokedCount": n }),
    )))
}

fn session_json(s: &SessionRecord, current: &str) -> Value {
    json!({
        "id": s.id,
        "ipAddress": s.ip_address,
        "userAgent": s.user_agent,
        "createdAt": iso8601(s.created_ms),
        "lastUsedAt": iso8601(s.last_used_ms),
        "expiresAt": iso8601(s.exp_ms),
        "current": s.id == current,
    })
}

/// `GET /auth/sessions`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let auth = authenticate(ctx, Access::Scope("user:read"))?;
    let current = auth
        .session
        .as_ref()
        .map(|s| s.id.clone())
        .unwrap_or_default();
    let keys: Vec<String> = auth.user.sessions.iter().map(|r| key(&r.id)).collect();
    let now = ctx.now_ms();
    let mut sessions = Vec::new();
    for s in records::load_each::<SessionRecord>(ctx.env.store, &keys)? {
        if s.exp_ms > now && s.user_id == auth.user.id {
            sessions.push(s);
        }
    }
    sessions.sort_by_key(|s| std::cmp::Reverse(s.created_ms));
    let list: Vec<Value> = sessions.iter().map(|s| session_json(s, &current)).collect();
    Ok(Outcome::Done(web::ok(200, json!({ "sessions": list }))))
}

/// `DELETE /auth/sessions/{sessionId}`.
pub fn delete(ctx: &mut Ctx, sid: &str) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = authenticate_session(ctx)?;
    let auth = Auth {
        user,
        session: None,
        key_id: None,
    };
    let target = load(ctx, sid)?.filter(|s| s.user_id == auth.user.id);
    if target.is_none() {
        return Err(ApiError::NotFound);
    }
    end(ctx, &auth.user.id, sid)?;
    ctx.audit(
        Some(&auth.user.id),
        "sessions_revoked",
        true,
        json!({ "sessionId": sid }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "Session revoked" }),
    )))
}

/// `POST /auth/introspect` (RFC 7662 style, for gateways): needs an API key
/// with `auth:introspect` (or a session); limited per key. `active` is false
/// for any token that is invalid, expired, of another kind, or whose session
/// has ended.
pub fn introspect(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let auth = authenticate(ctx, Access::Scope("auth:introspect"))?;
    let subject = auth.key_id.clone().unwrap_or_else(|| auth.user.id.clone());
    ctx.limit(ratelimit::INTROSPECT, &subject)?;
    let body = web::parse_body(ctx.req)?;
    let token = web::req_str(&body, "token")?;
    let keys = ctx.keys()?;
    let inactive = || Ok(Outcome::Done(web::ok(200, json!({ "active": false }))));
    let Ok(claims) = keys
        .tokens
        .verify(TokenKind::Access, &token, ctx.now_secs())
    else {
        return inactive();
    };
    let sid = claims.sid.clone().unwrap_or_default();
    match load(ctx, &sid)? {
        Some(s) if s.user_id == claims.sub => Ok(Outcome::Done(web::ok(
            200,
            json!({
                "active": true,
                "sub": claims.sub,
                "sid": sid,
                "mfa": claims.mfa.unwrap_or(false),
                "amr": claims.amr.clone().unwrap_or_default(),
                "exp": claims.exp,
                "iat": claims.iat,
                "tokenType": "access",
            }),
        ))),
        _ => inactive(),
    }
}
