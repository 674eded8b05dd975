//! The edge filter's `.wasm` in the test proxy-wasm host
//! (`e2e::proxy_wasm_host`): every rule and failure path, driven
//! callback by callback with a controlled clock.
//!
//! Every driving call returns `Result`; a trap in the module would be an
//! `Err` and fail the test, so these tests also show that the filter never
//! traps on what they feed it.

use std::sync::OnceLock;

use e2e::filter_build::filter_wasm;
use e2e::proxy_wasm_host::{level, lock, FilterModule, HttpCall, Outcome, Plugin, PluginOptions};
use serde_json::json;
use tfa_core::tokens::{Extra, TokenKeys, TokenKind};

const NOW: u64 = 1_700_000_000;
const ISS: &str = "tfa-test-issuer";
const AUD: &str = "tfa-test-audience";
const ACCESS: &str = "access-secret-0123456789abcdef0123456789";
const NEW_ACCESS: &str = "rotated-access-secret-0123456789abcdef012";
const API_KEY: &str = "tfa_0123456789abcdefghijABCDEFGHIJ0123456789";

fn module() -> &'static FilterModule {
    static M: OnceLock<FilterModule> = OnceLock::new();
    M.get_or_init(|| FilterModule::load(&filter_wasm()).expect("load the filter module"))
}

fn keys_with(access: &str) -> TokenKeys {
    TokenKeys::new(
        access.as_bytes(),
        b"refresh-secret-0123456789abcdef0123456789",
        b"temp-secret-0123456789abcdef0123456789ab",
        b"device-secret-0123456789abcdef0123456789",
        ISS,
        AUD,
    )
}

fn token(mfa: bool, at: u64) -> String {
    token_for("user-1", "session-1", mfa, at)
}

fn token_for(sub: &str, sid: &str, mfa: bool, at: u64) -> String {
    let extra = Extra {
        sid: Some(sid.into()),
        mfa: Some(mfa),
        ..Extra::default()
    };
    keys_with(ACCESS).issue(TokenKind::Access, sub, extra, at)
}

fn base_config() -> serde_json::Value {
    json!({
        "secrets": [NEW_ACCESS, ACCESS],
        "issuer": ISS,
        "audience": AUD,
        "clock_skew_secs": 30,
        "cookie_name": "access_token",
        "rules": [
            {"prefix": "/public/", "require": "none"},
            {"path": "/admin", "methods": ["POST", "DELETE"], "require": "mfa"},
            {"prefix": "/secure/", "require": "mfa"},
            {"prefix": "/app/", "require": "auth"}
        ],
        "default": "auth",
        "forward_claims": {"sub": "x-user-id", "sid": "x-session-id", "mfa": "x-user-mfa"},
        "strip_headers": ["x-internal-role"],
        "login_url": "https://login.example.com/signin",
        "return_param": "return_to"
    })
}

fn introspection_config(fail_open: bool) -> serde_json::Value {
    let mut c = base_config();
    c["introspection"] = json!({
        "cluster": "tfa_api",
        "authority": "api.internal",
        "path": "/api/auth/introspect",
        "api_key": API_KEY,
        "timeout_ms": 750,
        "positive_ttl_secs": 30,
        "negative_ttl_secs": 10,
        "fail_open": fail_open,
        "cache_slots": 64
    });
    c
}

fn plugin(config: &serde_json::Value) -> Plugin {
    plugin_with(config, PluginOptions::default())
}

fn plugin_with(config: &serde_json::Value, mut opts: PluginOptions) -> Plugin {
    opts.now_secs = NOW;
    Plugin::with_config(module(), opts, &config.to_string())
        .expect("plugin starts and accepts its configuration")
}

fn get(path: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut h = vec![
        (":method", "GET".to_string()),
        (":path", path.to_string()),
        (":scheme", "https".to_string()),
        (":authority", "app.example.com".to_string()),
    ];
    h.extend(extra.iter().cloned());
    h
}

fn bearer(t: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {t}"))
}

fn send(p: &mut Plugin, headers: &[(&'static str, String)]) -> Outcome {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    p.request(&h).expect("no trap").1
}

fn forged() -> Vec<(&'static str, String)> {
    vec![
        ("x-user-id", "admin".to_string()),
        ("X-User-Mfa", "true".to_string()),
        ("x-session-id", "forged".to_string()),
        ("x-internal-role", "root".to_string()),
    ]
}

fn assert_envelope(o: &Outcome, status: u32, error: &str) {
    let r = o
        .response()
        .unwrap_or_else(|| panic!("expected a local response, got {o:?}"));
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!(r#"{{"success":false,"error":"{error}"}}"#)
    );
}

fn assert_401(o: &Outcome) {
    assert_envelope(o, 401, "Invalid or expired token");
}

fn assert_403(o: &Outcome) {
    assert_envelope(o, 403, "Two-factor authentication required");
}

fn assert_503(o: &Outcome) {
    assert_envelope(o, 503, "Service unavailable");
}

fn metric(p: &Plugin, name: &str) -> i64 {
    p.metric(name)
        .unwrap_or_else(|| panic!("metric {name} not defined: {:?}", p.metrics()))
}

fn answer_active(p: &mut Plugin, call: &HttpCall, active: bool) -> Outcome {
    let body = json!({"success": true, "data": {"active": active, "sub": "user-1", "sid": "session-1", "mfa": true, "exp": NOW + 900}});
    p.answer(
        call,
        Some(200),
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .expect("no trap")
}

#[test]
fn module_needs_only_what_the_host_provides() {
    for import in module().imports() {
        assert!(
            import.starts_with("env.proxy_") || import.starts_with("wasi_snapshot_preview1."),
            "unexpected import {import}"
        );
    }
    let mut p = plugin(&introspection_config(false));
    let _ = send(&mut p, &get("/app/x", &[bearer(&token(true, NOW))]));
    assert!(
        !p.logs()
            .iter()
            .any(|(_, m)| m.contains("unimplemented import")),
        "{:?}",
        p.logs()
    );
}

#[test]
fn bad_configurations_are_refused_with_a_log_line() {
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "empty"),
        ("not json".into(), "not valid"),
        (json!({}).to_string(), "secrets"),
        (json!({"secrets": []}).to_string(), "secrets"),
        (json!({"secrets": ["s"], "clock_skew": 5}).to_string(), "unknown field"),
        (json!({"secrets": ["s"], "rules": [{"prefix": "nope", "require": "auth"}]}).to_string(), "rules[0].prefix"),
        (json!({"secrets": ["s"], "rules": [{"prefix": "/a", "require": "admin"}]}).to_string(), "unknown variant"),
        (json!({"secrets": ["s"], "forward_claims": {"sub": "authorization"}}).to_string(), "reserved"),
        (json!({"secrets": ["s"], "introspection": {"cluster": "c"}}).to_string(), "api_key"),
        (json!({"secrets": ["s"], "introspection": {"cluster": "c", "api_key": "k", "timeout_ms": 0}}).to_string(), "timeout_ms"),
    ];
    for (config, needle) in cases {
        let mut p = Plugin::start(
            module(),
            PluginOptions {
                now_secs: NOW,
                ..PluginOptions::default()
            },
        )
        .expect("start");
        assert!(
            !p.configure(&config).expect("no trap"),
            "accepted {config:?}"
        );
        let logs = p.logs();
        assert!(
            logs.iter().any(|(l, m)| *l == level::ERROR
                && m.contains("configuration refused")
                && m.contains(needle)),
            "{config:?}: {logs:?}"
        );
        // Should the host still send traffic, the filter answers 503 and
        // does not trap.
        assert_503(&send(&mut p, &get("/app/x", &[bearer(&token(true, NOW))])));
    }
    let mut p = Plugin::start(module(), PluginOptions::default()).expect("start");
    assert!(p.configure(&base_config().to_string()).expect("no trap"));
    assert!(p
        .logs()
        .iter()
        .any(|(l, m)| *l == level::INFO && m.contains("configuration accepted")));
}

#[test]
fn none_rule_passes_and_still_strips_trusted_headers() {
    let mut p = plugin(&base_config());
    let o = send(&mut p, &get("/public/page", &forged()));
    let fwd = o.forwarded().expect("continued");
    for h in ["x-user-id", "x-user-mfa", "x-session-id", "x-internal-role"] {
        assert!(fwd.iter().all(|(k, _)| k != h), "{h} leaked: {fwd:?}");
    }
    assert_eq!(o.forwarded_header(":path"), Some("/public/page"));
    assert_eq!(metric(&p, "tfa_edge.allowed"), 1);
}

#[test]
fn missing_and_invalid_tokens_get_401() {
    let mut p = plugin(&base_config());
    assert_401(&send(&mut p, &get("/app/x", &[])));
    assert_401(&send(
        &mut p,
        &get("/app/x", &[("authorization", "Basic dXNlcjpwdw==".into())]),
    ));
    assert_401(&send(
        &mut p,
        &get("/app/x", &[("authorization", "Bearer".into())]),
    ));
    assert_eq!(metric(&p, "tfa_edge.denied.missing_token"), 3);

    let other = TokenKeys::new(b"x", b"x", b"x", b"x", ISS, AUD);
    let wrong_iss = TokenKeys::new(ACCESS.as_bytes(), b"r", b"t", b"d", "someone-else", AUD);
    let wrong_aud = TokenKeys::new(ACCESS.as_bytes(), b"r", b"t", b"d", ISS, "another-api");
    let same_secret_refresh =
        TokenKeys::new(ACCESS.as_bytes(), ACCESS.as_bytes(), b"t", b"d", ISS, AUD);
    let extra = || Extra {
        sid: Some("s".into()),
        mfa: Some(true),
        jti: Some("j".into()),
        ..Extra::default()
    };
    let bad = [
        "garbage".to_string(),
        "a.b.c".to_string(),
        other.issue(TokenKind::Access, "u", extra(), NOW),
        wrong_iss.issue(TokenKind::Access, "u", extra(), NOW),
        wrong_aud.issue(TokenKind::Access, "u", extra(), NOW),
        // typ must be access, even under the same secret.
        same_secret_refresh.issue(TokenKind::Refresh, "u", extra(), NOW),
        format!("{}x", token(true, NOW)),
    ];
    for t in &bad {
        assert_401(&send(&mut p, &get("/app/x", &[bearer(t)])));
    }
    assert_eq!(
        metric(&p, "tfa_edge.denied.invalid_token"),
        bad.len() as i64
    );
    assert_eq!(metric(&p, "tfa_edge.allowed"), 0);
}

#[test]
fn valid_token_passes_with_claims_replacing_forged_headers() {
    let mut p = plugin(&base_config());
    let mut h = get("/app/orders?page=2", &forged());
    h.push(bearer(&token(false, NOW)));
    let o = send(&mut p, &h);
    let fwd = o.forwarded().expect("continued");
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-1"));
    assert_eq!(o.forwarded_header("x-session-id"), Some("session-1"));
    assert_eq!(o.forwarded_header("x-user-mfa"), Some("false"));
    assert!(fwd.iter().all(|(k, _)| k != "x-internal-role"));
    assert_eq!(fwd.iter().filter(|(k, _)| k == "x-user-id").count(), 1);
    // The token itself still reaches the upstream.
    assert!(o.forwarded_header("authorization").is_some());
    assert_eq!(metric(&p, "tfa_edge.allowed"), 1);
}

#[test]
fn mfa_rules_and_method_scoped_rules() {
    let mut p = plugin(&base_config());
    let plain = token(false, NOW);
    let strong = token(true, NOW);
    assert_403(&send(&mut p, &get("/secure/vault", &[bearer(&plain)])));
    let o = send(&mut p, &get("/secure/vault", &[bearer(&strong)]));
    assert_eq!(o.forwarded_header("x-user-mfa"), Some("true"));

    // /admin: POST and DELETE need mfa, GET falls to the default (auth).
    let mut post = get("/admin", &[bearer(&plain)]);
    post[0].1 = "POST".into();
    assert_403(&send(&mut p, &post));
    assert!(send(&mut p, &get("/admin", &[bearer(&plain)]))
        .forwarded()
        .is_some());
    // Exact path: /admin/x is not /admin.
    let mut post_sub = get("/admin/x", &[bearer(&plain)]);
    post_sub[0].1 = "POST".into();
    assert!(send(&mut p, &post_sub).forwarded().is_some());
    // The default rule applies to paths no rule names.
    assert_401(&send(&mut p, &get("/elsewhere", &[])));
    assert_eq!(metric(&p, "tfa_edge.denied.mfa_required"), 2);
}

#[test]
fn token_from_cookie_and_bearer_precedence() {
    let mut p = plugin(&base_config());
    let t = token(true, NOW);
    let o = send(
        &mut p,
        &get(
            "/app/x",
            &[("cookie", format!("theme=dark; access_token={t}; x=1"))],
        ),
    );
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-1"));
    // A valid bearer wins over a bad cookie; a bad bearer is not rescued.
    let o = send(
        &mut p,
        &get(
            "/app/x",
            &[bearer(&t), ("cookie", "access_token=bad".into())],
        ),
    );
    assert!(o.forwarded().is_some());
    assert_401(&send(
        &mut p,
        &get(
            "/app/x",
            &[bearer("bad"), ("cookie", format!("access_token={t}"))],
        ),
    ));
    // Another cookie name is not the token.
    assert_401(&send(
        &mut p,
        &get("/app/x", &[("cookie", format!("other={t}"))]),
    ));
}

#[test]
fn secret_rotation() {
    let mut p = plugin(&base_config());
    let extra = || Extra {
        sid: Some("s".into()),
        mfa: Some(true),
        ..Extra::default()
    };
    let by_new = keys_with(NEW_ACCESS).issue(TokenKind::Access, "new-user", extra(), NOW);
    let by_old = keys_with(ACCESS).issue(TokenKind::Access, "old-user", extra(), NOW);
    assert_eq!(
        send(&mut p, &get("/app/x", &[bearer(&by_new)])).forwarded_header("x-user-id"),
        Some("new-user")
    );
    assert_eq!(
        send(&mut p, &get("/app/x", &[bearer(&by_old)])).forwarded_header("x-user-id"),
        Some("old-user")
    );
    // Once the old secret is dropped from the configuration, its tokens fail:
    // in a fresh VM, and in this one, whose filter had accepted (and
    // remembers) that very token under the old configuration.
    let mut c = base_config();
    c["secrets"] = json!([NEW_ACCESS]);
    let mut fresh = plugin(&c);
    assert_401(&send(&mut fresh, &get("/app/x", &[bearer(&by_old)])));
    assert!(p.configure(&c.to_string()).expect("no trap"));
    for p in [&mut fresh, &mut p] {
        assert_401(&send(p, &get("/app/x", &[bearer(&by_old)])));
        assert!(send(p, &get("/app/x", &[bearer(&by_new)]))
            .forwarded()
            .is_some());
    }
}

#[test]
fn expiry_at_the_clock_skew_edge() {
    let mut p = plugin(&base_config());
    let t = token(true, NOW);
    let exp = NOW + 900;
    p.set_time_secs(exp - 1);
    assert!(send(&mut p, &get("/app/x", &[bearer(&t)]))
        .forwarded()
        .is_some());
    p.set_time_secs(exp + 29);
    assert!(send(&mut p, &get("/app/x", &[bearer(&t)]))
        .forwarded()
        .is_some());
    p.set_time_secs(exp + 30);
    assert_401(&send(&mut p, &get("/app/x", &[bearer(&t)])));
    assert_eq!(metric(&p, "tfa_edge.denied.expired_token"), 1);
    // A token from the future, beyond the skew, is not valid yet… but
    // tokens carry no nbf from the API; iat is not compared. So the only
    // time check is exp, which this pins at both sides.
    let mut c = base_config();
    c["clock_skew_secs"] = json!(0);
    let mut strict = plugin(&c);
    strict.set_time_secs(exp - 1);
    assert!(send(&mut strict, &get("/app/x", &[bearer(&t)]))
        .forwarded()
        .is_some());
    strict.set_time_secs(exp);
    assert_401(&send(&mut strict, &get("/app/x", &[bearer(&t)])));
}

#[test]
fn browsers_are_redirected_to_login_with_the_original_url() {
    let mut p = plugin(&base_config());
    let html = (
        "accept",
        "text/html,application/xhtml+xml;q=0.9".to_string(),
    );
    let o = send(
        &mut p,
        &get("/app/page?a=1&b=x y", std::slice::from_ref(&html)),
    );
    let r = o.response().expect("response");
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some("https://login.example.com/signin?return_to=https%3A%2F%2Fapp.example.com%2Fapp%2Fpage%3Fa%3D1%26b%3Dx%20y")
    );
    assert!(r.body.is_empty());
    // A browser missing the second factor goes to login as well.
    let o = send(
        &mut p,
        &get("/secure/x", &[html.clone(), bearer(&token(false, NOW))]),
    );
    assert_eq!(o.response().map(|r| r.status), Some(302));
    // Without a login URL browsers get the envelope.
    let mut c = base_config();
    c.as_object_mut().expect("object").remove("login_url");
    let mut p = plugin(&c);
    assert_401(&send(&mut p, &get("/app/page", &[html])));
}

#[test]
fn cors_preflight_passes() {
    let mut p = plugin(&base_config());
    let mut h = get(
        "/app/x",
        &[
            ("origin", "https://spa.example.com".into()),
            ("access-control-request-method", "POST".into()),
        ],
    );
    h[0].1 = "OPTIONS".into();
    h.extend(forged());
    let o = send(&mut p, &h);
    let fwd = o.forwarded().expect("preflight continues");
    assert!(fwd.iter().all(|(k, _)| k != "x-user-id"));
    // OPTIONS that is not a preflight needs a token like anything else.
    let mut h = get("/app/x", &[("origin", "https://spa.example.com".into())]);
    h[0].1 = "OPTIONS".into();
    assert_401(&send(&mut p, &h));
}

#[test]
fn hostile_inputs_do_not_trap() {
    let mut p = plugin(&introspection_config(false));
    let long = "A".repeat(100_000);
    let cases: Vec<Vec<(&'static str, String)>> = vec![
        vec![],
        vec![(":path", "".into())],
        get("/app/x", &[bearer(&long)]),
        get("/app/x", &[("authorization", "Bearer ...".into())]),
        get(
            "/app/x",
            &[("cookie", ";;;=;access_token;access_token=".into())],
        ),
        get(
            "/app/x",
            &[("authorization", "Bearer \u{00e9}\u{1F600}".into())],
        ),
        get("/\u{0}/x", &[("accept", "text/html".into())]),
    ];
    for h in cases {
        let o = send(&mut p, &h);
        assert!(o.response().is_some(), "{o:?}");
    }
    assert!(p.pending_calls().is_empty());
}

#[test]
fn introspection_active_is_cached_for_the_positive_ttl() {
    let mut p = plugin(&introspection_config(false));
    let t = token(true, NOW);
    let mut h = get(
        "/app/x",
        &[bearer(&t), ("x-request-id", "req-4f2a9c-0001".into())],
    );
    h.extend(forged());
    let o = send(&mut p, &h);
    let call = o.call().expect("paused on one introspection call").clone();
    assert_eq!(call.upstream, "tfa_api");
    // The request's id travels with the call (the API logs it).
    assert_eq!(call.header("x-request-id"), Some("req-4f2a9c-0001"));
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":path"), Some("/api/auth/introspect"));
    assert_eq!(call.header(":authority"), Some("api.internal"));
    assert_eq!(call.header("x-api-key"), Some(API_KEY));
    assert_eq!(call.header("content-type"), Some("application/json"));
    assert_eq!(call.timeout_ms, 750);
    let body: serde_json::Value = serde_json::from_slice(&call.body).expect("json body");
    assert_eq!(body, json!({"token": t}));

    let o = answer_active(&mut p, &call, true);
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-1"));
    assert!(o
        .forwarded()
        .expect("continued")
        .iter()
        .all(|(k, _)| k != "x-internal-role"));
    assert_eq!(metric(&p, "tfa_edge.introspection.calls"), 1);

    // Within the TTL: no call.
    p.set_time_secs(NOW + 29);
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-1"));
    assert_eq!(metric(&p, "tfa_edge.introspection.cache_hits"), 1);
    // At the TTL: asked again.
    p.set_time_secs(NOW + 30);
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("asked again").clone();
    assert_eq!(metric(&p, "tfa_edge.introspection.calls"), 2);
    // …and the session has ended meanwhile.
    assert_401(&answer_active(&mut p, &call, false));
    assert_eq!(metric(&p, "tfa_edge.denied.session_inactive"), 1);
}

#[test]
fn introspection_inactive_is_cached_for_the_negative_ttl() {
    let mut p = plugin(&introspection_config(false));
    let t = token(true, NOW);
    let o = send(
        &mut p,
        &get("/app/x", &[bearer(&t), ("accept", "text/html".into())]),
    );
    let call = o.call().expect("call").clone();
    // A browser whose session ended is sent to login.
    let o = answer_active(&mut p, &call, false);
    assert_eq!(o.response().map(|r| r.status), Some(302));
    p.set_time_secs(NOW + 9);
    assert_401(&send(&mut p, &get("/app/x", &[bearer(&t)])));
    assert_eq!(metric(&p, "tfa_edge.introspection.cache_hits"), 1);
    assert_eq!(metric(&p, "tfa_edge.introspection.calls"), 1);
    p.set_time_secs(NOW + 10);
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    let call = o
        .call()
        .expect("asked again after the negative TTL")
        .clone();
    assert!(answer_active(&mut p, &call, true).forwarded().is_some());
    assert_eq!(metric(&p, "tfa_edge.denied.session_inactive"), 2);
}

#[test]
fn local_checks_come_before_introspection() {
    let mut p = plugin(&introspection_config(false));
    assert_401(&send(&mut p, &get("/app/x", &[bearer("bad")])));
    assert_403(&send(
        &mut p,
        &get("/secure/x", &[bearer(&token(false, NOW))]),
    ));
    assert!(send(&mut p, &get("/public/x", &[])).forwarded().is_some());
    assert!(p.pending_calls().is_empty());
    assert_eq!(metric(&p, "tfa_edge.introspection.calls"), 0);
}

#[test]
fn fail_closed_when_the_api_cannot_answer() {
    let mut p = plugin(&introspection_config(false));
    let t = token(true, NOW);
    let answers: Vec<(Option<u16>, &[u8])> = vec![
        (None, b""),
        (
            Some(500),
            br#"{"success":false,"error":"Internal server error"}"#,
        ),
        (
            Some(401),
            br#"{"success":false,"error":"Invalid or expired token"}"#,
        ),
        (Some(200), b"<html>proxy error</html>"),
        (Some(200), br#"{"success":true,"data":{}}"#),
    ];
    for (i, (status, body)) in answers.iter().enumerate() {
        let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
        let call = o.call().expect("nothing cached from failures").clone();
        assert_503(&p.answer(&call, *status, &[], body).expect("no trap"));
        assert_eq!(
            metric(&p, "tfa_edge.introspection.api_errors"),
            i as i64 + 1
        );
    }
    assert_eq!(
        metric(&p, "tfa_edge.denied.api_unavailable"),
        answers.len() as i64
    );
    // A browser is not sent to log in again because of an outage.
    let o = send(
        &mut p,
        &get("/app/x", &[bearer(&t), ("accept", "text/html".into())]),
    );
    let call = o.call().expect("call").clone();
    assert_503(&p.answer(&call, None, &[], b"").expect("no trap"));
    // Unknown cluster: the call cannot even be made.
    let mut p = plugin_with(
        &introspection_config(false),
        PluginOptions {
            known_clusters: Some(vec!["other".into()]),
            ..PluginOptions::default()
        },
    );
    assert_503(&send(&mut p, &get("/app/x", &[bearer(&t)])));
    assert_eq!(metric(&p, "tfa_edge.introspection.api_errors"), 1);
    assert!(p
        .logs()
        .iter()
        .any(|(l, m)| *l == level::WARN && m.contains("tfa_api")));
}

#[test]
fn fail_open_lets_valid_tokens_through_when_the_api_cannot_answer() {
    let mut p = plugin(&introspection_config(true));
    let t = token(true, NOW);
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("call").clone();
    let o = p.answer(&call, None, &[], b"").expect("no trap");
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-1"));
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("failure not cached").clone();
    let o = p
        .answer(&call, Some(502), &[], b"bad gateway")
        .expect("no trap");
    assert!(o.forwarded().is_some());
    assert_eq!(metric(&p, "tfa_edge.introspection.fail_open"), 2);
    assert_eq!(metric(&p, "tfa_edge.introspection.api_errors"), 2);
    // An answer that the session ended still denies.
    let o = send(&mut p, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("call").clone();
    assert_401(&answer_active(&mut p, &call, false));
    // Fail-open never rescues a bad token.
    assert_401(&send(&mut p, &get("/app/x", &[bearer("bad")])));
    let mut p = plugin_with(
        &introspection_config(true),
        PluginOptions {
            known_clusters: Some(vec![]),
            ..PluginOptions::default()
        },
    );
    assert!(send(&mut p, &get("/app/x", &[bearer(&t)]))
        .forwarded()
        .is_some());
}

#[test]
fn cache_is_shared_between_workers_and_written_with_cas() {
    let config = introspection_config(false);
    let a_opts = PluginOptions::default();
    let mut a = plugin_with(&config, a_opts);
    let shared = a.shared();
    let mut b = plugin_with(
        &config,
        PluginOptions {
            shared: Some(shared.clone()),
            ..PluginOptions::default()
        },
    );
    let t = token(true, NOW);

    // Worker A asks; just before it writes, another worker updates the slot.
    let o = send(&mut a, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("call").clone();
    let key = {
        // Slots are unknown to the test until written: pre-fill every slot
        // would be heavy; instead answer once, learn the key, then race.
        let o = answer_active(&mut a, &call, true);
        assert!(o.forwarded().is_some());
        let s = lock(&shared);
        assert_eq!(s.entries.len(), 1);
        s.entries.keys().next().cloned().expect("key")
    };
    // Worker B sees A's answer without a call of its own.
    assert!(send(&mut b, &get("/app/x", &[bearer(&t)]))
        .forwarded()
        .is_some());
    assert_eq!(metric(&b, "tfa_edge.introspection.cache_hits"), 1);
    assert!(b.pending_calls().is_empty());

    // After the TTL, B asks; a concurrent writer changes the slot between
    // B's read and B's write: B's first write is refused, its retry wins.
    b.set_time_secs(NOW + 31);
    let o = send(&mut b, &get("/app/x", &[bearer(&t)]));
    let call = o.call().expect("call").clone();
    lock(&shared).interfere_after_next_read(&key);
    let before = lock(&shared).cas_mismatches;
    assert!(answer_active(&mut b, &call, false).response().is_some());
    let s = lock(&shared);
    assert_eq!(s.cas_mismatches, before + 1);
    let stored = String::from_utf8_lossy(&s.entries[&key].value).into_owned();
    drop(s);
    assert!(
        stored.ends_with(&format!(" 0 {}", (NOW + 31 + 10) * 1000)),
        "{stored}"
    );
    // A, at the same time, now reads B's negative answer.
    a.set_time_secs(NOW + 32);
    assert_401(&send(&mut a, &get("/app/x", &[bearer(&t)])));
}

#[test]
fn a_slot_taken_by_another_token_is_a_miss() {
    let mut c = introspection_config(false);
    c["introspection"]["cache_slots"] = json!(1);
    let mut p = plugin(&c);
    let t1 = token_for("user-1", "s1", true, NOW);
    let t2 = token_for("user-2", "s2", true, NOW);
    let call = send(&mut p, &get("/app/x", &[bearer(&t1)]))
        .call()
        .expect("call")
        .clone();
    assert!(answer_active(&mut p, &call, false).response().is_some());
    // t2 shares the only slot, but t1's negative answer is not t2's.
    let call = send(&mut p, &get("/app/x", &[bearer(&t2)]))
        .call()
        .expect("miss")
        .clone();
    let o = answer_active(&mut p, &call, true);
    assert_eq!(o.forwarded_header("x-user-id"), Some("user-2"));
    // t2 overwrote the slot: t1 is asked about again.
    assert!(send(&mut p, &get("/app/x", &[bearer(&t1)]))
        .call()
        .is_some());
}

#[test]
fn zero_ttls_disable_caching() {
    let mut c = introspection_config(false);
    c["introspection"]["positive_ttl_secs"] = json!(0);
    c["introspection"]["negative_ttl_secs"] = json!(0);
    let mut p = plugin(&c);
    let t = token(true, NOW);
    for _ in 0..2 {
        let call = send(&mut p, &get("/app/x", &[bearer(&t)]))
            .call()
            .expect("call")
            .clone();
        assert!(answer_active(&mut p, &call, true).forwarded().is_some());
    }
    assert_eq!(metric(&p, "tfa_edge.introspection.cache_hits"), 0);
    assert!(lock(&p.shared()).entries.is_empty());
}

#[test]
fn metrics_are_defined_with_stable_names() {
    let p = plugin(&base_config());
    for name in [
        "tfa_edge.allowed",
        "tfa_edge.denied.missing_token",
        "tfa_edge.denied.invalid_token",
        "tfa_edge.denied.expired_token",
        "tfa_edge.denied.mfa_required",
        "tfa_edge.denied.session_inactive",
        "tfa_edge.denied.api_unavailable",
        "tfa_edge.denied.not_configured",
        "tfa_edge.introspection.calls",
        "tfa_edge.introspection.cache_hits",
        "tfa_edge.introspection.api_errors",
        "tfa_edge.introspection.fail_open",
    ] {
        assert_eq!(metric(&p, name), 0, "{name}");
    }
}
