//! The HTTP shapes that cross the boundary between a host and `core`.
//!
//! A host turns whatever its platform gives it into a [`Request`], calls
//! [`crate::Service::handle`], and writes the [`Response`] it gets back. Core
//! never parses sockets or owns buffers beyond these values.

/// One HTTP request as the host received it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Upper-case method, e.g. `POST`.
    pub method: String,
    /// Path and optional query exactly as received, e.g. `/api/auth/login?x=1`.
    pub path: String,
    /// Header names in any case; values as received.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Vec<u8>,
    /// The peer address (IP without port) as seen by the host, if known.
    pub peer: Option<String>,
}

impl Request {
    /// A request with no headers, body or peer.
    pub fn new(method: &str, path: &str) -> Self {
        Request {
            method: method.to_ascii_uppercase(),
            path: path.to_string(),
            ..Default::default()
        }
    }

    /// Adds a header (builder style).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Sets a JSON body and its content type (builder style).
    pub fn json(mut self, body: &str) -> Self {
        self.body = body.as_bytes().to_vec();
        self.header("content-type", "application/json")
    }

    /// Sets the peer address (builder style).
    pub fn peer(mut self, ip: &str) -> Self {
        self.peer = Some(ip.to_string());
        self
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }

    /// The value of query parameter `name` (no percent-decoding beyond `+`).
    pub fn query(&self, name: &str) -> Option<String> {
        self.query_all(name).into_iter().next()
    }

    /// Every value of query parameter `name`, in order (no percent-decoding
    /// beyond `+`).
    pub fn query_all(&self, name: &str) -> Vec<String> {
        let Some((_, q)) = self.path.split_once('?') else {
            return Vec::new();
        };
        q.split('&')
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (k == name).then(|| v.replace('+', " "))
            })
            .collect()
    }
}

/// The token of one `Authorization` header value with the `Bearer` scheme
/// (the scheme in any case, the value and the token trimmed); None for
/// another scheme or an empty token. The API and the edge filter both read
/// tokens with this.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The value of cookie `name` in one `Cookie` header value: names and
/// values trimmed, one pair of surrounding double quotes removed (RFC 6265's
/// quoted cookie-value); None when absent or empty. The API (refresh
/// cookie) and the edge filter (token cookie) both read cookies with this.
pub fn cookie_value<'h>(cookie_header: &'h str, name: &str) -> Option<&'h str> {
    cookie_header.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or(v);
        (k.trim() == name && !v.is_empty()).then_some(v)
    })
}

/// One HTTP response for the host to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, in order; a name may repeat (`Set-Cookie`).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Sets header `name`, replacing any earlier value.
    pub fn set_header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.into()));
    }

    /// Appends header `name` even if present (for `Set-Cookie`).
    pub fn add_header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.push((name.to_string(), value.into()));
    }

    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token(" BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token(""), None);
    }

    #[test]
    fn cookie_values() {
        assert_eq!(cookie_value("a=1; tok=xyz; b=2", "tok"), Some("xyz"));
        assert_eq!(cookie_value("tok = xyz ", "tok"), Some("xyz"));
        assert_eq!(cookie_value(r#"tok="xyz""#, "tok"), Some("xyz"));
        assert_eq!(cookie_value("a=1; tok=", "tok"), None);
        assert_eq!(cookie_value(r#"tok="""#, "tok"), None);
        assert_eq!(cookie_value("atok=1; toka=2", "tok"), None);
        assert_eq!(cookie_value("tok", "tok"), None);
        assert_eq!(cookie_value("", "tok"), None);
        // The value may hold '=' (base64 padding).
        assert_eq!(cookie_value("tok=a==", "tok"), Some("a=="));
    }
}
