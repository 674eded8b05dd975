//! The plugin configuration: JSON in, a validated [`Config`] out, or a
//! [`ConfigError`] saying which field is wrong and why.
//!
//! Unknown fields are refused (a misspelt `fail_open` must not silently
//! become the default), and so is every value that could make the filter
//! behave differently from what its operator meant: an empty secret list, a
//! rule that is neither a prefix nor an exact path, a header name the
//! upstream could not trust, and so on. `README.md` documents every field.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

/// What a request must present to pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Requirement {
    /// Anyone passes (forwarded-claim headers are still stripped).
    None,
    /// A valid access token.
    Auth,
    /// A valid access token whose `mfa` claim is `true`.
    Mfa,
    /// A valid access token whose `amr` claim shows a WebAuthn assertion
    /// (`hwk` or `swk`, RFC 8176): the session was signed in with a passkey,
    /// which cannot be phished.
    PhishingResistant,
}

/// A claim of an access token that can be forwarded as a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    /// `sub`: the user id.
    Sub,
    /// `sid`: the session id.
    Sid,
    /// `mfa`: `true` or `false`.
    Mfa,
    /// `exp`: expiry, Unix seconds.
    Exp,
    /// `iat`: issued at, Unix seconds.
    Iat,
    /// `amr`: how the user signed in (RFC 8176 values, space-separated).
    Amr,
}

impl Claim {
    fn parse(s: &str) -> Option<Claim> {
        Some(match s {
            "sub" => Claim::Sub,
            "sid" => Claim::Sid,
            "mfa" => Claim::Mfa,
            "exp" => Claim::Exp,
            "iat" => Claim::Iat,
            "amr" => Claim::Amr,
            _ => return None,
        })
    }
}

/// How a rule matches the request path (the `:path` without its query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The path is exactly this.
    Exact(String),
    /// The path starts with this (plain string prefix, as Envoy's `prefix`).
    Prefix(String),
}

/// One ordered rule: the first whose path and method match decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Path condition.
    pub path: PathMatch,
    /// Upper-case methods; empty means any method.
    pub methods: Vec<String>,
    /// What a matching request must present.
    pub require: Requirement,
}

/// Optional session check against the API's `POST /auth/introspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Introspection {
    /// Envoy cluster serving the API.
    pub cluster: String,
    /// `:authority` of the call.
    pub authority: String,
    /// Path of the introspection endpoint.
    pub path: String,
    /// Header carrying the API key (`x-api-key`).
    pub api_key_header: String,
    /// API key with scope `auth:introspect`.
    pub api_key: String,
    /// Call timeout in milliseconds.
    pub timeout_ms: u64,
    /// How long an `active: true` answer is reused, seconds (0: never).
    pub positive_ttl_secs: u64,
    /// How long an `active: false` answer is reused, seconds (0: never).
    pub negative_ttl_secs: u64,
    /// Let requests through when the API cannot answer (unreachable,
    /// timeout, non-2xx, garbage). Default false: answer 503.
    pub fail_open: bool,
    /// Number of shared-data slots the answers are cached in.
    pub cache_slots: u64,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// HS256 secrets, tried in order (rotation: new first, then old).
    pub secrets: Vec<Vec<u8>>,
    /// Required `iss`.
    pub issuer: String,
    /// Required `aud`.
    pub audience: String,
    /// Leeway applied to `exp` and `nbf`, seconds.
    pub clock_skew_secs: u64,
    /// Cookie holding the token when there is no `Authorization: Bearer`.
    pub cookie_name: Option<String>,
    /// Ordered rules.
    pub rules: Vec<Rule>,
    /// Requirement when no rule matches.
    pub default_require: Requirement,
    /// Claim → header (lower case), in claim order.
    pub forward_claims: Vec<(Claim, String)>,
    /// Every header removed from each request before anything else: the
    /// forwarded-claim headers plus `strip_headers`. Lower case, distinct.
    pub protected_headers: Vec<String>,
    /// Where browsers are sent on failure; `None`: they get JSON too.
    pub login_url: Option<String>,
    /// Query parameter carrying the original URL.
    pub return_param: String,
    /// Session check, if any.
    pub introspection: Option<Introspection>,
    /// Prefix of this configuration's shared-data keys (derived from the
    /// configuration itself, so two differently configured filters in one
    /// VM never read each other's answers).
    pub cache_namespace: String,
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Largest accepted clock skew: five minutes.
pub const MAX_CLOCK_SKEW_SECS: u64 = 300;
/// Largest accepted cache TTL: one hour.
pub const MAX_TTL_SECS: u64 = 3600;
/// Largest accepted call timeout: one minute.
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// Largest accepted number of cache slots.
pub const MAX_CACHE_SLOTS: u64 = 1_000_000;

/// Headers that may never be forwarded or stripped by configuration: the
/// filter would break routing, framing or authentication itself.
const RESERVED_HEADERS: [&str; 12] = [
    "authorization",
    "cookie",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "expect",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    secrets: Vec<String>,
    #[serde(default = "default_issuer")]
    issuer: String,
    #[serde(default = "default_audience")]
    audience: String,
    #[serde(default = "default_skew")]
    clock_skew_secs: u64,
    #[serde(default)]
    cookie_name: Option<String>,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default = "default_require")]
    default: Requirement,
    #[serde(default = "default_forward")]
    forward_claims: BTreeMap<String, String>,
    #[serde(default)]
    strip_headers: Vec<String>,
    #[serde(default)]
    login_url: Option<String>,
    #[serde(default = "default_return_param")]
    return_param: String,
    #[serde(default)]
    introspection: Option<RawIntrospection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    require: Requirement,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIntrospection {
    cluster: String,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default = "default_introspect_path")]
    path: String,
    #[serde(default = "default_api_key_header")]
    api_key_header: String,
    api_key: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "default_positive_ttl")]
    positive_ttl_secs: u64,
    #[serde(default = "default_negative_ttl")]
    negative_ttl_secs: u64,
    #[serde(default)]
    fail_open: bool,
    #[serde(default = "default_cache_slots")]
    cache_slots: u64,
}

fn default_issuer() -> String {
    "two-factor-auth".into()
}
fn default_audience() -> String {
    "two-factor-auth-api".into()
}
fn default_skew() -> u64 {
    30
}
fn default_require() -> Requirement {
    Requirement::Auth
}
fn default_forward() -> BTreeMap<String, String> {
    // Inserted one by one: collecting into a map would link a sort for
    // three constant pairs.
    let mut m = BTreeMap::new();
    for (k, v) in [
        ("sub", "x-user-id"),
        ("sid", "x-session-id"),
        ("mfa", "x-user-mfa"),
    ] {
        m.insert(k.to_string(), v.to_string());
    }
    m
}
fn default_return_param() -> String {
    "return_to".into()
}
fn default_introspect_path() -> String {
    "/api/auth/introspect".into()
}
fn default_api_key_header() -> String {
    "x-api-key".into()
}
fn default_timeout_ms() -> u64 {
    1000
}
fn default_positive_ttl() -> u64 {
    30
}
fn default_negative_ttl() -> u64 {
    10
}
fn default_cache_slots() -> u64 {
    4096
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// A header name the filter may set or strip: a lower-cased token, not a
/// pseudo-header, not one of [`RESERVED_HEADERS`].
fn header_name(field: &str, name: &str) -> Result<String, ConfigError> {
    let lower = name.to_ascii_lowercase();
    if !is_token(&lower) {
        return err(format!(
            "{field}: {name:?} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)"
        ));
    }
    if RESERVED_HEADERS.contains(&lower.as_str()) {
        return err(format!(
            "{field}: header {lower:?} is reserved and cannot be set or stripped by the filter"
        ));
    }
    Ok(lower)
}

/// Visible ASCII, no controls: safe inside a header value.
fn is_header_value(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

fn rule_path(field: &str, p: &str) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return err(format!("{field}: must start with '/', got {p:?}"));
    }
    if p.contains('?') || p.contains('#') || !is_header_value(p) || p.contains(' ') {
        return err(format!(
            "{field}: {p:?} must be a plain path (no query, fragment, spaces or control characters)"
        ));
    }
    Ok(p.to_string())
}

impl Config {
    /// Parses and validates the plugin configuration (a JSON object).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return err(
                "configuration is empty: a JSON object with at least \"secrets\" is required",
            );
        }
        let raw: RawConfig = serde_json::from_slice(bytes)
            .map_err(|e| ConfigError(format!("configuration is not valid: {e}")))?;

        if raw.secrets.is_empty() {
            return err("secrets: at least one HS256 secret is required");
        }
        if raw.secrets.iter().any(String::is_empty) {
            return err("secrets: a secret may not be empty");
        }
        if raw.issuer.is_empty() {
            return err("issuer: may not be empty");
        }
        if raw.audience.is_empty() {
            return err("audience: may not be empty");
        }
        if raw.clock_skew_secs > MAX_CLOCK_SKEW_SECS {
            return err(format!(
                "clock_skew_secs: {} is more than the maximum {MAX_CLOCK_SKEW_SECS}",
                raw.clock_skew_secs
            ));
        }
        if let Some(c) = &raw.cookie_name {
            if !is_token(c) {
                return err(format!("cookie_name: {c:?} is not a valid cookie name"));
            }
        }

        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.into_iter().enumerate() {
            let field = format!("rules[{i}]");
            let path = match (r.prefix, r.path) {
                (Some(p), None) => PathMatch::Prefix(rule_path(&format!("{field}.prefix"), &p)?),
                (None, Some(p)) => PathMatch::Exact(rule_path(&format!("{field}.path"), &p)?),
                _ => {
                    return err(format!(
                        "{field}: exactly one of \"prefix\" or \"path\" is required"
                    ))
                }
            };
            let methods = match r.methods {
                None => Vec::new(),
                Some(m) if m.is_empty() => {
                    return err(format!(
                        "{field}.methods: may not be empty (leave it out to match every method)"
                    ))
                }
                Some(m) => {
                    let mut out = Vec::with_capacity(m.len());
                    for method in m {
                        if !is_token(&method) {
                            return err(format!("{field}.methods: {method:?} is not a method"));
                        }
                        out.push(method.to_ascii_uppercase());
                    }
                    out
                }
            };
            rules.push(Rule {
                path,
                methods,
                require: r.require,
            });
        }

        let mut forward_claims: Vec<(Claim, String)> = Vec::new();
        for (claim, header) in &raw.forward_claims {
            let Some(c) = Claim::parse(claim) else {
                return err(format!(
                    "forward_claims: unknown claim {claim:?} (one of sub, sid, mfa, exp, iat)"
                ));
            };
            let h = header_name(&format!("forward_claims.{claim}"), header)?;
            if forward_claims.iter().any(|(_, seen)| *seen == h) {
                return err(format!("forward_claims: header {h:?} is used twice"));
            }
            // Kept in claim order by inserting in place (at most six
            // entries, each claim once): `sort` would link the standard
            // library's stable sort, about 7 KB of wasm, for this.
            let at = forward_claims.partition_point(|(seen, _)| *seen < c);
            forward_claims.insert(at, (c, h));
        }
        let mut protected_headers: Vec<String> =
            forward_claims.iter().map(|(_, h)| h.clone()).collect();
        for (i, h) in raw.strip_headers.iter().enumerate() {
            let h = header_name(&format!("strip_headers[{i}]"), h)?;
            if !protected_headers.contains(&h) {
                protected_headers.push(h);
            }
        }

        if let Some(url) = &raw.login_url {
            let ok_start =
                url.starts_with("https://") || url.starts_with("http://") || url.starts_with('/');
            if !ok_start || !is_header_value(url) || url.contains(' ') || url.contains('#') {
                return err(format!(
                    "login_url: {url:?} must be an absolute http(s) URL or a path, without spaces, fragment or control characters"
                ));
            }
        }
        if !is_token(&raw.return_param) || raw.return_param.contains(['&', '=', '#', '%', '+']) {
            return err(format!(
                "return_param: {:?} is not a usable query parameter name",
                raw.return_param
            ));
        }

        let introspection = match raw.introspection {
            None => None,
            Some(i) => Some(introspection(i)?),
        };

        let namespace = {
            use sha2::{Digest, Sha256};
            let digest = Sha256::digest(bytes);
            let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
            format!("tfa-edge/{hex}/")
        };

        Ok(Config {
            secrets: raw.secrets.into_iter().map(String::into_bytes).collect(),
            issuer: raw.issuer,
            audience: raw.audience,
            clock_skew_secs: raw.clock_skew_secs,
            cookie_name: raw.cookie_name,
            rules,
            default_require: raw.default,
            forward_claims,
            protected_headers,
            login_url: raw.login_url,
            return_param: raw.return_param,
            introspection,
            cache_namespace: namespace,
        })
    }

    /// Warnings worth a log line that do not refuse the configuration.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.secrets.iter().any(|s| s.len() < 32) {
            w.push("secrets: a secret shorter than 32 bytes is weak".to_string());
        }
        if let Some(i) = &self.introspection {
            if i.fail_open {
                w.push(
                    "introspection.fail_open is true: when the API cannot answer, tokens are accepted on their signature alone"
                        .to_string(),
                );
            }
        }
        w
    }
}

fn introspection(i: RawIntrospection) -> Result<Introspection, ConfigError> {
    if i.cluster.is_empty() || !is_header_value(&i.cluster) {
        return err("introspection.cluster: an Envoy cluster name is required");
    }
    let authority = i.authority.unwrap_or_else(|| i.cluster.clone());
    if authority.is_empty() || !is_header_value(&authority) || authority.contains(' ') {
        return err(format!(
            "introspection.authority: {authority:?} is not a valid authority"
        ));
    }
    let path = rule_path("introspection.path", &i.path)?;
    let api_key_header = header_name("introspection.api_key_header", &i.api_key_header)?;
    if i.api_key.is_empty() || !is_header_value(&i.api_key) {
        return err("introspection.api_key: a non-empty key of printable ASCII is required");
    }
    if i.timeout_ms == 0 || i.timeout_ms > MAX_TIMEOUT_MS {
        return err(format!(
            "introspection.timeout_ms: {} is outside 1..={MAX_TIMEOUT_MS}",
            i.timeout_ms
        ));
    }
    for (name, v) in [
        ("positive_ttl_secs", i.positive_ttl_secs),
        ("negative_ttl_secs", i.negative_ttl_secs),
    ] {
        if v > MAX_TTL_SECS {
            return err(format!(
                "introspection.{name}: {v} is more than the maximum {MAX_TTL_SECS}"
            ));
        }
    }
    if i.cache_slots == 0 || i.cache_slots > MAX_CACHE_SLOTS {
        return err(format!(
            "introspection.cache_slots: {} is outside 1..={MAX_CACHE_SLOTS}",
            i.cache_slots
        ));
    }
    Ok(Introspection {
        cluster: i.cluster,
        authority,
        path,
        api_key_header,
        api_key: i.api_key,
        timeout_ms: i.timeout_ms,
        positive_ttl_secs: i.positive_ttl_secs,
        negative_ttl_secs: i.negative_ttl_secs,
        fail_open: i.fail_open,
        cache_slots: i.cache_slots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<Config, ConfigError> {
        Config::parse(v.to_string().as_bytes())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(serde_json::json!({"secrets": ["s"]})).expect("valid");
        assert_eq!(c.secrets, vec![b"s".to_vec()]);
        assert_eq!(c.issuer, "two-factor-auth");
        assert_eq!(c.audience, "two-factor-auth-api");
        assert_eq!(c.clock_skew_secs, 30);
        assert_eq!(c.default_require, Requirement::Auth);
        assert!(c.rules.is_empty());
        assert_eq!(
            c.forward_claims,
            vec![
                (Claim::Sub, "x-user-id".to_string()),
                (Claim::Sid, "x-session-id".to_string()),
                (Claim::Mfa, "x-user-mfa".to_string()),
            ]
        );
        assert_eq!(
            c.protected_headers,
            ["x-user-id", "x-session-id", "x-user-mfa"]
        );
        assert_eq!(c.return_param, "return_to");
        assert!(c.login_url.is_none() && c.introspection.is_none());
        assert!(c.cache_namespace.starts_with("tfa-edge/"));
    }

    #[test]
    fn forwarded_claims_are_in_claim_order() {
        let c = parse(serde_json::json!({"secrets": ["s"], "forward_claims": {
            "amr": "x-amr", "exp": "x-exp", "iat": "x-iat",
            "mfa": "x-mfa", "sid": "x-sid", "sub": "x-sub"
        }}))
        .expect("valid");
        let claims: Vec<Claim> = c.forward_claims.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            claims,
            [
                Claim::Sub,
                Claim::Sid,
                Claim::Mfa,
                Claim::Exp,
                Claim::Iat,
                Claim::Amr
            ]
        );
        assert_eq!(
            c.protected_headers,
            ["x-sub", "x-sid", "x-mfa", "x-exp", "x-iat", "x-amr"]
        );
    }

    #[test]
    fn full_config() {
        let c = parse(serde_json::json!({
            "secrets": ["new", "old"],
            "issuer": "i", "audience": "a", "clock_skew_secs": 5,
            "cookie_name": "access_token",
            "rules": [
                {"prefix": "/public/", "require": "none"},
                {"path": "/admin", "methods": ["post", "DELETE"], "require": "mfa"},
                {"prefix": "/vault", "require": "phishing_resistant"}
            ],
            "default": "none",
            "forward_claims": {"sub": "X-User-Id", "exp": "x-token-exp"},
            "strip_headers": ["x-user-id", "x-internal"],
            "login_url": "https://login.example.com/signin?app=1",
            "return_param": "next",
            "introspection": {"cluster": "tfa_api", "api_key": "tfa_k", "fail_open": true}
        }))
        .expect("valid");
        assert_eq!(c.rules[0].path, PathMatch::Prefix("/public/".into()));
        assert_eq!(c.rules[1].methods, ["POST", "DELETE"]);
        assert_eq!(c.rules[2].require, Requirement::PhishingResistant);
        assert_eq!(c.default_require, Requirement::None);
        assert_eq!(
            c.protected_headers,
            ["x-user-id", "x-token-exp", "x-internal"]
        );
        let i = c.introspection.expect("introspection");
        assert_eq!(i.authority, "tfa_api");
        assert_eq!(i.path, "/api/auth/introspect");
        assert_eq!(i.api_key_header, "x-api-key");
        assert_eq!(
            (i.timeout_ms, i.positive_ttl_secs, i.negative_ttl_secs),
            (1000, 30, 10)
        );
        assert!(i.fail_open);
    }

    #[test]
    fn bad_configs_are_refused_with_the_field_named() {
        let cases = [
            (serde_json::json!({}), "secrets"),
            (serde_json::json!({"secrets": []}), "secrets"),
            (serde_json::json!({"secrets": [""]}), "secrets"),
            (
                serde_json::json!({"secrets": ["s"], "fail_open": true}),
                "unknown field",
            ),
            (
                serde_json::json!({"secrets": ["s"], "issuer": ""}),
                "issuer",
            ),
            (
                serde_json::json!({"secrets": ["s"], "clock_skew_secs": 301}),
                "clock_skew_secs",
            ),
            (
                serde_json::json!({"secrets": ["s"], "clock_skew_secs": -1}),
                "expected u64",
            ),
            (
                serde_json::json!({"secrets": ["s"], "cookie_name": "a b"}),
                "cookie_name",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"require": "auth"}]}),
                "rules[0]",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"prefix": "/a", "path": "/b", "require": "auth"}]}),
                "rules[0]",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"prefix": "a", "require": "auth"}]}),
                "rules[0].prefix",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"path": "/a?x", "require": "auth"}]}),
                "rules[0].path",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"prefix": "/a", "require": "admin"}]}),
                "unknown variant",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"prefix": "/a", "methods": [], "require": "auth"}]}),
                "rules[0].methods",
            ),
            (
                serde_json::json!({"secrets": ["s"], "rules": [{"prefix": "/a", "methods": ["G T"], "require": "auth"}]}),
                "rules[0].methods",
            ),
            (
                serde_json::json!({"secrets": ["s"], "default": "maybe"}),
                "unknown variant",
            ),
            (
                serde_json::json!({"secrets": ["s"], "forward_claims": {"email": "x-email"}}),
                "forward_claims",
            ),
            (
                serde_json::json!({"secrets": ["s"], "forward_claims": {"sub": "authorization"}}),
                "reserved",
            ),
            (
                serde_json::json!({"secrets": ["s"], "forward_claims": {"sub": ":path"}}),
                "forward_claims.sub",
            ),
            (
                serde_json::json!({"secrets": ["s"], "forward_claims": {"sub": "x-a", "sid": "X-A"}}),
                "used twice",
            ),
            (
                serde_json::json!({"secrets": ["s"], "strip_headers": ["cookie"]}),
                "reserved",
            ),
            (
                serde_json::json!({"secrets": ["s"], "login_url": "javascript:alert(1)"}),
                "login_url",
            ),
            (
                serde_json::json!({"secrets": ["s"], "login_url": "https://x/\r\nSet-Cookie: a"}),
                "login_url",
            ),
            (
                serde_json::json!({"secrets": ["s"], "return_param": "a&b"}),
                "return_param",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"api_key": "k"}}),
                "cluster",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c"}}),
                "api_key",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": ""}}),
                "api_key",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": "k", "timeout_ms": 0}}),
                "timeout_ms",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": "k", "positive_ttl_secs": 3601}}),
                "positive_ttl_secs",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": "k", "cache_slots": 0}}),
                "cache_slots",
            ),
            (
                serde_json::json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": "k", "failopen": true}}),
                "unknown field",
            ),
            (serde_json::json!(["s"]), "not valid"),
        ];
        for (v, needle) in cases {
            let e = parse(v.clone()).expect_err(&v.to_string());
            assert!(e.0.contains(needle), "{v}: {e} should mention {needle}");
        }
        for raw in [&b""[..], b"  ", b"{", b"not json", b"\xff\xfe"] {
            assert!(Config::parse(raw).is_err());
        }
    }

    #[test]
    fn namespace_differs_between_configurations() {
        let a = parse(serde_json::json!({"secrets": ["a"]})).expect("valid");
        let b = parse(serde_json::json!({"secrets": ["b"]})).expect("valid");
        assert_ne!(a.cache_namespace, b.cache_namespace);
    }

    #[test]
    fn warnings() {
        let c = parse(serde_json::json!({"secrets": ["short"], "introspection": {"cluster": "c", "api_key": "k", "fail_open": true}})).expect("valid");
        assert_eq!(c.warnings().len(), 2);
    }
}
