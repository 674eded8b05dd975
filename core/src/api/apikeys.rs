//! API keys for service-to-service calls: create, list, rotate, revoke, and
//! authentication by key with scopes.
//!
//! A key is `tfa_` + 40 base62 characters, shown once. The store keeps only
//! its keyed hash (HMAC-SHA-256 under a key derived from a server secret) in
//! `apikey:{id}`, found through its 12-character prefix (`apikeyp:{prefix}`).
//! A key acts as its owner, limited to its scopes; managing keys needs a
//! session, never a key.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::sessions::{self, Auth};
use crate::contract::error::ApiError;
use crate::contract::http::Request;
use crate::crypto::codes;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, UserRecord};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

/// Every scope a key may hold.
pub const SCOPES: &[&str] = &[
    "*",
    "user:read",
    "2fa:read",
    "2fa:write",
    "webhooks:read",
    "webhooks:write",
    "audit:read",
    "auth:introspect",
];
/// Keys one user may hold.
pub const MAX_KEYS_PER_USER: usize = 20;
const PREFIX_LEN: usize = 12;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A key as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyRecord {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub scopes: Vec<String>,
    pub prefix: String,
    pub hash: String,
    pub created_ms: u64,
    #[serde(default)]
    pub expires_ms: Option<u64>,
    #[serde(default)]
    pub last_used_ms: Option<u64>,
}

fn key(id: &str) -> String {
    util::key(&["apikey:", id])
}

/// The index from a key's public prefix to its id, `apikeyp:{prefix}`.
fn prefix_key(prefix: &str) -> String {
    util::key(&["apikeyp:", prefix])
}

/// The key a request presents, if any: `X-API-Key`, or a bearer token that
/// starts with `tfa_`.
pub fn presented(req: &Request) -> Option<&str> {
    if let Some(k) = req.header_value("x-api-key") {
        return Some(k.trim());
    }
    web::bearer(req).filter(|t| t.starts_with("tfa_"))
}

fn hash_of(ctx: &mut Ctx, secret: &str) -> Result<String, ApiError> {
    let k = codes::derive_key(ctx.keys()?.backup().as_slice(), "api-keys");
    Ok(codes::keyed_hash(&k, "api-key", secret))
}

fn new_secret(ctx: &mut Ctx) -> String {
    let mut out = String::from("tfa_");
    while out.len() < 44 {
        let mut b = [0u8; 32];
        ctx.env.rng.fill(&mut b);
        for byte in b {
            // 248 = 4 * 62: reject the rest to stay uniform.
            if byte < 248 && out.len() < 44 {
                out.push(BASE62[(byte % 62) as usize] as char);
            }
        }
    }
    out
}

/// Authenticates `secret` for an endpoint that needs `scope`.
pub fn authenticate(ctx: &mut Ctx, secret: &str, scope: &'static str) -> Result<Auth, ApiError> {
    let well_formed = secret.len() == 44
        && secret.starts_with("tfa_")
        && secret[4..].bytes().all(|b| b.is_ascii_alphanumeric());
    if !well_formed {
        return Err(ApiError::InvalidToken);
    }
    let prefix = &secret[..PREFIX_LEN];
    let Some(id) = ctx.env.store.get(&prefix_key(prefix))? else {
        return Err(ApiError::InvalidToken);
    };
    let id = String::from_utf8(id).map_err(|_| ApiError::Internal)?;
    let record: ApiKeyRecord =
        records::load(ctx.env.store, &key(&id))?.ok_or(ApiError::InvalidToken)?;
    let hash = hash_of(ctx, secret)?;
    let now = ctx.now_ms();
    if !codes::ct_eq(hash.as_bytes(), record.hash.as_bytes())
        || record.prefix != prefix
        || record.expires_ms.is_some_and(|e| e <= now)
    {
        return Err(ApiError::InvalidToken);
    }
    if !record.scopes.iter().any(|s| s == "*" || s == scope) {
        return Err(ApiError::InsufficientScope(scope));
    }
    let user: UserRecord = records::load(ctx.env.store, &records::user_key(&record.user_id))?
        .ok_or(ApiError::InvalidToken)?;
    if record
        .last_used_ms
        .is_none_or(|t| now.saturating_sub(t) >= 60_000)
    {
        records::update(ctx.env, &key(&id), |k: &mut ApiKeyRecord| {
            k.last_used_ms = Some(now);
            Ok(())
        })?;
    }
    ctx.user_id = Some(user.id.clone());
    Ok(Auth {
        user,
        session: None,
        key_id: Some(record.id),
    })
}

fn view(k: &ApiKeyRecord) -> Value {
    json!({
        "id": k.id,
        "name": k.name,
        "scopes": k.scopes,
        "prefix": k.prefix,
        "createdAt": iso8601(k.created_ms),
        "expiresAt": k.expires_ms.map(iso8601),
        "lastUsedAt": k.last_used_ms.map(iso8601),
    })
}

fn parse_scopes(body: &web::Body) -> Result<Vec<String>, ApiError> {
    web::req_names(body, "scopes", SCOPES)
}

fn parse_name(body: &web::Body) -> Result<String, ApiError> {
    let name = web::req_str(body, "name")?;
    let name = name.trim();
    if name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "name must be at most 100 characters without control characters",
        ));
    }
    Ok(name.to_string())
}

fn parse_expiry(body: &web::Body, now: u64) -> Result<Option<u64>, ApiError> {
    match body.get("expiresInDays") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let days = v
                .as_u64()
                .filter(|d| (1..=3650).contains(d))
                .ok_or_else(|| {
                    ApiError::validation("expiresInDays must be a whole number from 1 to 3650")
                })?;
            Ok(Some(now.saturating_add(days * 86_400_000)))
        }
    }
}

fn created(record: &ApiKeyRecord, secret: &str, status: u16) -> Outcome {
    let mut data = view(record);
    data["apiKey"] = json!(secret);
    Outcome::Done(web::ok(status, data))
}

/// `POST /api-keys`.
pub fn create(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = sessions::authenticate_session(ctx)?;
    let body = web::parse_body(ctx.req)?;
    let name = parse_name(&body)?;
    let scopes = parse_scopes(&body)?;
    let now = ctx.now_ms();
    let expires_ms = parse_expiry(&body, now)?;
    if user.api_keys.len() >= MAX_KEYS_PER_USER {
        return Err(ApiError::validation(format!(
            "at most {MAX_KEYS_PER_USER} API keys per user"
        )));
    }
    let secret = new_secret(ctx);
    let record = ApiKeyRecord {
        id: ctx.uuid(),
        user_id: user.id.clone(),
        name,
        scopes,
        prefix: secret[..PREFIX_LEN].to_string(),
        hash: hash_of(ctx, &secret)?,
        created_ms: now,
        expires_ms,
        last_used_ms: None,
    };
    records::save(ctx.env.store, &key(&record.id), &record)?;
    ctx.env
        .store
        .set(&prefix_key(&record.prefix), record.id.as_bytes())?;
    records::update(
        ctx.env,
        &records::user_key(&user.id),
        |u: &mut UserRecord| {
            if u.api_keys.len() >= MAX_KEYS_PER_USER {
                return Err(ApiError::validation(format!(
                    "at most {MAX_KEYS_PER_USER} API keys per user"
                )));
            }
            u.api_keys.push(record.id.clone());
            Ok(())
        },
    )?
    .ok_or(ApiError::InvalidToken)?;
    ctx.audit(
        Some(&user.id),
        "api_key_created",
        true,
        json!({ "apiKeyId": record.id, "scopes": record.scopes }),
    );
    Ok(created(&record, &secret, 201))
}

fn owned(ctx: &mut Ctx, user: &UserRecord, id: &str) -> Result<ApiKeyRecord, ApiError> {
    if !util::is_uuid(id) || !user.api_keys.iter().any(|k| k == id) {
        return Err(ApiError::NotFound);
    }
    let k: ApiKeyRecord = records::load(ctx.env.store, &key(id))?.ok_or(ApiError::NotFound)?;
    if k.user_id != user.id {
        return Err(ApiError::NotFound);
    }
    Ok(k)
}

/// `GET /api-keys`.
pub fn list(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = sessions::authenticate_session(ctx)?;
    let keys: Vec<String> = user.api_keys.iter().map(|id| key(id)).collect();
    let list: Vec<Value> = records::load_each::<ApiKeyRecord>(ctx.env.store, &keys)?
        .into_iter()
        .filter(|k| k.user_id == user.id)
        .map(|k| view(&k))
        .collect();
    Ok(Outcome::Done(web::ok(200, json!({ "apiKeys": list }))))
}

/// `DELETE /api-keys/{id}`.
pub fn revoke(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = sessions::authenticate_session(ctx)?;
    let k = owned(ctx, &user, id)?;
    ctx.env.store.delete(&prefix_key(&k.prefix))?;
    records::remove(ctx.env, &key(id))?;
    records::update(
        ctx.env,
        &records::user_key(&user.id),
        |u: &mut UserRecord| {
            u.api_keys.retain(|x| x != id);
            Ok(())
        },
    )?;
    ctx.audit(
        Some(&user.id),
        "api_key_revoked",
        true,
        json!({ "apiKeyId": id }),
    );
    Ok(Outcome::Done(web::ok(
        200,
        json!({ "message": "API key revoked" }),
    )))
}

/// `POST /api-keys/{id}/rotate`: a new secret for the same key; the old one
/// stops working at once.
pub fn rotate(ctx: &mut Ctx, id: &str) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let (user, _) = sessions::authenticate_session(ctx)?;
    let old = owned(ctx, &user, id)?;
    let secret = new_secret(ctx);
    let prefix = secret[..PREFIX_LEN].to_string();
    let hash = hash_of(ctx, &secret)?;
    ctx.env.store.set(&prefix_key(&prefix), id.as_bytes())?;
    let record = records::update(ctx.env, &key(id), |k: &mut ApiKeyRecord| {
        k.prefix = prefix.clone();
        k.hash = hash.clone();
        k.last_used_ms = None;
        Ok(k.clone())
    })?
    .ok_or(ApiError::NotFound)?;
    ctx.env.store.delete(&prefix_key(&old.prefix))?;
    ctx.audit(
        Some(&user.id),
        "api_key_created",
        true,
        json!({ "apiKeyId": id, "rotated": true }),
    );
    Ok(created(&record, &secret, 200))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn keys_keep_their_spelling() {
        assert_eq!(key("k1"), "apikey:k1");
        assert_eq!(prefix_key("tfa_ab12"), "apikeyp:tfa_ab12");
    }
}
