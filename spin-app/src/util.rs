//! Target-independent helpers of the host driver.

use tfa_core::contract::config::{Settings, SETTING_NAMES};

/// The most bytes one `wasi:io` `blocking-write-and-flush` call may take:
/// bodies (the API's responses, outbound request bodies) are written in
/// chunks of this size.
pub const MAX_BLOCKING_WRITE: usize = 4096;

/// Writes `body` through `write` (a stream's `blocking-write-and-flush`) in
/// chunks of at most [`MAX_BLOCKING_WRITE`] bytes; stops at the first
/// error and returns it. An empty body makes no call. The response body
/// (`component.rs`) and outbound request bodies (`outbound.rs`) go out
/// this way; their streams are of two bindings (spin-sdk's and `wasi`'s),
/// hence the closure.
pub fn write_chunked<E>(
    body: &[u8],
    mut write: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    body.chunks(MAX_BLOCKING_WRITE).try_for_each(&mut write)
}

/// Whether a request may carry a body: anything but a `GET` or `HEAD`
/// without `content-length` or `transfer-encoding`. HTTP/1.1 gives such a
/// request no body (RFC 9112, section 6.3), and the API reads none from a
/// `GET` or `HEAD`; skipping the read saves the five to eight `wasi:io`
/// calls of an empty body stream (about 2 % of a `GET /auth/me`'s
/// instructions, callgrind). A `GET` that announces a body still has it
/// read, so a too-large one is still refused.
pub fn may_have_body(method: &str, headers: &[(String, String)]) -> bool {
    !matches!(method, "GET" | "HEAD")
        || headers.iter().any(|(name, _)| {
            name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
        })
}

/// Collects the settings from the component's variables (`variables`:
/// name and value pairs, names in lower case as Spin spells them) and its
/// environment (`env`: NAME and value pairs): for each setting of
/// [`SETTING_NAMES`], its variable, else its environment variable. Empty
/// (or blank) values count as unset; pairs that name no setting are
/// ignored.
///
/// Each list is walked once and blank values are dropped before any name is
/// compared: a request pays for the few settings that are set, not for
/// every variable the manifest declares (Spin's `get-all` lists all of
/// them, most empty). Values are moved into their slots, not copied.
pub fn collect_settings(
    variables: impl IntoIterator<Item = (String, String)>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Settings {
    let mut settings = Settings::new();
    for (key, value) in variables {
        if value.trim().is_empty() {
            continue;
        }
        if let Some(slot) = SETTING_NAMES.iter().position(|n| is_variable_of(&key, n)) {
            settings.set_slot(slot, value);
        }
    }
    for (key, value) in env {
        if value.trim().is_empty() {
            continue;
        }
        if let Some(slot) = Settings::slot(&key) {
            if settings.get_slot(slot).is_none() {
                settings.set_slot(slot, value);
            }
        }
    }
    settings
}

/// Whether `variable` is the Spin variable of setting `name`: the same
/// name in lower case.
fn is_variable_of(variable: &str, name: &str) -> bool {
    variable.len() == name.len()
        && variable
            .bytes()
            .zip(name.bytes())
            .all(|(v, n)| v == n.to_ascii_lowercase())
}

/// The SMTP server's address from the manifest variable `email_outbound_host`
/// (`tcp://IP:PORT`, the entry `spin.toml` adds to `allowed_outbound_hosts`).
///
/// Spin 4.x gives components no name lookup (`ip-name-lookup` answers
/// `permanent-resolver-failure`) and checks a TCP connect by the *address*,
/// so an SMTP server is reachable under Spin only by an IP that this entry
/// allows. When the entry holds an IP literal:
/// - with neither `EMAIL_HOST` nor `EMAIL_SERVICE` set, it is the server:
///   `EMAIL_HOST` (and `EMAIL_PORT`, if unset) are taken from it, so this one
///   variable (plus `EMAIL_FROM`) is enough;
/// - the component connects to that address whatever `EMAIL_HOST` says;
///   `EMAIL_HOST` stays the name checked in the server's TLS certificate.
///
/// Anything else (unset, the manifest's `tcp://smtp.invalid:587` default, a
/// name, a range or wildcard) changes nothing and gives `None`.
pub fn smtp_address(settings: &mut Settings, entry: Option<&str>) -> Option<std::net::SocketAddr> {
    let rest = entry?.trim().strip_prefix("tcp://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let ip: std::net::IpAddr = match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().ok()?.into(),
        None => host.parse::<std::net::Ipv4Addr>().ok()?.into(),
    };
    if !settings.is_set("EMAIL_HOST") && !settings.is_set("EMAIL_SERVICE") {
        settings.set("EMAIL_HOST", ip.to_string());
        if !settings.is_set("EMAIL_PORT") {
            settings.set("EMAIL_PORT", port.to_string());
        }
    }
    Some(std::net::SocketAddr::new(ip, port))
}

/// The IP of a `host:port` peer address (`[v6]:port`, `v4:port`, or a bare
/// address without port).
pub fn strip_port(addr: &str) -> String {
    let addr = addr.trim();
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match addr.rsplit_once(':') {
        // Exactly one colon: IPv4 or a host name with a port.
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => {
            host.to_string()
        }
        _ => addr.to_string(),
    }
}

/// The parts of an absolute `http(s)` URL as `wasi:http` wants them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts {
    /// `true` for `https`.
    pub https: bool,
    /// `host[:port]`.
    pub authority: String,
    /// Path and query, starting with `/`.
    pub path_with_query: String,
}

/// Splits an absolute `http://` or `https://` URL.
pub fn split_url(url: &str) -> Result<UrlParts, String> {
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("not an http(s) URL: {url:?}"));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("unsupported authority in URL {url:?}"));
    }
    let mut path = rest[end..].split('#').next().unwrap_or("").to_string();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    Ok(UrlParts {
        https,
        authority: authority.to_string(),
        path_with_query: path,
    })
}

/// At most `max` characters of a response body, lossily decoded, on one line.
pub fn excerpt(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

/// Whether a response with this status may carry a body (and so a
/// `Content-Length`).
pub fn status_has_body(status: u16) -> bool {
    !(status < 200 || status == 204 || status == 304)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_or_head_without_framing_headers_skips_its_body() {
        let none: Vec<(String, String)> = vec![("authorization".into(), "Bearer x".into())];
        let sized = vec![("Content-Length".into(), "12".into())];
        let chunked = vec![("transfer-encoding".into(), "chunked".into())];
        assert!(!may_have_body("GET", &none));
        assert!(!may_have_body("HEAD", &none));
        assert!(may_have_body("GET", &sized));
        assert!(may_have_body("HEAD", &chunked));
        for method in ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            assert!(may_have_body(method, &none), "{method}");
        }
    }

    #[test]
    fn bodies_are_written_in_chunks_of_at_most_4096_bytes_until_an_error() {
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut seen = Vec::new();
        write_chunked(&body, |c| {
            seen.push(c.to_vec());
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(
            seen.iter().map(Vec::len).collect::<Vec<_>>(),
            [4096, 4096, 1808]
        );
        assert_eq!(seen.concat(), body);

        let mut calls = 0;
        let r = write_chunked(&body, |_| {
            calls += 1;
            if calls == 2 {
                Err("closed")
            } else {
                Ok(())
            }
        });
        assert_eq!((r, calls), (Err("closed"), 2));

        let mut empty_calls = 0;
        write_chunked(&[], |_| {
            empty_calls += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(empty_calls, 0);
    }

    #[test]
    fn settings_prefer_variables_and_skip_empty() {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let vars = pairs(&[
            ("jwt_issuer", "var"),
            ("port", " "),
            ("log_level", ""),
            ("unrelated", "x"),
            ("TOTP_ISSUER", "upper case is not a variable name"),
        ]);
        let env = pairs(&[
            ("JWT_ISSUER", "env"),
            ("PORT", "4000"),
            ("NODE_ENV", ""),
            ("LOG_LEVEL", "debug"),
            ("jwt_audience", "lower case is not the setting's name"),
            ("UNRELATED", "y"),
        ]);
        let s = collect_settings(vars, env);
        assert_eq!(s.get("JWT_ISSUER"), Some("var"));
        assert_eq!(s.get("PORT"), Some("4000"));
        assert_eq!(s.get("LOG_LEVEL"), Some("debug"));
        let set: Vec<&str> = SETTING_NAMES
            .iter()
            .copied()
            .filter(|n| s.is_set(n))
            .collect();
        assert_eq!(set, ["PORT", "JWT_ISSUER", "LOG_LEVEL"]);
    }

    #[test]
    fn the_smtp_address_comes_from_an_ip_entry_only() {
        let set = |s: &Settings| -> Vec<(&str, String)> {
            SETTING_NAMES
                .iter()
                .filter_map(|n| Some((*n, s.get(n)?.to_string())))
                .collect()
        };
        let mut none = Settings::new();
        for entry in [
            None,
            Some("tcp://smtp.invalid:587"),
            Some("tcp://smtp.example.com:587"),
            Some("tcp://10.0.0.0/8:587"),
            Some("tcp://*:587"),
            Some("tcp://127.0.0.1:*"),
            Some("tcp://127.0.0.1:0"),
            Some("tcp://127.0.0.1"),
            Some("http://127.0.0.1:25"),
            Some("tcp://::1:25"),
        ] {
            assert_eq!(smtp_address(&mut none, entry), None, "{entry:?}");
        }
        assert!(set(&none).is_empty());

        // Alone, it is the server.
        let mut alone = Settings::new();
        let a = smtp_address(&mut alone, Some(" tcp://203.0.113.7:2525 "));
        assert_eq!(a, Some("203.0.113.7:2525".parse().unwrap()));
        assert_eq!(
            set(&alone),
            [
                ("EMAIL_HOST", "203.0.113.7".to_string()),
                ("EMAIL_PORT", "2525".to_string())
            ]
        );

        // An EMAIL_PORT of its own stays.
        let mut port = Settings::new();
        port.set("EMAIL_PORT", "25");
        smtp_address(&mut port, Some("tcp://203.0.113.7:2525"));
        assert_eq!(port.get("EMAIL_PORT"), Some("25"));
        assert_eq!(port.get("EMAIL_HOST"), Some("203.0.113.7"));

        // Beside EMAIL_HOST (or a preset), only the address to connect to.
        for key in ["EMAIL_HOST", "EMAIL_SERVICE"] {
            let mut named = Settings::new();
            named.set(key, "smtp.example.com");
            let a = smtp_address(&mut named, Some("tcp://[2001:db8::7]:465"));
            assert_eq!(a, Some("[2001:db8::7]:465".parse().unwrap()));
            assert_eq!(set(&named), [(key, "smtp.example.com".to_string())]);
        }
    }

    #[test]
    fn peer_ports_are_stripped() {
        assert_eq!(strip_port("127.0.0.1:5000"), "127.0.0.1");
        assert_eq!(strip_port("[::1]:5000"), "::1");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("10.0.0.1"), "10.0.0.1");
    }

    #[test]
    fn urls_split() {
        let p = split_url("https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json").unwrap();
        assert!(p.https);
        assert_eq!(p.authority, "api.twilio.com");
        assert_eq!(p.path_with_query, "/2010-04-01/Accounts/AC1/Messages.json");
        let p = split_url("http://127.0.0.1:8080?x=1").unwrap();
        assert!(!p.https);
        assert_eq!(p.authority, "127.0.0.1:8080");
        assert_eq!(p.path_with_query, "/?x=1");
        assert!(split_url("ftp://x").is_err());
        assert!(split_url("http://u@h/").is_err());
    }

    #[test]
    fn excerpts_are_short_single_lines() {
        assert_eq!(excerpt(b"ab\ncd", 10), "ab cd");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
    }
}
