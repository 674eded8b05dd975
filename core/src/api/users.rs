//! Users: registration, login (first factor, trusted-device skip), the
//! current-user read.
//!
//! Unique names are claimed with atomic increments (`claim:email:…`,
//! `claim:username:…`): the caller that gets 1 owns the name, so concurrent
//! registrations of one e-mail make exactly one user. Claims expire after
//! [`CLAIM_TTL_MS`] (a failed registration cannot block a name for ever);
//! the indexes `email:…` / `username:…` are the lasting record. Login does one Argon2
//! computation whether or not the user exists, and answers both cases with
//! the same status and message.

use serde_json::{json, Value};

use crate::api::sessions::{self, Access};
use crate::contract::error::ApiError;
use crate::crypto::password;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::housekeeping::{self, Expiry};
use crate::plumbing::ratelimit;
use crate::plumbing::records::{self, UserRecord};
use crate::plumbing::util::{self, iso8601};
use crate::plumbing::web;

/// Longest accepted e-mail address.
pub const MAX_EMAIL_LEN: usize = 254;

/// A syntactically valid, ASCII e-mail address (lower-cased), or the
/// validation error naming `field`.
pub fn normalize_email(input: &str, field: &str) -> Result<String, ApiError> {
    let bad = || ApiError::validation(format!("{field} must be a valid e-mail address"));
    let e = input.trim();
    if e.is_empty() || e.len() > MAX_EMAIL_LEN || !e.is_ascii() {
        return Err(bad());
    }
    let (local, domain) = e.rsplit_once('@').ok_or_else(bad)?;
    let local_ok = !local.is_empty()
        && local.len() <= 64
        && !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..")
        && local
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+/=?^_`{|}~.-".contains(c));
    let labels: Vec<&str> = domain.split('.').collect();
    let domain_ok = labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        && labels
            .last()
            .is_some_and(|tld| tld.len() >= 2 && tld.chars().all(|c| c.is_ascii_alphabetic()));
    if local_ok && domain_ok {
        Ok(e.to_ascii_lowercase())
    } else {
        Err(bad())
    }
}

/// The index from a normalised e-mail to its user's id, `email:{email}`.
fn email_key(email: &str) -> String {
    util::key(&["email:", email])
}

/// The index from a lower-cased username to its user's id,
/// `username:{name}`.
fn username_key(name_lower: &str) -> String {
    util::key(&["username:", name_lower])
}

fn check_username(u: &str) -> Result<(), ApiError> {
    let ok = (3..=30).contains(&u.len())
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::validation(
            "username must be 3-30 characters of letters, digits, _ or -",
        ))
    }
}

/// How long a name claim lives (see [`register`]).
pub const CLAIM_TTL_MS: u64 = 10 * 60 * 1000;

/// Releases name claims taken by a registration that did not finish.
fn release(ctx: &mut Ctx, claims: &[String]) {
    for c in claims {
        let _ = ctx.env.store.delete(c);
    }
}

/// `POST /auth/register`.
pub fn register(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::REGISTER, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let email_in = web::req_str(&body, "email")?;
    let username = web::req_str(&body, "username")?;
    let pw = web::req_str(&body, "password")?;
    let email = normalize_email(&email_in, "email")?;
    check_username(&username)?;
    password::check_rules(&pw).map_err(ApiError::Validation)?;
    // Fail on an unreachable store before any name is claimed.
    ctx.keys()?;

    let name_lower = username.to_ascii_lowercase();
    let email_claim = util::key(&["claim:email:", &email]);
    let name_claim = util::key(&["claim:username:", &name_lower]);
    // Claims are short-lived locks: scheduled for removal before they are
    // taken, so that one left behind by a registration whose store failed
    // (and whose release failed with it) frees the name after
    // CLAIM_TTL_MS. The lasting proof that a name is taken is its index
    // (`email:…`, `username:…`), checked once the claim is held.
    let claim_exp = ctx.now_ms().saturating_add(CLAIM_TTL_MS);
    // (Filed now, not after the response like other expiries: a claim left
    // unswept would keep its name taken.)
    housekeeping::schedule(ctx.env, &Expiry::counter(&email_claim, claim_exp))?;
    housekeeping::schedule(ctx.env, &Expiry::counter(&name_claim, claim_exp))?;
    if ctx.env.store.increment(&email_claim, 1)? != 1
        || ctx.env.store.get(&email_key(&email))?.is_some()
    {
        return Err(ApiError::EmailTaken);
    }
    match ctx.env.store.increment(&name_claim, 1) {
        Ok(1) => {}
        Ok(_) => {
            release(ctx, &[email_claim]);
            return Err(ApiError::UsernameTaken);
        }
        Err(e) => {
            release(ctx, &[email_claim]);
            return Err(e.into());
        }
    }
    match ctx.env.store.get(&username_key(&name_lower)) {
        Ok(None) => {}
        Ok(Some(_)) => {
            release(ctx, &[email_claim]);
            return Err(ApiError::UsernameTaken);
        }
        Err(e) => {
            release(ctx, &[email_claim, name_claim]);
            return Err(e.into());
        }
    }
    let claims = [email_claim, name_claim];
    let result = (|| {
        let salt: [u8; 16] = ctx.env.random();
        let hash = password::hash_password(&pw, &salt, &ctx.config.argon2)
            .map_err(|_| ApiError::validation("password must be at most 128 characters"))?;
        let now = ctx.now_ms();
        let user = UserRecord {
            id: ctx.uuid(),
            email: email.clone(),
            username: username.clone(),
            password_hash: hash,
            two_factor_enabled: false,
            created_ms: now,
            updated_ms: now,
            methods: vec![],
            sessions: vec![],
            devices: vec![],
            backup: None,
            totp_last_step: None,
            pending_totp: None,
            codes: vec![],
            api_keys: vec![],
            webhooks: vec![],
            webauthn: vec![],
        };
        records::save(ctx.env.store, &records::user_key(&user.id), &user)?;
        ctx.env.store.set(&email_key(&email), user.id.as_bytes())?;
        ctx.env
            .store
            .set(&username_key(&name_lower), user.id.as_bytes())?;
        Ok::<_, ApiError>(user)
    })();
    let user = match result {
        Ok(u) => u,
        Err(e) => {
            release(ctx, &claims);
            return Err(e);
        }
    };
    let tokens = sessions::create(ctx, &user.id, false)?;
    ctx.audit_of(&user, "register", true, json!({}));
    Ok(Outcome::Done(web::ok_with(
        201,
        &SignedIn::of(&tokens, &user),
    )))
}

/// The public view of a user (`id`, `email`, `username`,
/// `twoFactorEnabled`, `createdAt`, `updatedAt`), written straight from the
/// record: the fields are declared in the sorted order serde_json gives a
/// map's keys, so the bytes are those of the JSON tree the answers were
/// built as before (the tests keep that tree, `user_json`, to compare).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserView<'a> {
    created_at: String,
    email: &'a str,
    id: &'a str,
    two_factor_enabled: bool,
    updated_at: String,
    username: &'a str,
}

impl<'a> UserView<'a> {
    pub fn of(u: &'a UserRecord) -> Self {
        UserView {
            created_at: iso8601(u.created_ms),
            email: &u.email,
            id: &u.id,
            two_factor_enabled: u.two_factor_enabled,
            updated_at: iso8601(u.updated_ms),
            username: &u.username,
        }
    }
}

/// The data of an answer that signs a user in (register, login, the second
/// step): the session's tokens, the user, and where they apply a trusted
/// device's token and the backup codes left. Written without a JSON tree;
/// fields in serde_json's sorted key order, as [`UserView`].
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignedIn<'a> {
    pub access_token: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_token: Option<String>,
    pub refresh_token: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_codes: Option<usize>,
    pub user: UserView<'a>,
}

impl<'a> SignedIn<'a> {
    /// The tokens and the user, nothing else.
    pub fn of(tokens: &'a sessions::Tokens, user: &'a UserRecord) -> Self {
        SignedIn {
            access_token: &tokens.access,
            device_token: None,
            refresh_token: &tokens.refresh,
            remaining_codes: None,
            user: UserView::of(user),
        }
    }
}

/// Finds a user by e-mail (when the identifier has an `@`) or username.
pub fn find(ctx: &mut Ctx, identifier: &str) -> Result<Option<UserRecord>, ApiError> {
    let ident = identifier.trim().to_ascii_lowercase();
    if ident.is_empty() || ident.len() > MAX_EMAIL_LEN {
        return Ok(None);
    }
    let index = if ident.contains('@') {
        email_key(&ident)
    } else {
        username_key(&ident)
    };
    let Some(id) = ctx.env.store.get(&index)? else {
        return Ok(None);
    };
    let id = String::from_utf8(id).map_err(|_| ApiError::Internal)?;
    records::load(ctx.env.store, &records::user_key(&id))
}

/// `POST /auth/login`.
pub fn login(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::LOGIN, &ctx.ip.clone())?;
    let body = web::parse_body(ctx.req)?;
    let ident = web::req_str_any(&body, &["emailOrUsername", "email"])?;
    let pw = web::req_str(&body, "password")?;
    let device_token = match web::opt_str(&body, "deviceToken")? {
        Some(t) => Some(t),
        None => ctx.req.header_value("x-device-token").map(str::to_string),
    };
    ctx.keys()?;
    let user = find(ctx, &ident)?;
    let verified = match &user {
        Some(u) => password::verify_password(&pw, &u.password_hash),
        None => {
            password::dummy_verify(&pw, &ctx.config.argon2);
            false
        }
    };
    let user = match (user, verified) {
        (Some(u), true) => u,
        (u, _) => {
            let uid = u.as_ref().map(|u| u.id.clone());
            ctx.audit(
                uid.as_deref(),
                "login_failed",
                false,
                json!({ "reason": "invalid_credentials" }),
            );
            return Err(ApiError::InvalidCredentials);
        }
    };

    if user.two_factor_enabled {
        if let Some(token) = device_token {
            if crate::api::devices::trusted(ctx, &user, &token)? {
                return finish_login(ctx, &user, true, &["pwd"], json!({ "trustedDevice": true }));
            }
        }
        let temp = crate::api::mfa::issue_temp(ctx, &user.id)?;
        let mut methods: Vec<&str> = user.method_kinds();
        if user
            .backup
            .as_ref()
            .is_some_and(|b| b.codes.iter().any(|c| !c.used))
        {
            methods.push("backup");
        }
        ctx.audit(
            Some(&user.id),
            "login_success",
            true,
            json!({ "stage": "password", "requiresTwoFactor": true }),
        );
        return Ok(Outcome::Done(web::ok(
            200,
            json!({
                "requiresTwoFactor": true,
                "requires2FA": true,
                "tempToken": temp,
                "availableMethods": methods,
            }),
        )));
    }
    finish_login(ctx, &user, false, &["pwd"], json!({}))
}

/// Issues a session at the end of a login.
pub fn finish_login(
    ctx: &mut Ctx,
    user: &UserRecord,
    mfa: bool,
    amr: &[&str],
    details: Value,
) -> Result<Outcome, ApiError> {
    let tokens = sessions::create_amr(ctx, &user.id, mfa, amr)?;
    ctx.audit_of(user, "login_success", true, details);
    Ok(Outcome::Done(web::ok_with(
        200,
        &SignedIn::of(&tokens, user),
    )))
}

/// `GET /auth/me`'s data: [`UserView`]'s fields and the kinds of the user's
/// second factors (`methods`). Serialized straight from the record, without
/// a JSON tree built and dropped (this is the API's most frequent read);
/// the fields are declared in the sorted order serde_json gives a map's
/// keys, so `methods` falls between them and the struct repeats
/// `UserView`'s fields instead of embedding it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MeView<'a> {
    created_at: String,
    email: &'a str,
    id: &'a str,
    methods: Vec<&'static str>,
    two_factor_enabled: bool,
    updated_at: String,
    username: &'a str,
}

impl<'a> MeView<'a> {
    fn of(u: &'a UserRecord) -> Self {
        MeView {
            created_at: iso8601(u.created_ms),
            email: &u.email,
            id: &u.id,
            methods: u.method_kinds(),
            two_factor_enabled: u.two_factor_enabled,
            updated_at: iso8601(u.updated_ms),
            username: &u.username,
        }
    }
}

/// `GET /auth/me`.
pub fn me(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    ctx.limit(ratelimit::DEFAULT, &ctx.ip.clone())?;
    let auth = sessions::authenticate(ctx, Access::Scope("user:read"))?;
    Ok(Outcome::Done(web::ok_with(200, &MeView::of(&auth.user))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::records::MethodRecord;

    /// Index keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn index_keys_keep_their_spelling() {
        assert_eq!(email_key("carol@example.com"), "email:carol@example.com");
        assert_eq!(username_key("carol"), "username:carol");
    }

    /// The public view of a user as the JSON tree the answers were built
    /// as until they were written from the record: what [`UserView`] and
    /// [`MeView`] must give byte for byte.
    fn user_json(u: &UserRecord) -> Value {
        json!({
            "id": u.id,
            "email": u.email,
            "username": u.username,
            "twoFactorEnabled": u.two_factor_enabled,
            "createdAt": iso8601(u.created_ms),
            "updatedAt": iso8601(u.updated_ms),
        })
    }

    /// `GET /auth/me`'s bytes are what the JSON tree of `user_json` plus
    /// `methods` gave before it was written directly.
    #[test]
    fn me_view_writes_the_bytes_of_the_json_tree() {
        let mut user: UserRecord = serde_json::from_value(json!({
            "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            "email": "a.b+c@example.com",
            "username": "Zoë \"quoted\" \\ name",
            "passwordHash": "$argon2id$…",
            "twoFactorEnabled": false,
            "createdMs": 1_700_000_000_123u64,
            "updatedMs": 1_764_000_000_999u64,
        }))
        .unwrap();
        for methods in [vec![], vec!["totp"], vec!["email", "totp"]] {
            user.two_factor_enabled = !methods.is_empty();
            user.methods = methods
                .iter()
                .map(|k| {
                    serde_json::from_value::<MethodRecord>(json!({
                        "id": format!("m-{k}"), "kind": k, "enabled": true,
                        "verifiedMs": 1, "createdMs": 1,
                    }))
                    .unwrap()
                })
                .collect();
            let mut tree = user_json(&user);
            tree["methods"] = json!(user.method_kinds());
            let want = web::ok(200, tree).body;
            let got = web::ok_with(200, &MeView::of(&user)).body;
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }

    /// The answers that sign in write the bytes of the JSON trees they
    /// were built as before: tokens and user, with a device token and the
    /// backup codes left where they apply.
    #[test]
    fn signed_in_writes_the_bytes_of_the_json_tree() {
        let user: UserRecord = serde_json::from_value(json!({
            "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            "email": "a.b+c@example.com",
            "username": "Zoë \"quoted\" \\ name",
            "passwordHash": "$argon2id$…",
            "twoFactorEnabled": true,
            "createdMs": 1_700_000_000_123u64,
            "updatedMs": 1_764_000_000_999u64,
        }))
        .unwrap();
        let tokens = sessions::Tokens {
            access: "eyJ.access.sig".into(),
            refresh: "eyJ.refresh.sig".into(),
        };
        let tree = || json!({ "user": user_json(&user), "accessToken": tokens.access, "refreshToken": tokens.refresh });
        let same = |data: &SignedIn, tree: Value| {
            assert_eq!(
                String::from_utf8(web::ok_with(200, data).body).unwrap(),
                String::from_utf8(web::ok(200, tree).body).unwrap()
            );
        };
        same(&SignedIn::of(&tokens, &user), tree());
        let mut with_device = tree();
        with_device["deviceToken"] = json!("dev.token");
        same(
            &SignedIn {
                device_token: Some("dev.token".into()),
                ..SignedIn::of(&tokens, &user)
            },
            with_device,
        );
        let mut with_codes = tree();
        with_codes["remainingCodes"] = json!(7);
        same(
            &SignedIn {
                remaining_codes: Some(7),
                ..SignedIn::of(&tokens, &user)
            },
            with_codes,
        );
    }
}
