//! Which handler serves which path and method.
//!
//! | path (under the base path) | methods | module |
//! |---|---|---|
//! | `/health`, `/health/live`, `/health/ready` | GET | [`crate::health`] |
//! | `/auth/register`, `/auth/login`, `/auth/me` | POST, POST, GET | [`crate::users`] |
//! | `/auth/refresh`, `/auth/logout`, `/auth/revoke-sessions` | POST | [`crate::sessions`] |
//! | `/auth/sessions`, `/auth/sessions/{id}` | GET, DELETE | [`crate::sessions`] |
//! | `/2fa/totp/setup`, `/2fa/totp/verify-setup` (= `/2fa/totp/verify`), `/2fa/totp` | POST, POST, DELETE | [`crate::totp`] |
//! | `/2fa/{sms,email}/setup`, `/2fa/{sms,email}/verify-setup` | POST | [`crate::otp`] |
//! | `/2fa/send-code`, `/2fa/resend` | POST | [`crate::otp`] |
//! | `/2fa/verify`, `/2fa/verify-backup-code` (= `/2fa/verify-backup`) | POST | [`crate::mfa`] |
//! | `/2fa/backup-codes/generate`, `/2fa/backup-codes/count` | POST, GET | [`crate::backup`] |
//! | `/2fa/methods`, `/2fa/methods/{id}` | GET, DELETE | [`crate::methods`] |
//! | `/2fa/devices`, `/2fa/devices/{id}` | GET + DELETE, DELETE | [`crate::devices`] |
//! | `/auth/introspect` | POST | [`crate::sessions`] |
//! | `/api-keys`, `/api-keys/{id}`, `/api-keys/{id}/rotate` | GET + POST, DELETE, POST | [`crate::apikeys`] |
//! | `/audit-log` | GET | [`crate::audit`] |
//! | `/webhooks`, `/webhooks/events`, `/webhooks/verify-signature`, `/webhooks/{id}`, `/webhooks/{id}/test`, `/webhooks/{id}/deliveries` | GET + POST, GET, POST, GET + DELETE, POST, GET | [`crate::webhooks`] |
//!
//! An unknown path is 404 `Resource not found`; a known path with another
//! method is 405 with `Allow`; `OPTIONS` on a known path is the CORS
//! preflight.

use crate::context::{Ctx, Outcome};
use crate::error::ApiError;
use crate::otp::Channel;
use crate::{
    apikeys, audit, backup, devices, health, methods, mfa, otp, sessions, totp, users, web,
    webhooks,
};

/// A resolved route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Health,
    Live,
    Ready,
    Register,
    Login,
    Me,
    Refresh,
    Logout,
    RevokeSessions,
    Sessions,
    Session(String),
    TotpSetup,
    TotpVerifySetup,
    TotpDelete,
    Setup(Channel),
    VerifySetup(Channel),
    SendCode,
    Verify,
    VerifyBackup,
    BackupGenerate,
    BackupCount,
    Methods,
    Method(String),
    Devices,
    DevicesDeleteAll,
    Device(String),
    Introspect,
    ApiKeys,
    ApiKeyCreate,
    ApiKeyRevoke(String),
    ApiKeyRotate(String),
    AuditLog,
    WebhookEvents,
    Webhooks,
    WebhookCreate,
    Webhook(String),
    WebhookDelete(String),
    WebhookTest(String),
    WebhookDeliveries(String),
    WebhookVerify,
}

const GET: &[&str] = &["GET"];
const POST: &[&str] = &["POST"];
const DELETE: &[&str] = &["DELETE"];
const GET_DELETE: &[&str] = &["GET", "DELETE"];
const GET_POST: &[&str] = &["GET", "POST"];

/// The methods a path answers and, aligned with them, the routes.
pub fn table(segs: &[&str]) -> Option<(&'static [&'static str], Vec<Route>)> {
    use Route::*;
    let channel = |s: &str| match s {
        "sms" => Some(Channel::Sms),
        "email" => Some(Channel::Email),
        _ => None,
    };
    Some(match segs {
        ["health"] => (GET, vec![Health]),
        ["health", "live"] => (GET, vec![Live]),
        ["health", "ready"] => (GET, vec![Ready]),
        ["auth", "register"] => (POST, vec![Register]),
        ["auth", "login"] => (POST, vec![Login]),
        ["auth", "me"] => (GET, vec![Me]),
        ["auth", "refresh"] => (POST, vec![Refresh]),
        ["auth", "logout"] => (POST, vec![Logout]),
        ["auth", "revoke-sessions"] => (POST, vec![RevokeSessions]),
        ["auth", "sessions"] => (GET, vec![Sessions]),
        ["auth", "sessions", id] => (DELETE, vec![Session(id.to_string())]),
        ["2fa", "totp", "setup"] => (POST, vec![TotpSetup]),
        ["2fa", "totp", "verify-setup"] | ["2fa", "totp", "verify"] => {
            (POST, vec![TotpVerifySetup])
        }
        ["2fa", "totp"] => (DELETE, vec![TotpDelete]),
        ["2fa", c, "setup"] => (POST, vec![Setup(channel(c)?)]),
        ["2fa", c, "verify-setup"] => (POST, vec![VerifySetup(channel(c)?)]),
        ["2fa", "send-code"] | ["2fa", "resend"] => (POST, vec![SendCode]),
        ["2fa", "verify"] => (POST, vec![Verify]),
        ["2fa", "verify-backup-code"] | ["2fa", "verify-backup"] => (POST, vec![VerifyBackup]),
        ["2fa", "backup-codes", "generate"] => (POST, vec![BackupGenerate]),
        ["2fa", "backup-codes", "count"] => (GET, vec![BackupCount]),
        ["2fa", "methods"] => (GET, vec![Methods]),
        ["2fa", "methods", id] => (DELETE, vec![Method(id.to_string())]),
        ["2fa", "devices"] => (GET_DELETE, vec![Devices, DevicesDeleteAll]),
        ["2fa", "devices", id] => (DELETE, vec![Device(id.to_string())]),
        ["auth", "introspect"] => (POST, vec![Introspect]),
        ["api-keys"] => (GET_POST, vec![ApiKeys, ApiKeyCreate]),
        ["api-keys", id] => (DELETE, vec![ApiKeyRevoke(id.to_string())]),
        ["api-keys", id, "rotate"] => (POST, vec![ApiKeyRotate(id.to_string())]),
        ["audit-log"] => (GET, vec![AuditLog]),
        ["webhooks"] => (GET_POST, vec![Webhooks, WebhookCreate]),
        ["webhooks", "events"] => (GET, vec![WebhookEvents]),
        ["webhooks", "verify-signature"] => (POST, vec![WebhookVerify]),
        ["webhooks", id] => (
            GET_DELETE,
            vec![Webhook(id.to_string()), WebhookDelete(id.to_string())],
        ),
        ["webhooks", id, "test"] => (POST, vec![WebhookTest(id.to_string())]),
        ["webhooks", id, "deliveries"] => (GET, vec![WebhookDeliveries(id.to_string())]),
        _ => return None,
    })
}

/// The path below the base path, split into segments; None when the path is
/// outside the base path or malformed.
pub fn segments<'p>(path: &'p str, base: &str) -> Option<Vec<&'p str>> {
    let rest = path.strip_prefix(base)?;
    let rest = rest.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let segs: Vec<&str> = rest.split('/').collect();
    if segs.iter().any(|s| s.is_empty() || s.len() > 128) {
        return None;
    }
    Some(segs)
}

/// Finds the handler for the request in `ctx` and runs it.
pub fn dispatch(ctx: &mut Ctx) -> Result<Outcome, ApiError> {
    let path = ctx.req.path_only().to_string();
    let segs = segments(&path, &ctx.config.base_path).ok_or(ApiError::NotFound)?;
    let (allowed, routes) = table(&segs).ok_or(ApiError::NotFound)?;
    let method = ctx.req.method.to_ascii_uppercase();
    if method == "OPTIONS" {
        return Ok(Outcome::Done(web::preflight(ctx.req, ctx.config, allowed)));
    }
    let i = allowed
        .iter()
        .position(|m| *m == method)
        .ok_or(ApiError::MethodNotAllowed(allowed))?;
    if ctx.req.body.len() > web::MAX_BODY_BYTES {
        return Err(ApiError::BodyTooLarge);
    }
    run(ctx, &routes[i])
}

fn run(ctx: &mut Ctx, route: &Route) -> Result<Outcome, ApiError> {
    match route {
        Route::Health => health::health(ctx),
        Route::Live => health::live(ctx),
        Route::Ready => health::ready(ctx),
        Route::Register => users::register(ctx),
        Route::Login => users::login(ctx),
        Route::Me => users::me(ctx),
        Route::Refresh => sessions::refresh(ctx),
        Route::Logout => sessions::logout(ctx),
        Route::RevokeSessions => sessions::revoke_all(ctx),
        Route::Sessions => sessions::list(ctx),
        Route::Session(id) => sessions::delete(ctx, id),
        Route::TotpSetup => totp::setup(ctx),
        Route::TotpVerifySetup => totp::verify_setup(ctx),
        Route::TotpDelete => totp::delete(ctx),
        Route::Setup(c) => otp::setup(ctx, *c),
        Route::VerifySetup(c) => otp::verify_setup(ctx, *c),
        Route::SendCode => otp::send_code(ctx),
        Route::Verify => mfa::verify(ctx),
        Route::VerifyBackup => mfa::verify_backup(ctx),
        Route::BackupGenerate => backup::generate(ctx),
        Route::BackupCount => backup::count(ctx),
        Route::Methods => methods::list(ctx),
        Route::Method(id) => methods::delete(ctx, id),
        Route::Devices => devices::list(ctx),
        Route::DevicesDeleteAll => devices::delete_all(ctx),
        Route::Device(id) => devices::delete(ctx, id),
        Route::Introspect => sessions::introspect(ctx),
        Route::ApiKeys => apikeys::list(ctx),
        Route::ApiKeyCreate => apikeys::create(ctx),
        Route::ApiKeyRevoke(id) => apikeys::revoke(ctx, id),
        Route::ApiKeyRotate(id) => apikeys::rotate(ctx, id),
        Route::AuditLog => audit::list(ctx),
        Route::WebhookEvents => webhooks::events(ctx),
        Route::Webhooks => webhooks::list(ctx),
        Route::WebhookCreate => webhooks::create(ctx),
        Route::Webhook(id) => webhooks::get(ctx, id),
        Route::WebhookDelete(id) => webhooks::delete(ctx, id),
        Route::WebhookTest(id) => webhooks::test(ctx, id),
        Route::WebhookDeliveries(id) => webhooks::deliveries(ctx, id),
        Route::WebhookVerify => webhooks::verify_signature(ctx),
    }
}
