//! Network-level SSRF defence for outbound calls, applied at connect time.
//!
//! The allow-list ([`crate::outbound`]) looks at the URL; this module looks
//! at the address actually connected to. A name is resolved here, in the
//! host, and every address it gives is checked against the blocked ranges
//! ([`blocked_reason`]) *before* any connect; the connection then goes to
//! the very address checked (no second lookup, so DNS rebinding between a
//! check and the connect cannot happen). Destinations the operator named
//! explicitly (the Twilio base, the SMTP server, `ALLOWED_OUTBOUND_HOSTS` /
//! `spin.toml` entries without wildcards) and every destination when
//! `WEBHOOK_ALLOW_PRIVATE=true` are exempt.
//!
//! Test hook: `TFA_TEST_RESOLVE=name:port:addr,...` answers lookups of
//! `name:port` from the list (like `curl --resolve`; several entries for the
//! same name are given out in turn, one per lookup), and
//! `TFA_TEST_PUBLIC_ADDRS=addr,...` treats those (loopback) addresses as
//! public; `TFA_TEST_CA_FILE=path` trusts a PEM CA for outgoing HTTPS. All are refused at start unless `TFA_TEST_HOOKS=1` is also set
//! and `NODE_ENV` is not `production`, and the host logs loudly when on.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

/// Why `ip` may not be connected to, or `None` when it is public.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => blocked_v4(v4),
        IpAddr::V6(v6) => blocked_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "unspecified/this network 0.0.0.0/8"),
        ([10, 0, 0, 0], 8, "private 10.0.0.0/8"),
        ([100, 64, 0, 0], 10, "CGNAT 100.64.0.0/10"),
        ([127, 0, 0, 0], 8, "loopback 127.0.0.0/8"),
        ([169, 254, 0, 0], 16, "link-local 169.254.0.0/16"),
        ([172, 16, 0, 0], 12, "private 172.16.0.0/12"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments 192.0.0.0/24"),
        ([192, 0, 2, 0], 24, "documentation 192.0.2.0/24"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast 192.88.99.0/24"),
        ([192, 168, 0, 0], 16, "private 192.168.0.0/16"),
        ([198, 18, 0, 0], 15, "benchmarking 198.18.0.0/15"),
        ([198, 51, 100, 0], 24, "documentation 198.51.100.0/24"),
        ([203, 0, 113, 0], 24, "documentation 203.0.113.0/24"),
        ([224, 0, 0, 0], 4, "multicast 224.0.0.0/4"),
        ([240, 0, 0, 0], 4, "reserved 240.0.0.0/4 (and broadcast)"),
    ];
    RANGES
        .iter()
        .find(|(net, bits, _)| in_v4(ip, *net, *bits))
        .map(|(_, _, why)| *why)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u128::MAX << (128 - bits)
    };
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

fn v4_at(ip: Ipv6Addr, bit_offset: u32) -> Ipv4Addr {
    Ipv4Addr::from(((u128::from(ip) >> (96 - bit_offset)) & 0xffff_ffff) as u32)
}

fn blocked_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified ::");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    // Forms that embed an IPv4 address: judged by that address.
    let embedded = if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96) {
        Some(("IPv4-mapped", v4_at(ip, 96)))
    } else if in_v6(ip, [0, 0, 0, 0, 0xffff, 0, 0, 0], 96) {
        Some(("IPv4-translated", v4_at(ip, 96)))
    } else if in_v6(ip, [0, 0, 0, 0, 0, 0, 0, 0], 96) {
        Some(("IPv4-compatible", v4_at(ip, 96)))
    } else if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        Some(("NAT64", v4_at(ip, 96)))
    } else if in_v6(ip, [0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48) {
        Some(("local NAT64", v4_at(ip, 96)))
    } else if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        Some(("6to4", v4_at(ip, 16)))
    } else {
        None
    };
    if let Some((form, v4)) = embedded {
        return blocked_v4(v4).map(|_| match form {
            "IPv4-mapped" => "IPv4-mapped form of a blocked IPv4 address",
            "IPv4-translated" => "IPv4-translated form of a blocked IPv4 address",
            "IPv4-compatible" => "IPv4-compatible form of a blocked IPv4 address",
            "6to4" => "6to4 form of a blocked IPv4 address",
            _ => "NAT64 form of a blocked IPv4 address",
        });
    }
    const RANGES: &[([u16; 8], u32, &str)] = &[
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo 2001::/32"),
        (
            [0x2001, 0x0db8, 0, 0, 0, 0, 0, 0],
            32,
            "documentation 2001:db8::/32",
        ),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation 3fff::/20"),
        (
            [0x2001, 0x0002, 0, 0, 0, 0, 0, 0],
            48,
            "benchmarking 2001:2::/48",
        ),
        ([0x0100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only 100::/64"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local fc00::/7"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local fe80::/10"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local fec0::/10"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast ff00::/8"),
    ];
    RANGES
        .iter()
        .find(|(net, bits, _)| in_v6(ip, *net, *bits))
        .map(|(_, _, why)| *why)
}

/// Test-only settings (see the module documentation).
#[derive(Debug, Default)]
pub struct TestHooks {
    /// `name:port` → answers, given out in turn.
    resolve: HashMap<(String, u16), (Vec<IpAddr>, Mutex<usize>)>,
    /// Addresses treated as public.
    public: Vec<IpAddr>,
    /// `TFA_TEST_CA_FILE`: a PEM CA trusted for outgoing HTTPS besides the
    /// public roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl TestHooks {
    /// Reads `TFA_TEST_RESOLVE` / `TFA_TEST_PUBLIC_ADDRS`; an error when they
    /// are set without `TFA_TEST_HOOKS=1` or with `NODE_ENV=production`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<TestHooks, String> {
        let get = |n: &str| {
            env(n)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let resolve = get("TFA_TEST_RESOLVE");
        let public = get("TFA_TEST_PUBLIC_ADDRS");
        let ca = get("TFA_TEST_CA_FILE");
        if resolve.is_none() && public.is_none() && ca.is_none() {
            return Ok(TestHooks::default());
        }
        if get("TFA_TEST_HOOKS").as_deref() != Some("1") {
            return Err(
                "TFA_TEST_RESOLVE/TFA_TEST_PUBLIC_ADDRS/TFA_TEST_CA_FILE are test hooks: refused unless \
                 TFA_TEST_HOOKS=1 is set too"
                    .into(),
            );
        }
        if get("NODE_ENV").is_some_and(|v| v.eq_ignore_ascii_case("production")) {
            return Err(
                "TFA_TEST_RESOLVE/TFA_TEST_PUBLIC_ADDRS/TFA_TEST_CA_FILE are refused with NODE_ENV=production"
                    .into(),
            );
        }
        let mut hooks = TestHooks::default();
        if let Some(path) = ca {
            hooks.ca_pem =
                Some(std::fs::read(&path).map_err(|e| format!("TFA_TEST_CA_FILE {path}: {e}"))?);
        }
        for entry in resolve.iter().flat_map(|r| r.split(',')) {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let mut parts = entry.splitn(3, ':');
            let (Some(name), Some(port), Some(addr)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!(
                    "TFA_TEST_RESOLVE: {entry:?}: expected name:port:addr"
                ));
            };
            let port: u16 = port
                .parse()
                .map_err(|_| format!("TFA_TEST_RESOLVE: {entry:?}: bad port"))?;
            let addr: IpAddr = addr
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| format!("TFA_TEST_RESOLVE: {entry:?}: bad address"))?;
            hooks
                .resolve
                .entry((name.to_ascii_lowercase(), port))
                .or_insert_with(|| (Vec::new(), Mutex::new(0)))
                .0
                .push(addr);
        }
        for a in public.iter().flat_map(|p| p.split(',')) {
            let a = a.trim();
            if a.is_empty() {
                continue;
            }
            hooks.public.push(
                a.parse()
                    .map_err(|_| format!("TFA_TEST_PUBLIC_ADDRS: bad address {a:?}"))?,
            );
        }
        Ok(hooks)
    }

    /// Whether any hook is on.
    pub fn enabled(&self) -> bool {
        !self.resolve.is_empty() || !self.public.is_empty() || self.ca_pem.is_some()
    }

    fn lookup(&self, name: &str, port: u16) -> Option<IpAddr> {
        let (answers, next) = self.resolve.get(&(name.to_ascii_lowercase(), port))?;
        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
        let answer = answers[*n % answers.len()];
        *n += 1;
        Some(answer)
    }
}

/// The connect-time guard.
#[derive(Debug, Default)]
pub struct NetGuard {
    /// `WEBHOOK_ALLOW_PRIVATE=true`: nothing is blocked.
    pub allow_private: bool,
    /// Test hooks (off in production).
    pub hooks: TestHooks,
}

impl NetGuard {
    /// Whether a connection to `ip` is refused; `explicit` when the operator
    /// named the destination. The reason, e.g. `blocked network 10.0.0.5
    /// (private 10.0.0.0/8)`.
    pub fn check(&self, ip: IpAddr, explicit: bool) -> Result<(), String> {
        if explicit || self.allow_private || self.hooks.public.contains(&ip) {
            return Ok(());
        }
        match blocked_reason(ip) {
            Some(why) => Err(format!("blocked network {ip} ({why})")),
            None => Ok(()),
        }
    }

    /// Resolves `host:port` once (the test override first) and returns the
    /// checked addresses to connect to, in order; an error when a lookup
    /// fails or any answer is blocked.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        explicit: bool,
    ) -> Result<Vec<SocketAddr>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = if let Ok(ip) = host.parse::<IpAddr>() {
            vec![SocketAddr::new(ip, port)]
        } else if let Some(ip) = self.hooks.lookup(host, port) {
            vec![SocketAddr::new(ip, port)]
        } else {
            tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("cannot resolve {host}: {e}"))?
                .collect()
        };
        if addrs.is_empty() {
            return Err(format!("cannot resolve {host}: no addresses"));
        }
        for a in &addrs {
            self.check(a.ip(), explicit)?;
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(s: &str) -> bool {
        blocked_reason(s.parse().unwrap()).is_some()
    }

    #[test]
    fn blocked_ranges() {
        for a in [
            "127.0.0.1",
            "10.0.0.5",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.7",
            "198.18.0.1",
            "198.19.255.255",
            "::",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "fc00::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:10.0.0.5",
            "::ffff:127.0.0.1",
            "::ffff:0:169.254.169.254",
            "2002:0a00:0005::1",
            "64:ff9b::10.0.0.5",
            "64:ff9b:1::a00:5",
        ] {
            assert!(blocked(a), "{a} must be blocked");
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(!blocked(a), "{a} is public");
        }
    }

    #[test]
    fn hooks_need_the_explicit_flag_and_not_production() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        let e = env(&[("TFA_TEST_RESOLVE", "a.test:443:127.0.0.2")]);
        assert!(TestHooks::from_env(&e).is_err());
        let e = env(&[
            ("TFA_TEST_RESOLVE", "a.test:443:127.0.0.2"),
            ("TFA_TEST_HOOKS", "1"),
            ("NODE_ENV", "production"),
        ]);
        assert!(TestHooks::from_env(&e).is_err());
        let e = env(&[]);
        assert!(!TestHooks::from_env(&e).unwrap().enabled());
        let e = env(&[
            (
                "TFA_TEST_RESOLVE",
                "a.test:443:127.0.0.2,a.test:443:10.0.0.5",
            ),
            ("TFA_TEST_PUBLIC_ADDRS", "127.0.0.2"),
            ("TFA_TEST_HOOKS", "1"),
        ]);
        let hooks = TestHooks::from_env(&e).unwrap();
        assert!(hooks.enabled());
        let guard = NetGuard {
            allow_private: false,
            hooks,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            // Public first, private on the second lookup: the second is refused.
            let first = guard.resolve("a.test", 443, false).await.unwrap();
            assert_eq!(first, ["127.0.0.2:443".parse().unwrap()]);
            let second = guard.resolve("a.test", 443, false).await.unwrap_err();
            assert!(second.starts_with("blocked network 10.0.0.5"), "{second}");
            // Named by the operator: allowed.
            assert!(guard.resolve("10.0.0.5", 80, true).await.is_ok());
            assert!(guard.resolve("169.254.169.254", 80, false).await.is_err());
        });
    }
}
