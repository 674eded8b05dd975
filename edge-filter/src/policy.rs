//! The decision for one request, without any host: which rule applies, where
//! the token is, whether it passes, what is forwarded and what a refused
//! client is told.

use tfa_core::contract::error::messages;
use tfa_core::contract::http;
use tfa_core::crypto::token_memo::MemoVerifier;
use tfa_core::tokens::{Claims, TokenError, Verifier};

use crate::config::{Claim, Config, PathMatch, Requirement};

/// The 403 message of an `mfa` rule (the API has no such refusal: it never
/// issues an access token before the second factor).
const MFA_REQUIRED: &str = "Two-factor authentication required";
/// The envelope's message when a rule requires a passkey sign-in.
const PHISHING_RESISTANT_REQUIRED: &str = "Phishing-resistant authentication required";

/// Why a request was turned away. Each has its own metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// No bearer token and no token cookie.
    MissingToken,
    /// Bad signature, wrong kind/issuer/audience, malformed, missing claims.
    InvalidToken,
    /// Past `exp` (or before `nbf`) even with the clock skew.
    ExpiredToken,
    /// The rule requires `mfa` and the token's `mfa` claim is not `true`.
    MfaRequired,
    /// The rule requires `phishing_resistant` and the token's `amr` shows
    /// no WebAuthn assertion.
    PhishingResistantRequired,
    /// Introspection says the session has ended.
    SessionInactive,
    /// Introspection could not be answered and the policy is fail-closed.
    ApiUnavailable,
    /// The plugin has no valid configuration.
    NotConfigured,
}

impl Denial {
    /// Every denial, in metric order.
    pub const ALL: [Denial; 8] = [
        Denial::MissingToken,
        Denial::InvalidToken,
        Denial::ExpiredToken,
        Denial::MfaRequired,
        Denial::PhishingResistantRequired,
        Denial::SessionInactive,
        Denial::ApiUnavailable,
        Denial::NotConfigured,
    ];

    /// Metric suffix: `tfa_edge.denied.<reason>`.
    pub fn reason(self) -> &'static str {
        match self {
            Denial::MissingToken => "missing_token",
            Denial::InvalidToken => "invalid_token",
            Denial::ExpiredToken => "expired_token",
            Denial::MfaRequired => "mfa_required",
            Denial::PhishingResistantRequired => "phishing_resistant_required",
            Denial::SessionInactive => "session_inactive",
            Denial::ApiUnavailable => "api_unavailable",
            Denial::NotConfigured => "not_configured",
        }
    }

    /// HTTP status of the JSON answer.
    pub fn status(self) -> u32 {
        match self {
            Denial::MfaRequired | Denial::PhishingResistantRequired => 403,
            Denial::ApiUnavailable | Denial::NotConfigured => 503,
            _ => 401,
        }
    }

    /// The envelope's `error`.
    pub fn message(self) -> &'static str {
        match self {
            Denial::MfaRequired => MFA_REQUIRED,
            Denial::PhishingResistantRequired => PHISHING_RESISTANT_REQUIRED,
            Denial::ApiUnavailable | Denial::NotConfigured => messages::UNAVAILABLE,
            _ => messages::INVALID_TOKEN,
        }
    }

    /// Whether a browser is redirected to the login page for this denial
    /// (an outage is not something logging in again would fix).
    pub fn redirects(self) -> bool {
        !matches!(self, Denial::ApiUnavailable | Denial::NotConfigured)
    }

    /// Index in [`Denial::ALL`].
    pub fn index(self) -> usize {
        Denial::ALL.iter().position(|d| *d == self).unwrap_or(0)
    }
}

/// A response the filter answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u32,
    /// Lower-case headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

/// The path without query string or fragment.
pub fn path_only(path: &str) -> &str {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    &path[..end]
}

/// The requirement of the first rule matching `method` and `path` (query
/// ignored), else the default.
pub fn requirement(cfg: &Config, method: &str, path: &str) -> Requirement {
    let path = path_only(path);
    for rule in &cfg.rules {
        let path_ok = match &rule.path {
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
        };
        let method_ok =
            rule.methods.is_empty() || rule.methods.iter().any(|m| m.eq_ignore_ascii_case(method));
        if path_ok && method_ok {
            return rule.require;
        }
    }
    cfg.default_require
}

/// A CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`. Browsers never send credentials on it.
pub fn is_preflight(method: &str, origin: Option<&[u8]>, request_method: Option<&[u8]>) -> bool {
    method == "OPTIONS"
        && origin.is_some_and(|o| !o.is_empty())
        && request_method.is_some_and(|m| !m.is_empty())
}

/// The token of `Authorization: Bearer <token>`, else of cookie
/// `cookie_name` among the `Cookie` headers: core's own readers
/// ([`http::bearer_token`], [`http::cookie_value`]), so the filter and the
/// API agree on what a token is. Values that are not UTF-8 are ignored.
pub fn extract_token(
    authorization: Option<&[u8]>,
    cookies: &[&[u8]],
    cookie_name: Option<&str>,
) -> Option<String> {
    if let Some(token) = authorization
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(http::bearer_token)
    {
        return Some(token.to_string());
    }
    let name = cookie_name?;
    cookies
        .iter()
        .filter_map(|c| std::str::from_utf8(c).ok())
        .find_map(|c| http::cookie_value(c, name))
        .map(str::to_string)
}

/// Builds the verifier of a configuration (access tokens only), with a
/// memo of the tokens it accepts: a client sends the same token with every
/// request, and a held token costs a comparison and the time checks
/// instead of its decoding, JSON and MAC (`tfa_core::crypto::token_memo`).
pub fn verifier(cfg: &Config) -> MemoVerifier {
    MemoVerifier::new(Verifier::new(
        tfa_core::tokens::TokenKind::Access,
        &cfg.secrets,
        &cfg.issuer,
        &cfg.audience,
        cfg.clock_skew_secs,
    ))
}

/// Checks `token` against `requirement` (which is not `None`) at
/// `now_secs`: the claims, or why not.
pub fn check_token(
    verifier: &MemoVerifier,
    token: Option<&str>,
    requirement: Requirement,
    now_secs: u64,
) -> Result<Claims, Denial> {
    let token = token.ok_or(Denial::MissingToken)?;
    let claims = verifier.verify(token, now_secs).map_err(|e| match e {
        TokenError::Expired | TokenError::NotYetValid => Denial::ExpiredToken,
        _ => Denial::InvalidToken,
    })?;
    match requirement {
        Requirement::Mfa if claims.mfa != Some(true) => Err(Denial::MfaRequired),
        Requirement::PhishingResistant if !phishing_resistant(&claims) => {
            Err(Denial::PhishingResistantRequired)
        }
        _ => Ok(claims),
    }
}

/// Whether the token's `amr` shows a WebAuthn assertion: `hwk` (a
/// device-bound key) or `swk` (a synced passkey), as the API writes them.
pub fn phishing_resistant(claims: &Claims) -> bool {
    claims
        .amr
        .as_ref()
        .is_some_and(|amr| amr.iter().any(|m| m == "hwk" || m == "swk"))
}

/// The headers to add for a request that passed with `claims`.
pub fn forwarded_headers(cfg: &Config, claims: &Claims) -> Vec<(String, String)> {
    cfg.forward_claims
        .iter()
        .filter_map(|(claim, header)| {
            let value = match claim {
                Claim::Sub => Some(claims.sub.clone()),
                Claim::Sid => claims.sid.clone(),
                Claim::Mfa => claims.mfa.map(|m| m.to_string()),
                Claim::Exp => Some(claims.exp.to_string()),
                Claim::Iat => Some(claims.iat.to_string()),
                Claim::Amr => claims.amr.as_ref().map(|amr| amr.join(" ")),
            }?;
            // A claim that cannot be a header value is left out rather
            // than mangled.
            value
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b))
                .then(|| (header.clone(), value))
        })
        .collect()
}

/// The `login` argument of [`denial_response`] for `cfg`.
pub fn login_of(cfg: &Config) -> Option<(&str, &str)> {
    cfg.login_url
        .as_deref()
        .map(|url| (url, cfg.return_param.as_str()))
}

/// Whether the client is a browser navigating (it accepts `text/html`).
pub fn wants_html(accept: Option<&[u8]>) -> bool {
    accept
        .and_then(|a| std::str::from_utf8(a).ok())
        .is_some_and(|a| a.to_ascii_lowercase().contains("text/html"))
}

/// `scheme://authority/path` of the request, or the path alone when the
/// authority is unknown.
pub fn original_url(scheme: Option<&str>, authority: Option<&str>, path: &str) -> String {
    match authority.filter(|a| !a.is_empty()) {
        Some(a) => {
            let scheme = match scheme {
                Some("http") => "http",
                _ => "https",
            };
            format!("{scheme}://{a}{path}")
        }
        None => path.to_string(),
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What a refused client is told: a 302 to the login page for browsers (when
/// configured and the denial is one logging in fixes), else the envelope.
///
/// `login` is the configuration's `(login_url, return_param)`, if any.
pub fn denial_response(
    login: Option<(&str, &str)>,
    denial: Denial,
    html: bool,
    original: &str,
) -> LocalResponse {
    if let (true, true, Some((login, param))) = (html, denial.redirects(), login) {
        let sep = if login.contains('?') { '&' } else { '?' };
        let location = format!("{login}{sep}{param}={}", url_encode(original));
        return LocalResponse {
            status: 302,
            headers: vec![
                ("location".into(), location),
                ("cache-control".into(), "no-store".into()),
            ],
            body: Vec::new(),
        };
    }
    // Messages are constants without characters JSON would escape; the
    // field order is the envelope's.
    let body = format!(r#"{{"success":false,"error":"{}"}}"#, denial.message());
    let mut headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("cache-control".to_string(), "no-store".to_string()),
    ];
    if denial.status() == 401 {
        headers.push(("www-authenticate".into(), "Bearer".into()));
    }
    LocalResponse {
        status: denial.status(),
        headers,
        body: body.into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfa_core::tokens::{Extra, TokenKeys, TokenKind};

    const NOW: u64 = 1_700_000_000;

    fn cfg(v: serde_json::Value) -> Config {
        Config::parse(v.to_string().as_bytes()).expect("valid")
    }

    #[test]
    fn first_matching_rule_wins() {
        let c = cfg(serde_json::json!({
            "secrets": ["s"],
            "rules": [
                {"path": "/admin/health", "require": "none"},
                {"prefix": "/admin", "methods": ["POST"], "require": "mfa"},
                {"prefix": "/admin", "require": "auth"},
                {"prefix": "/public/", "require": "none"}
            ],
            "default": "auth"
        }));
        assert_eq!(requirement(&c, "GET", "/admin/health"), Requirement::None);
        assert_eq!(
            requirement(&c, "GET", "/admin/health?x=1"),
            Requirement::None
        );
        assert_eq!(requirement(&c, "GET", "/admin/health/x"), Requirement::Auth);
        assert_eq!(requirement(&c, "POST", "/admin/users"), Requirement::Mfa);
        assert_eq!(requirement(&c, "post", "/admin/users"), Requirement::Mfa);
        assert_eq!(requirement(&c, "GET", "/admin/users"), Requirement::Auth);
        assert_eq!(requirement(&c, "GET", "/public/a"), Requirement::None);
        assert_eq!(requirement(&c, "GET", "/public"), Requirement::Auth);
        assert_eq!(requirement(&c, "GET", "/other"), Requirement::Auth);
        // A query cannot smuggle a prefix.
        assert_eq!(requirement(&c, "GET", "/x?/public/"), Requirement::Auth);
    }

    #[test]
    fn preflight_needs_origin_and_method() {
        assert!(is_preflight("OPTIONS", Some(b"https://a"), Some(b"POST")));
        assert!(!is_preflight("OPTIONS", Some(b"https://a"), None));
        assert!(!is_preflight("OPTIONS", None, Some(b"POST")));
        assert!(!is_preflight("GET", Some(b"https://a"), Some(b"POST")));
    }

    #[test]
    fn token_sources() {
        assert_eq!(
            extract_token(Some(b"Bearer abc"), &[], None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            extract_token(Some(b"bearer  abc "), &[], None).as_deref(),
            Some("abc")
        );
        assert_eq!(extract_token(Some(b"Basic abc"), &[], None), None);
        assert_eq!(extract_token(Some(b"Bearer "), &[], None), None);
        let cookies: [&[u8]; 2] = [b"a=1; tok=", b"x=y; tok=xyz; z=1"];
        assert_eq!(
            extract_token(None, &cookies, Some("tok")).as_deref(),
            Some("xyz")
        );
        assert_eq!(extract_token(None, &cookies, None), None);
        assert_eq!(extract_token(None, &cookies, Some("other")), None);
        // Bearer wins over the cookie; a non-bearer header falls back to it.
        assert_eq!(
            extract_token(Some(b"Bearer b"), &cookies, Some("tok")).as_deref(),
            Some("b")
        );
        assert_eq!(
            extract_token(Some(b"Basic b"), &cookies, Some("tok")).as_deref(),
            Some("xyz")
        );
        assert_eq!(extract_token(Some(b"\xff"), &[b"\xff"], Some("tok")), None);
    }

    /// The API's keys for the tests' tokens (access secret `acc`).
    fn issuer() -> TokenKeys {
        TokenKeys::new(
            b"acc",
            b"r",
            b"t",
            b"d",
            "two-factor-auth",
            "two-factor-auth-api",
        )
    }

    #[test]
    fn token_checks() {
        let keys = issuer();
        let c = cfg(serde_json::json!({"secrets": ["other", "acc"], "clock_skew_secs": 10}));
        let v = verifier(&c);
        let extra = |mfa| Extra {
            sid: Some("s1".into()),
            mfa: Some(mfa),
            ..Extra::default()
        };
        let with = keys.issue(TokenKind::Access, "u1", extra(true), NOW);
        let without = keys.issue(TokenKind::Access, "u1", extra(false), NOW);
        let refresh = keys.issue(TokenKind::Refresh, "u1", extra(true), NOW);
        assert_eq!(
            check_token(&v, None, Requirement::Auth, NOW),
            Err(Denial::MissingToken)
        );
        assert_eq!(
            check_token(&v, Some("x"), Requirement::Auth, NOW),
            Err(Denial::InvalidToken)
        );
        assert_eq!(
            check_token(&v, Some(&refresh), Requirement::Auth, NOW),
            Err(Denial::InvalidToken)
        );
        assert!(check_token(&v, Some(&without), Requirement::Auth, NOW).is_ok());
        assert_eq!(
            check_token(&v, Some(&without), Requirement::Mfa, NOW),
            Err(Denial::MfaRequired)
        );
        let claims = check_token(&v, Some(&with), Requirement::Mfa, NOW).expect("valid");
        // Skew edge: valid while now < exp + skew.
        assert!(check_token(&v, Some(&with), Requirement::Mfa, NOW + 900 + 9).is_ok());
        assert_eq!(
            check_token(&v, Some(&with), Requirement::Mfa, NOW + 900 + 10),
            Err(Denial::ExpiredToken)
        );
        assert_eq!(
            forwarded_headers(&c, &claims),
            vec![
                ("x-user-id".to_string(), "u1".to_string()),
                ("x-session-id".to_string(), "s1".to_string()),
                ("x-user-mfa".to_string(), "true".to_string()),
            ]
        );
    }

    #[test]
    fn phishing_resistant_needs_a_webauthn_amr() {
        let keys = issuer();
        let c = cfg(serde_json::json!({
            "secrets": ["acc"],
            "forward_claims": {"sub": "x-user-id", "amr": "x-user-amr"}
        }));
        let v = verifier(&c);
        let token = |amr: Option<&[&str]>| {
            let extra = Extra {
                sid: Some("s1".into()),
                mfa: Some(true),
                amr: amr.map(|a| a.iter().map(|m| m.to_string()).collect()),
                ..Extra::default()
            };
            keys.issue(TokenKind::Access, "u1", extra, NOW)
        };
        for amr in [
            &["pwd", "hwk", "mfa"][..],
            &["swk", "user", "mfa"],
            &["hwk"],
        ] {
            let claims = check_token(
                &v,
                Some(&token(Some(amr))),
                Requirement::PhishingResistant,
                NOW,
            )
            .expect("a passkey session passes");
            assert_eq!(
                forwarded_headers(&c, &claims),
                vec![
                    ("x-user-id".to_string(), "u1".to_string()),
                    ("x-user-amr".to_string(), amr.join(" ")),
                ]
            );
        }
        for amr in [
            Some(&["pwd", "otp", "mfa"][..]),
            Some(&["pwd", "sms", "mfa"]),
            Some(&[]),
            None,
        ] {
            let t = token(amr);
            assert_eq!(
                check_token(&v, Some(&t), Requirement::PhishingResistant, NOW),
                Err(Denial::PhishingResistantRequired),
                "{amr:?}"
            );
            // The same token passes `mfa` rules: only the passkey rule is stricter.
            assert!(check_token(&v, Some(&t), Requirement::Mfa, NOW).is_ok());
        }
        let r = denial_response(None, Denial::PhishingResistantRequired, false, "/");
        assert_eq!(r.status, 403);
        assert_eq!(
            r.body,
            br#"{"success":false,"error":"Phishing-resistant authentication required"}"#.to_vec()
        );
    }

    #[test]
    fn responses() {
        let c = cfg(
            serde_json::json!({"secrets": ["s"], "login_url": "https://login.example/in?app=x"}),
        );
        let r = denial_response(login_of(&c), Denial::MissingToken, false, "https://a/b");
        assert_eq!(r.status, 401);
        assert_eq!(
            r.body,
            br#"{"success":false,"error":"Invalid or expired token"}"#.to_vec()
        );
        assert!(r
            .headers
            .contains(&("content-type".into(), "application/json".into())));
        let r = denial_response(login_of(&c), Denial::MfaRequired, false, "https://a/b");
        assert_eq!(r.status, 403);
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            body,
            serde_json::json!({"success": false, "error": "Two-factor authentication required"})
        );
        let url = original_url(Some("https"), Some("app.example"), "/a b?x=1&y=é");
        let r = denial_response(login_of(&c), Denial::MfaRequired, true, &url);
        assert_eq!(r.status, 302);
        assert_eq!(
            r.headers[0].1,
            "https://login.example/in?app=x&return_to=https%3A%2F%2Fapp.example%2Fa%20b%3Fx%3D1%26y%3D%C3%A9"
        );
        assert_eq!(
            denial_response(login_of(&c), Denial::ApiUnavailable, true, &url).status,
            503
        );
        let no_login = cfg(serde_json::json!({"secrets": ["s"]}));
        assert_eq!(
            denial_response(login_of(&no_login), Denial::InvalidToken, true, &url).status,
            401
        );
        assert!(wants_html(Some(b"text/html,application/xhtml+xml")));
        assert!(!wants_html(Some(b"application/json")));
        assert!(!wants_html(None));
        assert_eq!(original_url(None, None, "/p"), "/p");
        assert_eq!(
            original_url(Some("http"), Some("h:8080"), "/p"),
            "http://h:8080/p"
        );
    }
}
