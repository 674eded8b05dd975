//! The invariants the fuzz target `filter_config` checks
//! (`edge-filter/fuzz`), shared with the native replay of its seeds and
//! saved cases (`edge-filter/tests/fuzz_regressions.rs`).
//!
//! For any bytes given as the plugin configuration:
//! - [`Config::parse`] returns, never panics; a refusal has a message;
//! - an accepted configuration keeps its own promises: a known requirement
//!   for every method and path, at least one secret, a TTL and skew within
//!   bounds, lower-case distinct protected headers that cover every
//!   forwarded claim's header;
//! - every refusal the filter can send under it is well formed: a 302 whose
//!   `Location` has no CR, LF or other control character (no header
//!   injection through `login_url` or the request's URL), or the envelope.

use crate::config::{Config, Requirement, MAX_CLOCK_SKEW_SECS};
use crate::policy::{self, Denial};

/// Paths and methods every accepted configuration is asked about, plus
/// ones taken from the input itself.
const PROBES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("POST", "/account"),
    ("DELETE", "/secure/x?y=1"),
    ("OPTIONS", "/public/"),
    ("GET", "/health"),
    ("PATCH", ""),
];

/// Runs the checks on one input; panics when an invariant breaks.
pub fn filter_config(data: &[u8]) {
    let cfg = match Config::parse(data) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert!(!e.0.is_empty(), "a refusal without a message");
            return;
        }
    };
    assert!(!cfg.secrets.is_empty() && cfg.secrets.iter().all(|s| !s.is_empty()));
    assert!(cfg.clock_skew_secs <= MAX_CLOCK_SKEW_SECS);
    for h in &cfg.protected_headers {
        assert_eq!(*h, h.to_ascii_lowercase(), "protected header {h:?}");
    }
    let mut distinct = cfg.protected_headers.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), cfg.protected_headers.len());
    for (_, header) in &cfg.forward_claims {
        assert!(
            cfg.protected_headers.contains(header),
            "{header:?} is forwarded but not stripped"
        );
    }
    let text = String::from_utf8_lossy(data);
    let from_input: Vec<&str> = text.split('"').filter(|s| s.starts_with('/')).collect();
    let probes = PROBES
        .iter()
        .copied()
        .chain(from_input.iter().map(|p| ("GET", *p)));
    for (method, path) in probes {
        let req = policy::requirement(&cfg, method, path);
        assert!(matches!(
            req,
            Requirement::None
                | Requirement::Auth
                | Requirement::Mfa
                | Requirement::PhishingResistant
        ));
        let original = policy::original_url(Some("https"), Some("app.example.com"), path);
        for denial in Denial::ALL {
            for html in [false, true] {
                let r = policy::denial_response(policy::login_of(&cfg), denial, html, &original);
                assert!(matches!(r.status, 302 | 401 | 403 | 503));
                for (name, value) in &r.headers {
                    assert!(
                        value.bytes().all(|b| (0x20..0x7f).contains(&b)),
                        "{name}: {value:?} is not a clean header value"
                    );
                }
                if r.status != 302 {
                    let body: serde_json::Value =
                        serde_json::from_slice(&r.body).expect("the envelope is JSON");
                    assert_eq!(body["success"], false);
                }
            }
        }
    }
}
