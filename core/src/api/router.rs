//! Which handler serves which path and method: the table [`ROUTES`], one
//! entry per operation, in the spelling of the OpenAPI document
//! (`core/openapi.json`, served at `GET {base}/openapi.json`). Both spellings
//! of the variant paths are entries of their own (`/2fa/totp/verify` =
//! `/2fa/totp/verify-setup`, `/2fa/resend` = `/2fa/send-code`,
//! `/2fa/verify-backup` = `/2fa/verify-backup-code`).
//!
//! An unknown path is 404 `Resource not found`; a known path with another
//! method is 405 with `Allow`; `OPTIONS` on a known path is the CORS
//! preflight.

use super::{
    apikeys, audit, backup, devices, health, methods, mfa, openapi, otp, sessions, totp, users,
    webauthn, webhooks,
};
use crate::api::otp::Channel;
use crate::contract::error::ApiError;
use crate::plumbing::context::{Ctx, Outcome};
use crate::plumbing::web;

/// What serves one route: the context and the value of the route's path
/// parameter (empty when its template has none).
pub type Handler = fn(&mut Ctx, &str) -> Result<Outcome, ApiError>;

/// One operation: a method and a path template below the base path, in the
/// OpenAPI document's spelling (`{name}` is one path segment).
#[derive(Clone, Copy)]
pub struct Route {
    /// Upper-case method.
    pub method: &'static str,
    /// Template, e.g. `/webhooks/{webhookId}/test`.
    pub path: &'static str,
    handler: Handler,
}

const fn route(method: &'static str, path: &'static str, handler: Handler) -> Route {
    Route {
        method,
        path,
        handler,
    }
}

/// Every operation of the API; [`dispatch`] serves exactly these, and
/// `core/openapi.json` documents exactly these (a test checks both).
/// Methods of one path are listed in the order `Allow` names them.
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    route("GET", "/openapi.json", |c, _| openapi::document(c)),
    route("GET", "/health", |c, _| health::health(c)),
    route("GET", "/health/live", |c, _| health::live(c)),
    route("GET", "/health/ready", |c, _| health::ready(c)),
    route("POST", "/auth/register", |c, _| users::register(c)),
    route("POST", "/auth/login", |c, _| users::login(c)),
    route("GET", "/auth/me", |c, _| users::me(c)),
    route("POST", "/auth/refresh", |c, _| sessions::refresh(c)),
    route("POST", "/auth/logout", |c, _| sessions::logout(c)),
    route("POST", "/auth/revoke-sessions", |c, _| sessions::revoke_all(c)),
    route("GET", "/auth/sessions", |c, _| sessions::list(c)),
    route("DELETE", "/auth/sessions/{sessionId}", sessions::delete),
    route("POST", "/auth/introspect", |c, _| sessions::introspect(c)),
    route("POST", "/auth/passkey/options", |c, _| webauthn::passkey_options(c)),
    route("POST", "/auth/passkey/verify", |c, _| webauthn::passkey_verify(c)),
    route("POST", "/2fa/totp/setup", |c, _| totp::setup(c)),
    route("POST", "/2fa/totp/verify-setup", |c, _| totp::verify_setup(c)),
    route("POST", "/2fa/totp/verify", |c, _| totp::verify_setup(c)),
    route("DELETE", "/2fa/totp", |c, _| totp::delete(c)),
    route("POST", "/2fa/sms/setup", |c, _| otp::setup(c, Channel::Sms)),
    route("POST", "/2fa/sms/verify-setup", |c, _| otp::verify_setup(c, Channel::Sms)),
    route("POST", "/2fa/email/setup", |c, _| otp::setup(c, Channel::Email)),
    route("POST", "/2fa/email/verify-setup", |c, _| otp::verify_setup(c, Channel::Email)),
    route("POST", "/2fa/send-code", |c, _| otp::send_code(c)),
    route("POST", "/2fa/resend", |c, _| otp::send_code(c)),
    route("POST", "/2fa/verify", |c, _| mfa::verify(c)),
    route("POST", "/2fa/verify-backup-code", |c, _| mfa::verify_backup(c)),
    route("POST", "/2fa/verify-backup", |c, _| mfa::verify_backup(c)),
    route("POST", "/2fa/webauthn/options", |c, _| webauthn::login_options(c)),
    route("POST", "/2fa/verify-webauthn", |c, _| webauthn::verify_login(c)),
    route("POST", "/2fa/backup-codes/generate", |c, _| backup::generate(c)),
    route("GET", "/2fa/backup-codes/count", |c, _| backup::count(c)),
    route("POST", "/2fa/webauthn/register/options", |c, _| webauthn::register_options(c)),
    route("POST", "/2fa/webauthn/register/verify", |c, _| webauthn::register_verify(c)),
    route("GET", "/2fa/webauthn/credentials", |c, _| webauthn::list(c)),
    route("PATCH", "/2fa/webauthn/credentials/{credentialId}", webauthn::rename),
    route("DELETE", "/2fa/webauthn/credentials/{credentialId}", webauthn::delete),
    route("GET", "/2fa/methods", |c, _| methods::list(c)),
    route("DELETE", "/2fa/methods/{methodId}", methods::delete),
    route("GET", "/2fa/devices", |c, _| devices::list(c)),
    route("DELETE", "/2fa/devices", |c, _| devices::delete_all(c)),
    route("DELETE", "/2fa/devices/{deviceId}", devices::delete),
    route("GET", "/api-keys", |c, _| apikeys::list(c)),
    route("POST", "/api-keys", |c, _| apikeys::create(c)),
    route("DELETE", "/api-keys/{apiKeyId}", apikeys::revoke),
    route("POST", "/api-keys/{apiKeyId}/rotate", apikeys::rotate),
    route("GET", "/audit-log", |c, _| audit::list(c)),
    route("GET", "/webhooks", |c, _| webhooks::list(c)),
    route("POST", "/webhooks", |c, _| webhooks::create(c)),
    route("GET", "/webhooks/events", |c, _| webhooks::events(c)),
    route("POST", "/webhooks/verify-signature", |c, _| webhooks::verify_signature(c)),
    route("GET", "/webhooks/{webhookId}", webhooks::get),
    route("DELETE", "/webhooks/{webhookId}", webhooks::delete),
    route("POST", "/webhooks/{webhookId}/test", webhooks::test),
    route("GET", "/webhooks/{webhookId}/deliveries", webhooks::deliveries),
];

/// How `template` matches `segs`: None when it does not; else the number of
/// its literal segments (more is more specific) and the parameter's value.
/// (Every request tries every template: nothing is allocated here.)
fn match_template<'s>(template: &str, segs: &[&'s str]) -> Option<(usize, &'s str)> {
    let mut parts = template.trim_start_matches('/').split('/');
    let mut literals = 0;
    let mut param = "";
    for seg in segs {
        let part = parts.next()?;
        if part.starts_with('{') && part.ends_with('}') {
            param = seg;
        } else if part == *seg {
            literals += 1;
        } else {
            return None;
        }
    }
    if parts.next().is_some() {
        return None;
    }
    Some((literals, param))
}

/// The routes of the most specific template that matches `segs` (a literal
/// segment beats a parameter, so `/webhooks/events` is not a webhook id),
/// in table order, and the path parameter's value; None when no template
/// matches.
pub fn resolve<'s>(segs: &[&'s str]) -> Option<(Vec<&'static Route>, &'s str)> {
    let mut best: Option<(usize, &'static str, &'s str)> = None;
    for r in ROUTES {
        if let Some((score, param)) = match_template(r.path, segs) {
            if best.is_none_or(|(b, _, _)| score > b) {
                best = Some((score, r.path, param));
            }
        }
    }
    let (_, path, param) = best?;
    Some((ROUTES.iter().filter(|r| r.path == path).collect(), param))
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
    let (routes, param) = resolve(&segs).ok_or(ApiError::NotFound)?;
    let allowed: Vec<&'static str> = routes.iter().map(|r| r.method).collect();
    let method = ctx.req.method.to_ascii_uppercase();
    if method == "OPTIONS" {
        return Ok(Outcome::Done(web::preflight(ctx.req, ctx.config, &allowed)));
    }
    let route = routes
        .iter()
        .find(|r| r.method == method)
        .ok_or(ApiError::MethodNotAllowed(allowed))?;
    if ctx.req.body.len() > web::MAX_BODY_BYTES {
        return Err(ApiError::BodyTooLarge);
    }
    (route.handler)(ctx, param)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(template: &str, value: &str) -> Vec<String> {
        template
            .trim_start_matches('/')
            .split('/')
            .map(|s| if s.starts_with('{') { value } else { s }.to_string())
            .collect()
    }

    #[test]
    fn templates_are_well_formed_and_unambiguous() {
        for r in ROUTES {
            assert!(
                ["GET", "POST", "PATCH", "DELETE"].contains(&r.method),
                "{}",
                r.path
            );
            assert!(
                r.path.starts_with('/') && !r.path.ends_with('/'),
                "{}",
                r.path
            );
            let params = r.path.matches('{').count();
            assert!(params <= 1, "{}: one parameter at most", r.path);
            assert_eq!(params, r.path.matches('}').count(), "{}", r.path);
        }
        // Two templates that match one concrete path never tie: the one with
        // more literal segments wins, so the answer never depends on order.
        for a in ROUTES {
            for b in ROUTES.iter().filter(|b| b.path != a.path) {
                for value in ["x", "events", "verify-signature", "sms"] {
                    let s = segs(a.path, value);
                    let s: Vec<&str> = s.iter().map(String::as_str).collect();
                    if let (Some((la, _)), Some((lb, _))) =
                        (match_template(a.path, &s), match_template(b.path, &s))
                    {
                        assert_ne!(la, lb, "{} and {} tie on {s:?}", a.path, b.path);
                    }
                }
            }
        }
    }

    #[test]
    fn the_most_specific_template_wins() {
        let (routes, param) = resolve(&["webhooks", "events"]).unwrap();
        assert_eq!(routes.len(), 1);
        assert_eq!(
            (routes[0].method, routes[0].path, param),
            ("GET", "/webhooks/events", "")
        );
        let (routes, param) = resolve(&["webhooks", "abc"]).unwrap();
        let methods: Vec<&str> = routes.iter().map(|r| r.method).collect();
        assert_eq!((methods, param), (vec!["GET", "DELETE"], "abc"));
        assert!(resolve(&["2fa", "push", "setup"]).is_none());
        assert!(resolve(&["webhooks", "a", "b"]).is_none());
    }

    #[test]
    fn a_template_matches_only_as_many_segments_as_it_has() {
        let t = "/webhooks/{webhookId}/test";
        assert_eq!(
            match_template(t, &["webhooks", "w1", "test"]),
            Some((2, "w1"))
        );
        assert_eq!(match_template(t, &["webhooks", "w1"]), None);
        assert_eq!(match_template(t, &["webhooks", "w1", "test", "x"]), None);
        assert_eq!(match_template(t, &["webhooks", "w1", "tesT"]), None);
        assert_eq!(match_template("/health", &["health"]), Some((1, "")));
        assert_eq!(match_template("/health", &[]), None);
    }
}
