//! Which hosts the component may call over `wasi:http/outgoing-handler`.
//!
//! Patterns are Spin's `allowed_outbound_hosts` entries:
//! `scheme://host[:port]`, where the scheme is `http`, `https` or `*`, the
//! host is a name, an IP, `*` or `*.suffix`, and the port is a number or `*`
//! (no port = the scheme's default). They come from `spin.toml` (each
//! component's own list, `{{ variable }}` templates resolved) and from the
//! setting `ALLOWED_OUTBOUND_HOSTS` (comma-separated). Anything else is
//! refused with `HttpRequestDenied`, which the component sees as an error
//! value, never a trap.

use crate::manifest::Manifest;
use std::collections::BTreeMap;
use std::fmt;

/// One allowed-host pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    scheme: Option<String>,
    host: String,
    port: Option<u16>,
    raw: String,
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl HostPattern {
    /// Parses one pattern.
    pub fn parse(raw: &str) -> Result<HostPattern, String> {
        let raw = raw.trim();
        let (scheme, rest) = raw
            .split_once("://")
            .ok_or_else(|| format!("{raw:?}: expected scheme://host[:port]"))?;
        let scheme = scheme.to_ascii_lowercase();
        let scheme = match scheme.as_str() {
            "*" => None,
            "http" | "https" | "tcp" => Some(scheme),
            _ => return Err(format!("{raw:?}: scheme must be http, https, tcp or *")),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.is_empty() {
            return Err(format!("{raw:?}: no path allowed"));
        }
        let (host, port) = split_host_port(rest);
        let port = match port {
            None => match &scheme {
                Some(s) => default_port(s),
                None => return Err(format!("{raw:?}: give a port (or *) with scheme *")),
            },
            Some("*") => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| format!("{raw:?}: bad port {p:?}"))?,
            ),
        };
        Ok(HostPattern {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            raw: raw.to_string(),
        })
    }

    /// Whether the pattern can allow TCP connections (`tcp://`, `*://`):
    /// the mailer component's kind of outbound traffic.
    pub fn for_tcp(&self) -> bool {
        self.scheme.as_deref().is_none_or(|s| s == "tcp")
    }

    /// Whether the pattern can allow HTTP requests (`http://`, `https://`,
    /// `*://`): the API component's kind.
    pub fn for_http(&self) -> bool {
        self.scheme.as_deref() != Some("tcp")
    }

    /// Whether a request to `scheme://host:port` matches.
    pub fn matches(&self, scheme: &str, host: &str, port: u16) -> bool {
        if let Some(s) = &self.scheme {
            if s != scheme {
                return false;
            }
        }
        if let Some(p) = self.port {
            if p != port {
                return false;
            }
        }
        let host = host.to_ascii_lowercase();
        if self.host == "*" {
            return true;
        }
        if let Some(suffix) = self.host.strip_prefix("*.") {
            return host.ends_with(&format!(".{suffix}"));
        }
        self.host == host
    }
}

/// `host[:port]`, with bracketed IPv6 hosts.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    if let Some(rest) = s.strip_prefix('[') {
        if let Some((h, tail)) = rest.split_once(']') {
            return (h, tail.strip_prefix(':'));
        }
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (s, None),
    }
}

/// The allow-list.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    patterns: Vec<HostPattern>,
}

impl AllowList {
    /// A list of already-parsed patterns.
    pub fn new(patterns: Vec<HostPattern>) -> AllowList {
        AllowList { patterns }
    }

    /// Whether `uri` (absolute) may be called.
    pub fn allows(&self, uri: &http::Uri) -> bool {
        let Some(scheme) = uri.scheme_str() else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        let Some(host) = uri.host() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let Some(port) = uri.port_u16().or_else(|| default_port(&scheme)) else {
            return false;
        };
        self.patterns.iter().any(|p| p.matches(&scheme, host, port))
    }

    /// Whether a TCP connection to `addr` may be opened (`tcp://` patterns,
    /// or `*://`, matched against the IP address as Spin does).
    pub fn allows_tcp(&self, addr: &std::net::SocketAddr) -> bool {
        let ip = addr.ip().to_string();
        self.patterns.iter().any(|p| {
            p.scheme.as_deref().is_none_or(|s| s == "tcp") && p.matches("tcp", &ip, addr.port())
        })
    }

    /// Whether the operator named the destination of `uri` explicitly: a
    /// matching pattern whose host is not a wildcard (`*`, `*.suffix`).
    /// Such destinations are exempt from the connect-time block list.
    pub fn explicit(&self, uri: &http::Uri) -> bool {
        let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
            return false;
        };
        let scheme = scheme.to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let Some(port) = uri.port_u16().or_else(|| default_port(&scheme)) else {
            return false;
        };
        self.patterns
            .iter()
            .any(|p| !p.host.starts_with('*') && p.matches(&scheme, host, port))
    }

    /// As [`AllowList::explicit`], for a TCP connection to `addr`.
    pub fn explicit_tcp(&self, addr: &std::net::SocketAddr) -> bool {
        let ip = addr.ip().to_string();
        self.patterns.iter().any(|p| {
            !p.host.starts_with('*')
                && p.scheme.as_deref().is_none_or(|s| s == "tcp")
                && p.matches("tcp", &ip, addr.port())
        })
    }

    /// The patterns, for the start-up log.
    pub fn patterns(&self) -> &[HostPattern] {
        &self.patterns
    }
}

/// Replaces `{{ name }}` with `lookup(name)`; `None` when a name is unknown.
pub fn expand_template(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}")?;
        out.push_str(&lookup(after[..end].trim())?);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Some(out)
}

/// Reads the `allowed_outbound_hosts` of the component `id` (`[component.<id>]`)
/// from the Spin manifest, resolving templates with
/// `env(UPPER_NAME)` and then the manifest's `[variables]` defaults. Entries
/// that resolve to nothing are skipped; unparseable ones are reported in
/// `warnings`. A manifest without that component is an error.
pub fn from_manifest(
    manifest: &Manifest,
    id: &str,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Vec<HostPattern>, String> {
    let doc = &manifest.doc;
    let defaults: BTreeMap<String, String> = doc
        .get("variables")
        .and_then(|v| v.as_table())
        .map(|t| {
            t.iter()
                .filter_map(|(k, v)| {
                    let d = v.as_table()?.get("default")?.as_str()?;
                    Some((k.clone(), d.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    let lookup = |name: &str| -> Option<String> {
        env(&name.to_ascii_uppercase())
            .filter(|v| !v.trim().is_empty())
            .or_else(|| defaults.get(name).cloned())
    };
    let comp = manifest
        .component(id)
        .ok_or_else(|| format!("{} has no [component.{id}]", manifest.path.display()))?;
    let hosts = comp
        .get("allowed_outbound_hosts")
        .and_then(|h| h.as_array())
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for h in hosts {
        let Some(raw) = h.as_str() else { continue };
        let Some(expanded) = expand_template(raw, &lookup) else {
            warnings.push(format!(
                "allowed_outbound_hosts of {id}: cannot resolve {raw:?}"
            ));
            continue;
        };
        if expanded.trim().is_empty() {
            continue;
        }
        match HostPattern::parse(&expanded) {
            Ok(p) if !out.contains(&p) => out.push(p),
            Ok(_) => {}
            Err(e) => warnings.push(format!("allowed_outbound_hosts of {id}: {e}")),
        }
    }
    Ok(out)
}

/// Parses a comma-separated list (the `ALLOWED_OUTBOUND_HOSTS` setting).
pub fn from_list(list: &str, warnings: &mut Vec<String>) -> Vec<HostPattern> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|s| match HostPattern::parse(s) {
            Ok(p) => Some(p),
            Err(e) => {
                warnings.push(format!("ALLOWED_OUTBOUND_HOSTS: {e}"));
                None
            }
        })
        .collect()
}

/// The gateways named by the service's settings, allowed without repeating
/// them in `ALLOWED_OUTBOUND_HOSTS`: the Twilio API base (`TWILIO_API_BASE`,
/// default `https://api.twilio.com`) as `scheme://host:port`, and the SMTP
/// server as `tcp://EMAIL_HOST:EMAIL_PORT`. TCP connections are checked by
/// IP address, so a named SMTP server is also allowed at the addresses
/// `resolve` gives for it (looked up once, at start).
pub fn gateway_patterns(
    twilio_base: Option<&str>,
    smtp: Option<(&str, u16)>,
    resolve: &dyn Fn(&str, u16) -> Vec<std::net::IpAddr>,
    warnings: &mut Vec<String>,
) -> Vec<HostPattern> {
    let mut out = Vec::new();
    if let Some(base) = twilio_base {
        let parsed = base.parse::<http::Uri>().ok().and_then(|u| {
            let scheme = u.scheme_str()?.to_ascii_lowercase();
            let host = u.host()?.to_string();
            let port = u.port_u16().or_else(|| default_port(&scheme))?;
            HostPattern::parse(&format!("{scheme}://{host}:{port}")).ok()
        });
        match parsed {
            Some(p) => out.push(p),
            None => warnings.push(format!("TWILIO_API_BASE {base:?}: not an http(s) URL")),
        }
    }
    if let Some((host, port)) = smtp {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let shown = if bare.contains(':') {
            format!("[{bare}]")
        } else {
            bare.to_string()
        };
        match HostPattern::parse(&format!("tcp://{shown}:{port}")) {
            Ok(p) => out.push(p),
            Err(e) => warnings.push(format!("EMAIL_HOST/EMAIL_PORT: {e}")),
        }
        if bare.parse::<std::net::IpAddr>().is_err() {
            let ips = resolve(bare, port);
            if ips.is_empty() {
                warnings.push(format!(
                    "EMAIL_HOST {bare:?} does not resolve now; e-mail will fail until it does \
                     and the host is restarted"
                ));
            }
            for ip in ips {
                let p = match ip {
                    std::net::IpAddr::V4(v4) => format!("tcp://{v4}:{port}"),
                    std::net::IpAddr::V6(v6) => format!("tcp://[{v6}]:{port}"),
                };
                if let Ok(p) = HostPattern::parse(&p) {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(patterns: &[&str], uri: &str) -> bool {
        let list = AllowList::new(
            patterns
                .iter()
                .map(|p| HostPattern::parse(p).unwrap())
                .collect(),
        );
        list.allows(&uri.parse().unwrap())
    }

    #[test]
    fn patterns_match_like_spin() {
        let twilio = ["https://api.twilio.com"];
        assert!(allows(&twilio, "https://api.twilio.com/2010-04-01/x"));
        assert!(allows(&twilio, "https://API.twilio.com:443/"));
        assert!(!allows(&twilio, "http://api.twilio.com/"));
        assert!(!allows(&twilio, "https://api.twilio.com:8443/"));
        assert!(!allows(&twilio, "https://evil.com/"));
        let local = ["http://127.0.0.1:*"];
        assert!(allows(&local, "http://127.0.0.1:9999/sms"));
        assert!(!allows(&local, "https://127.0.0.1:9999/sms"));
        assert!(!allows(&local, "http://127.0.0.2:9999/sms"));
        let wild = ["https://*.example.com", "*://*:8080"];
        assert!(allows(&wild, "https://a.example.com/"));
        assert!(!allows(&wild, "https://example.com/"));
        assert!(allows(&wild, "http://anything:8080/"));
        assert!(!allows(&[], "https://api.twilio.com/"));
    }

    #[test]
    fn bad_patterns_are_rejected() {
        assert!(HostPattern::parse("api.twilio.com").is_err());
        assert!(HostPattern::parse("ftp://x").is_err());
        assert!(HostPattern::parse("*://x").is_err());
        assert!(HostPattern::parse("https://x/path").is_err());
        assert!(HostPattern::parse("https://x:99999").is_err());
    }

    #[test]
    fn templates_expand() {
        let lookup = |n: &str| (n == "a").then(|| "X".to_string());
        assert_eq!(
            expand_template("p{{ a }}q", &lookup).as_deref(),
            Some("pXq")
        );
        assert_eq!(expand_template("{{b}}", &lookup), None);
        assert_eq!(expand_template("plain", &lookup).as_deref(), Some("plain"));
    }

    #[test]
    fn manifest_lists_resolve() {
        let dir = std::env::temp_dir().join(format!("tfa-outbound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spin.toml");
        std::fs::write(
            &path,
            r#"
spin_manifest_version = 2
[variables]
extra = { default = "https://api.twilio.com" }
empty = { default = "" }
[component.a]
allowed_outbound_hosts = ["https://api.twilio.com", "{{ extra }}", "{{ empty }}", "bogus"]
[component.b]
allowed_outbound_hosts = ["tcp://192.0.2.1:25"]
"#,
        )
        .unwrap();
        let manifest = Manifest::read(&path).unwrap();
        let mut warnings = Vec::new();
        let env = |n: &str| (n == "EXTRA").then(|| "http://127.0.0.1:8081".to_string());
        let got = from_manifest(&manifest, "a", &env, &mut warnings).unwrap();
        let raw: Vec<String> = got.iter().map(|p| p.to_string()).collect();
        assert_eq!(raw, ["https://api.twilio.com", "http://127.0.0.1:8081"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // Each component has its own list.
        let got = from_manifest(&manifest, "b", &env, &mut warnings).unwrap();
        assert_eq!(got, [HostPattern::parse("tcp://192.0.2.1:25").unwrap()]);
        assert!(got[0].for_tcp() && !got[0].for_http());
        let any = HostPattern::parse("*://*:8080").unwrap();
        assert!(any.for_tcp() && any.for_http());
        let err = from_manifest(&manifest, "c", &env, &mut warnings).unwrap_err();
        assert!(err.ends_with("has no [component.c]"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gateways_from_settings() {
        let mut w = Vec::new();
        let resolve = |h: &str, _p: u16| {
            assert_eq!(h, "smtp.example.com");
            vec!["192.0.2.7".parse().unwrap()]
        };
        let got = gateway_patterns(
            Some("http://127.0.0.1:8081"),
            Some(("smtp.example.com", 587)),
            &resolve,
            &mut w,
        );
        let list = AllowList::new(got);
        assert!(w.is_empty(), "{w:?}");
        assert!(list.allows(&"http://127.0.0.1:8081/2010-04-01/x".parse().unwrap()));
        assert!(!list.allows(&"http://127.0.0.1:8082/".parse().unwrap()));
        assert!(list.allows_tcp(&"192.0.2.7:587".parse().unwrap()));
        assert!(!list.allows_tcp(&"192.0.2.7:25".parse().unwrap()));
        let got = gateway_patterns(
            Some("https://api.twilio.com"),
            Some(("127.0.0.1", 2525)),
            &|_, _| panic!("no lookup for an IP"),
            &mut w,
        );
        let list = AllowList::new(got);
        assert!(list.allows(&"https://api.twilio.com/x".parse().unwrap()));
        assert!(list.allows_tcp(&"127.0.0.1:2525".parse().unwrap()));
        assert!(w.is_empty(), "{w:?}");
    }
}
