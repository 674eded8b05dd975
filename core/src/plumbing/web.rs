//! The envelope, request bodies, headers, cookies, CORS and CSRF.

use serde_json::{json, Map, Value};

use crate::contract::config::Config;
use crate::contract::error::{ApiError, RateInfo};
use crate::contract::http::{self, Request, Response};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Name of the refresh-token cookie.
pub const REFRESH_COOKIE: &str = "refreshToken";

/// A JSON object body.
pub type Body = Map<String, Value>;

/// `{ "success": true, "data": data }` with `status`.
pub fn ok(status: u16, data: Value) -> Response {
    ok_with(status, &data)
}

/// [`ok`] for any serializable `data`: the envelope
/// `{"data":…,"success":true}` is written around it directly, without
/// building a JSON tree of it and the envelope first. The bytes are those
/// serde_json gives the envelope as a map (whose keys it sorts).
pub fn ok_with(status: u16, data: &impl serde::Serialize) -> Response {
    let mut body = Vec::with_capacity(256);
    body.extend_from_slice(b"{\"data\":");
    if serde_json::to_writer(&mut body, data).is_err() {
        // Only a map with keys that are not strings fails; no handler
        // answers with one.
        body.clear();
    } else {
        body.extend_from_slice(b",\"success\":true}");
    }
    json_body(status, body)
}

/// A JSON response without the envelope (health).
pub fn json_response(status: u16, value: &Value) -> Response {
    json_body(status, serde_json::to_vec(value).unwrap_or_default())
}

/// A response of `status` carrying `body`, which is JSON.
fn json_body(status: u16, body: Vec<u8>) -> Response {
    Response {
        status,
        headers: vec![(
            "Content-Type".into(),
            "application/json; charset=utf-8".into(),
        )],
        body,
    }
}

/// The failure envelope for `err`, with `Allow` and rate-limit headers where
/// they belong.
pub fn error_response(err: &ApiError) -> Response {
    let (status, message) = err.status_and_message();
    let mut resp = json_response(status, &json!({ "success": false, "error": message }));
    match err {
        ApiError::MethodNotAllowed(allowed) => resp.set_header("Allow", allowed.join(", ")),
        ApiError::RateLimited(info) => {
            rate_headers(&mut resp, info);
            resp.set_header("Retry-After", info.retry_after_secs.max(1).to_string());
        }
        _ => {}
    }
    resp
}

/// Sets the three `X-RateLimit-*` headers.
pub fn rate_headers(resp: &mut Response, info: &RateInfo) {
    resp.set_header("X-RateLimit-Limit", info.limit.to_string());
    resp.set_header("X-RateLimit-Remaining", info.remaining.to_string());
    resp.set_header("X-RateLimit-Reset", info.reset_secs.to_string());
}

/// A host's own answer, for what it must decide before core can (settings
/// it cannot use: [`ApiError::Unavailable`]; a body over [`MAX_BODY_BYTES`]:
/// [`ApiError::BodyTooLarge`]; a body it cannot read: a
/// [`ApiError::Validation`]) or after (response headers it cannot write:
/// [`ApiError::Internal`]): the same envelope and security headers as
/// core's own answers. `config` is `None` when there is none (the settings
/// are the problem): then no `Strict-Transport-Security`.
pub fn host_error(err: &ApiError, config: Option<&Config>) -> Response {
    let mut resp = error_response(err);
    base_security_headers(&mut resp, config.is_some_and(|c| c.production));
    resp
}

/// Adds the security headers every response carries.
pub fn security_headers(resp: &mut Response, config: &Config) {
    base_security_headers(resp, config.production);
}

fn base_security_headers(resp: &mut Response, production: bool) {
    resp.set_header("X-Content-Type-Options", "nosniff");
    resp.set_header("X-Frame-Options", "DENY");
    resp.set_header("Referrer-Policy", "no-referrer");
    resp.set_header(
        "Content-Security-Policy",
        "default-src 'none'; frame-ancestors 'none'",
    );
    resp.set_header("Cache-Control", "no-store");
    if production {
        resp.set_header(
            "Strict-Transport-Security",
            "max-age=31536000; includeSubDomains",
        );
    }
}

/// The request's origin if it is one of `CORS_ORIGINS`.
pub fn allowed_origin<'r>(req: &'r Request, config: &Config) -> Option<&'r str> {
    let origin = req.header_value("origin")?;
    config
        .cors_origins
        .iter()
        .any(|o| o == origin)
        .then_some(origin)
}

/// Adds CORS headers for an allowed origin.
pub fn cors_headers(resp: &mut Response, req: &Request, config: &Config) {
    if let Some(origin) = allowed_origin(req, config) {
        resp.set_header("Access-Control-Allow-Origin", origin);
        resp.set_header("Access-Control-Allow-Credentials", "true");
        resp.set_header(
            "Access-Control-Expose-Headers",
            "X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After",
        );
    }
    resp.add_header("Vary", "Origin");
}

/// The answer to a CORS preflight on a known route.
pub fn preflight(req: &Request, config: &Config, allowed: &[&str]) -> Response {
    let mut resp = Response {
        status: 204,
        headers: vec![],
        body: vec![],
    };
    if allowed_origin(req, config).is_some() {
        let mut methods = allowed.to_vec();
        methods.push("OPTIONS");
        resp.set_header("Access-Control-Allow-Methods", methods.join(", "));
        resp.set_header(
            "Access-Control-Allow-Headers",
            "Content-Type, Authorization, X-API-Key, X-Device-Token",
        );
        resp.set_header("Access-Control-Max-Age", "600");
    }
    resp
}

/// CSRF check for requests that authenticate by cookie: the `Origin` must be
/// an allowed origin or this service's own.
pub fn check_csrf(req: &Request, config: &Config) -> Result<(), ApiError> {
    let Some(origin) = req.header_value("origin") else {
        return Err(ApiError::CsrfOrigin);
    };
    if config.cors_origins.iter().any(|o| o == origin) {
        return Ok(());
    }
    let host = req.header_value("host").unwrap_or("");
    let same = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .is_some_and(|h| !host.is_empty() && h.eq_ignore_ascii_case(host));
    if same {
        Ok(())
    } else {
        Err(ApiError::CsrfOrigin)
    }
}

/// The value of cookie `name`, if sent (the first `Cookie` header that has
/// it; see [`http::cookie_value`]).
pub fn cookie(req: &Request, name: &str) -> Option<String> {
    req.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("cookie"))
        .find_map(|(_, v)| http::cookie_value(v, name))
        .map(str::to_string)
}

/// `Set-Cookie` for a new refresh token.
pub fn refresh_cookie(config: &Config, token: &str) -> String {
    format!(
        "{REFRESH_COOKIE}={token}; HttpOnly; SameSite=Strict; Path={}/auth; Max-Age={}{}",
        config.base_path,
        crate::crypto::tokens::TokenKind::Refresh.lifetime_secs(),
        if config.production { "; Secure" } else { "" }
    )
}

/// `Set-Cookie` that removes the refresh cookie.
pub fn clear_refresh_cookie(config: &Config) -> String {
    format!(
        "{REFRESH_COOKIE}=; HttpOnly; SameSite=Strict; Path={}/auth; Max-Age=0{}",
        config.base_path,
        if config.production { "; Secure" } else { "" }
    )
}

/// The client address: the peer, or — when `TRUST_PROXY` is on — the last
/// `X-Forwarded-For` entry, the address the trusted proxy itself saw (it
/// appends it). Entries to its left come from the client and are never
/// believed, so a client cannot pick its own rate-limit key. Several
/// `X-Forwarded-For` header lines count as one list, in order.
pub fn client_ip(req: &Request, config: &Config) -> String {
    if config.trust_proxy {
        let last = req
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("x-forwarded-for"))
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .rfind(|v| !v.is_empty());
        if let Some(last) = last.filter(|v| v.len() <= 64) {
            return last.to_string();
        }
    }
    req.peer.clone().unwrap_or_else(|| "unknown".to_string())
}

/// The body as a JSON object. An empty body is an empty object; anything
/// that is not a JSON object (or is sent with a non-JSON content type) is
/// `Validation error: body must be a JSON object`.
pub fn parse_body(req: &Request) -> Result<Body, ApiError> {
    if req.body.len() > MAX_BODY_BYTES {
        return Err(ApiError::BodyTooLarge);
    }
    let bad = || ApiError::validation("body must be a JSON object");
    if let Some(ct) = req.header_value("content-type") {
        let ct = ct.to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !(essence == "application/json" || essence.ends_with("+json")) {
            return Err(bad());
        }
    }
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Checked>(&req.body) {
        Ok(Checked(Value::Object(map))) => Ok(map),
        Err(e) if e.to_string().starts_with(DUPLICATE_KEYS) => {
            Err(ApiError::validation(DUPLICATE_KEYS))
        }
        _ => Err(bad()),
    }
}

/// The detail of the error for a body in which some object (at any depth)
/// names one key twice.
const DUPLICATE_KEYS: &str = "body has duplicate keys";

/// A JSON value parsed with every object checked for duplicate keys
/// (`serde_json` on its own keeps the last value, so `{"code":"1","code":"2"}`
/// would mean different things to different parsers on the way).
struct Checked(Value);

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor).map(Checked)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Checked(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(serde::de::Error::custom(DUPLICATE_KEYS));
            }
            let Checked(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// Optional string field; a present non-string is a validation error.
pub fn opt_str(body: &Body, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::validation(format!("{name} must be a string"))),
    }
}

/// Required, non-empty string field.
pub fn req_str(body: &Body, name: &str) -> Result<String, ApiError> {
    match opt_str(body, name)? {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(ApiError::validation(format!("{name} is required"))),
    }
}

/// The first present of several alternative names for one field.
pub fn req_str_any(body: &Body, names: &[&str]) -> Result<String, ApiError> {
    for name in names {
        if let Some(s) = opt_str(body, name)? {
            if !s.trim().is_empty() {
                return Ok(s);
            }
        }
    }
    Err(ApiError::validation(format!("{} is required", names[0])))
}

/// A required non-empty array of names, each one of `allowed`, without
/// repeats (order kept); else `Validation error: <name> must be a non-empty
/// array of: <allowed>`.
pub fn req_names(body: &Body, name: &str, allowed: &[&str]) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::validation(format!(
            "{name} must be a non-empty array of: {}",
            allowed.join(", ")
        ))
    };
    let list = body.get(name).and_then(Value::as_array).ok_or_else(bad)?;
    let mut out: Vec<String> = Vec::new();
    for v in list {
        let v = v.as_str().filter(|v| allowed.contains(v)).ok_or_else(bad)?;
        if !out.iter().any(|o| o == v) {
            out.push(v.to_string());
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Optional boolean field (default false).
pub fn opt_bool(body: &Body, name: &str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::validation(format!("{name} must be a boolean"))),
    }
}

/// The bearer token of the `Authorization` header, if any (see
/// [`http::bearer_token`]).
pub fn bearer(req: &Request) -> Option<&str> {
    http::bearer_token(req.header_value("authorization")?)
}

/// `+1555****4567`: the first and last four characters shown.
pub fn mask_phone(phone: &str) -> String {
    let chars: Vec<char> = phone.chars().collect();
    if chars.len() <= 8 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 8))
}

/// `ali***@example.com`: the first three characters of the local part.
pub fn mask_email(email: &str) -> String {
    match email.split_once('@') {
        Some((local, domain)) => {
            let head: String = local.chars().take(3).collect();
            format!("{head}***@{domain}")
        }
        None => "***".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask_phone("+15551234567"), "+155****4567");
        assert_eq!(mask_email("alice@example.com"), "ali***@example.com");
        assert_eq!(mask_email("al@example.com"), "al***@example.com");
    }

    #[test]
    fn body_parsing() {
        let r = Request::new("POST", "/").json(r#"{"a":"b"}"#);
        assert_eq!(
            opt_str(&parse_body(&r).unwrap(), "a").unwrap().as_deref(),
            Some("b")
        );
        let r = Request::new("POST", "/").json("[1]");
        assert_eq!(
            parse_body(&r),
            Err(ApiError::validation("body must be a JSON object"))
        );
        let r = Request::new("POST", "/")
            .header("content-type", "text/plain")
            .json("{}");
        assert!(parse_body(&Request {
            headers: vec![("Content-Type".into(), "text/plain".into())],
            ..r
        })
        .is_err());
        let r = Request::new("POST", "/").json(r#"{"a":1}"#);
        assert_eq!(
            req_str(&parse_body(&r).unwrap(), "a"),
            Err(ApiError::validation("a must be a string"))
        );
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let dup = Err(ApiError::validation("body has duplicate keys"));
        for body in [
            r#"{"a":1,"a":1}"#,
            r#"{"a":"x","b":{"c":1,"c":2}}"#,
            r#"{"a":[{"k":1},{"k":1,"k":2}]}"#,
            r#"{"\u0061":1,"a":2}"#,
        ] {
            let r = Request::new("POST", "/").json(body);
            assert_eq!(parse_body(&r), dup, "{body}");
        }
        // Same key in sibling objects is fine; so are numbers of every kind.
        let r = Request::new("POST", "/").json(r#"{"a":{"k":1},"b":{"k":-2.5e3},"c":null}"#);
        let m = parse_body(&r).unwrap();
        assert_eq!(m["b"]["k"], serde_json::json!(-2500.0));
        // Too deep or out of range: not a JSON object we accept.
        let deep = format!("{}1{}", "{\"a\":".repeat(200), "}".repeat(200));
        let r = Request::new("POST", "/").json(&deep);
        assert_eq!(
            parse_body(&r),
            Err(ApiError::validation("body must be a JSON object"))
        );
        let r = Request::new("POST", "/").json(r#"{"a":1e400}"#);
        assert!(parse_body(&r).is_err());
    }

    #[test]
    fn the_envelope_is_written_as_serde_json_writes_the_map() {
        for data in [
            json!({ "user": { "id": "u1", "email": "a\"b@example.com" }, "n": 1 }),
            json!([1, "two", null]),
            json!("text"),
            json!(null),
        ] {
            let want = serde_json::to_vec(&json!({ "success": true, "data": data })).unwrap();
            let got = ok(201, data.clone());
            assert_eq!(got.status, 201);
            assert_eq!(
                String::from_utf8(got.body).unwrap(),
                String::from_utf8(want).unwrap()
            );
            assert_eq!(
                got.headers,
                json_response(201, &data).headers,
                "same headers as any JSON response"
            );
        }
    }

    #[test]
    fn cookies_and_bearer() {
        let r = Request::new("GET", "/")
            .header("Cookie", "a=1; refreshToken=xyz; b=2")
            .header("Authorization", "Bearer abc");
        assert_eq!(cookie(&r, "refreshToken").as_deref(), Some("xyz"));
        assert_eq!(bearer(&r), Some("abc"));
    }
}
