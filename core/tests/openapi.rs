//! The OpenAPI document (`core/openapi.json`) against the service: the same
//! operations as the router's table, every path of it served, the same
//! error messages as `ApiError`, the same names as core's lists, and the
//! document itself served at `GET {base}/openapi.json`.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use serde_json::Value;
use tfa_core::api::router::{self, ROUTES};
use tfa_core::api::{apikeys, audit, openapi, webhooks};
use tfa_core::contract::error::{ApiError, RateInfo};
use tfa_core::testing::{test_config, Harness, MemoryStore};
use tfa_core::Request;

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

fn doc() -> Value {
    serde_json::from_str(openapi::DOCUMENT).expect("core/openapi.json is JSON")
}

/// (METHOD, path template) of every documented operation.
fn documented() -> BTreeSet<(String, String)> {
    let doc = doc();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            assert!(
                METHODS.contains(&method.to_ascii_uppercase().as_str()),
                "{path}: {method} is not an operation"
            );
            out.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    out
}

/// A concrete path for a template: each `{param}` becomes `value`.
fn concrete(template: &str, value: &str) -> String {
    template
        .split('/')
        .map(|seg| if seg.starts_with('{') { value } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn the_document_and_the_router_name_the_same_operations() {
    let table: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(
        table.len(),
        ROUTES.len(),
        "an operation is in the table twice"
    );
    let documented = documented();
    let undocumented: Vec<_> = table.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&table).collect();
    assert!(
        undocumented.is_empty(),
        "served, not documented: {undocumented:?}"
    );
    assert!(unserved.is_empty(), "documented, not served: {unserved:?}");
}

#[test]
fn every_documented_operation_resolves_to_its_own_route() {
    for (method, template) in documented() {
        for value in ["0f8fa5a6-2a6c-4f0e-9d1b-3f7c1e2d4b5a", "x", "events"] {
            let path = concrete(&template, value);
            let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let (routes, param) = router::resolve(&segs).expect("a documented path resolves");
            if template.contains('{') && value == "events" && routes[0].path != template {
                // A literal sibling (`/webhooks/events`) wins over the
                // parameter, as documented paths do in OpenAPI.
                assert!(documented().iter().any(|(_, p)| p == routes[0].path));
                continue;
            }
            assert!(
                routes
                    .iter()
                    .any(|r| r.method == method && r.path == template),
                "{method} {path} does not reach {template}"
            );
            assert_eq!(param, if template.contains('{') { value } else { "" });
        }
    }
}

/// The methods the document gives each path, in the router's `Allow` order.
fn allowed_by_path() -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in ROUTES {
        out.entry(r.path).or_default().push(r.method);
    }
    out
}

#[test]
fn every_other_method_on_a_documented_path_is_405_with_the_documented_allow() {
    let mut h = Harness::new();
    let documented = documented();
    for (template, allowed) in allowed_by_path() {
        let path = format!("/api{}", concrete(template, "x"));
        for method in METHODS {
            let served = documented.contains(&(method.to_string(), template.to_string()));
            let resp = h.call(Request::new(method, &path).json("{}"));
            if served {
                assert_ne!(resp.status, 405, "{method} {path}");
                assert_ne!(
                    (resp.status, data_or_error(&resp)),
                    (404, "Resource not found".to_string()),
                    "{method} {path}: the router does not know it"
                );
            } else {
                assert_error(&resp, 405, "Method not allowed");
                assert_eq!(
                    resp.header_value("allow"),
                    Some(allowed.join(", ").as_str()),
                    "{method} {path}"
                );
            }
        }
    }
}

fn data_or_error(resp: &tfa_core::Response) -> String {
    resp.json()["error"].as_str().unwrap_or("").to_string()
}

#[test]
fn paths_one_segment_off_a_documented_one_are_unknown() {
    let mut h = Harness::new();
    let templates: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
    for template in templates {
        let path = concrete(template, "x");
        let parent = path.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
        let mut candidates = vec![format!("{path}/extra"), format!("{path}x")];
        if !parent.is_empty() && !templates_match(parent) {
            candidates.push(parent.to_string());
        }
        for p in candidates {
            if templates_match(&p) {
                continue;
            }
            for method in METHODS {
                let resp = h.call(Request::new(method, &format!("/api{p}")).json("{}"));
                assert_error(&resp, 404, "Resource not found");
            }
        }
    }
}

fn templates_match(path: &str) -> bool {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    router::resolve(&segs).is_some()
}

/// Every variant, so that a new one must be placed here (the match has no
/// catch-all) and in the document.
fn all_errors() -> Vec<ApiError> {
    let info = RateInfo {
        limit: 1,
        remaining: 0,
        reset_secs: 1,
        retry_after_secs: 1,
    };
    let all = vec![
        ApiError::Validation("x".into()),
        ApiError::PasskeyChallenge,
        ApiError::PasskeyRegistered,
        ApiError::InvalidCredentials,
        ApiError::InvalidToken,
        ApiError::InvalidRefreshToken,
        ApiError::EmailTaken,
        ApiError::UsernameTaken,
        ApiError::InvalidCode,
        ApiError::InvalidTempToken,
        ApiError::BackupCodeUsed,
        ApiError::SetupNotInitiated,
        ApiError::NoMethod,
        ApiError::LastMethod,
        ApiError::InvalidSignature,
        ApiError::InsufficientScope("2fa:write"),
        ApiError::CsrfOrigin,
        ApiError::NotFound,
        ApiError::MethodNotAllowed(vec!["GET"]),
        ApiError::BodyTooLarge,
        ApiError::RateLimited(info),
        ApiError::Internal,
        ApiError::Unavailable,
        ApiError::SmsNotConfigured,
        ApiError::EmailNotConfigured,
        ApiError::DeliveryFailed,
    ];
    for e in &all {
        match e {
            ApiError::Validation(_)
            | ApiError::InvalidCredentials
            | ApiError::InvalidToken
            | ApiError::InvalidRefreshToken
            | ApiError::EmailTaken
            | ApiError::UsernameTaken
            | ApiError::InvalidCode
            | ApiError::InvalidTempToken
            | ApiError::BackupCodeUsed
            | ApiError::SetupNotInitiated
            | ApiError::NoMethod
            | ApiError::LastMethod
            | ApiError::InvalidSignature
            | ApiError::InsufficientScope(_)
            | ApiError::CsrfOrigin
            | ApiError::NotFound
            | ApiError::MethodNotAllowed(_)
            | ApiError::BodyTooLarge
            | ApiError::RateLimited(_)
            | ApiError::Internal
            | ApiError::Unavailable
            | ApiError::SmsNotConfigured
            | ApiError::EmailNotConfigured
            | ApiError::DeliveryFailed
            | ApiError::PasskeyChallenge
            | ApiError::PasskeyRegistered => {}
        }
    }
    all
}

/// (status, message or `Validation error: ` pattern) of every documented
/// error response.
fn documented_errors() -> BTreeSet<(u16, String)> {
    let doc = doc();
    let mut out = BTreeSet::new();
    for (name, resp) in doc["components"]["responses"].as_object().unwrap() {
        let status: u16 = name.split('.').next().unwrap().parse().unwrap();
        let schema = &resp["content"]["application/json"]["schema"];
        assert_eq!(schema["properties"]["success"]["const"], false, "{name}");
        let msg = &schema["properties"]["error"];
        let alts: Vec<&Value> = match msg["anyOf"].as_array() {
            Some(a) => a.iter().collect(),
            None => vec![msg],
        };
        for alt in alts {
            if let Some(e) = alt["enum"].as_array() {
                out.extend(e.iter().map(|m| (status, m.as_str().unwrap().to_string())));
            }
            if let Some(p) = alt["pattern"].as_str() {
                assert_eq!(p, "^Validation error: .+", "{name}");
                out.insert((status, "Validation error: x".to_string()));
            }
        }
    }
    out
}

#[test]
fn the_documented_errors_are_exactly_the_api_errors() {
    let documented = documented_errors();
    let doc = doc();
    let scopes: Vec<&str> = apikeys::SCOPES
        .iter()
        .filter(|s| **s != "*")
        .copied()
        .collect();
    // Each documented message is a real one with its real status.
    for (status, message) in &documented {
        let real = all_errors().iter().any(|e| {
            let (st, msg) = e.status_and_message();
            st == *status && msg == *message
        }) || scopes.iter().any(|s| {
            ApiError::InsufficientScope(s).status_and_message() == (*status, message.clone())
        });
        assert!(real, "documented but not an ApiError: {status} {message}");
    }
    // Each error is documented, with its status (405 is documented once for
    // the whole API, in the description: it is not an operation's answer).
    for e in all_errors() {
        let (status, message) = e.status_and_message();
        if let ApiError::MethodNotAllowed(_) = e {
            let text = doc["info"]["description"].as_str().unwrap();
            assert!(text.contains("405") && text.contains(&message));
            continue;
        }
        assert!(
            documented.contains(&(status, message.clone())),
            "not documented: {status} {message}"
        );
    }
}

#[test]
fn every_operation_documents_its_failures_and_every_ref_resolves() {
    let doc = doc();
    let text = openapi::DOCUMENT;
    // Every $ref points at something.
    for piece in text.split("\"$ref\":\"").skip(1) {
        let target = piece.split('"').next().unwrap();
        let pointer = target.trim_start_matches('#');
        assert!(
            !doc.pointer(pointer).unwrap_or(&Value::Null).is_null(),
            "{target}"
        );
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            for status in ["500", "503"] {
                assert!(responses.contains_key(status), "{method} {path}: {status}");
            }
            let authenticated = op["security"].as_array().unwrap().iter().any(|s| {
                s.as_object()
                    .is_some_and(|s| s.contains_key("bearerAuth") || s.contains_key("apiKeyHeader"))
            });
            assert_eq!(
                responses.contains_key("401"),
                authenticated || path == "/auth/refresh" || path == "/auth/login",
                "{method} {path}: 401"
            );
            let scoped = op["security"].to_string().contains("apiKeyHeader");
            assert_eq!(
                responses.contains_key("403"),
                scoped || path.ends_with("/refresh") || path.ends_with("/logout"),
                "{method} {path}: 403"
            );
            if op.get("requestBody").is_some() {
                assert!(responses.contains_key("400"), "{method} {path}: 400");
                assert!(responses.contains_key("413"), "{method} {path}: 413");
            }
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}: no success"
            );
        }
    }
}

#[test]
fn the_documented_names_are_core_s() {
    let doc = doc();
    let s = &doc["components"]["schemas"];
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&s["ApiKey"]["properties"]["scopes"]["items"]["enum"]),
        apikeys::SCOPES
    );
    assert_eq!(
        names(&s["Webhook"]["properties"]["events"]["items"]["enum"]),
        webhooks::EVENTS
    );
    assert_eq!(
        names(&s["AuditEvent"]["properties"]["action"]["enum"]),
        audit::ACTIONS
    );
}

#[test]
fn the_document_is_served_with_the_configured_base_path() {
    let mut h = Harness::new();
    let resp = h.call(get("/openapi.json"));
    assert_eq!(resp.status, 200);
    assert!(resp
        .header_value("content-type")
        .unwrap()
        .starts_with("application/json"));
    let served = resp.json();
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(served["servers"][0]["url"], "/api");
    assert_eq!(served["paths"], doc()["paths"]);

    let mut h = Harness::with(
        test_config(&[("API_BASE_PATH", "/v1/tfa")]),
        MemoryStore::new(),
    );
    let resp = h.call(Request::new("GET", "/v1/tfa/openapi.json"));
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["servers"][0]["url"], "/v1/tfa");
    let mut h = Harness::with(test_config(&[("API_BASE_PATH", "/")]), MemoryStore::new());
    let resp = h.call(Request::new("GET", "/openapi.json"));
    assert_eq!(resp.json()["servers"][0]["url"], "/");
}

// Findings of the contract test (scripts/test-contract.sh), pinned here.

/// `limit` and `cursor` are single values in the document; a request that
/// gives one twice used to be answered with the first value, whatever the
/// second said.
#[test]
fn a_query_parameter_given_twice_is_refused() {
    let mut h = Harness::new();
    let user = register(&mut h, "carol");
    for query in [
        "limit=5&limit=abc",
        "limit=5&limit=5",
        "cursor=1&limit=2&cursor=1",
    ] {
        let resp = h.call(bearer(get(&format!("/audit-log?{query}")), &user.access));
        let name = if query.starts_with("cursor") {
            "cursor"
        } else {
            "limit"
        };
        assert_error(
            &resp,
            400,
            &format!("Validation error: {name} must be given once"),
        );
    }
    let resp = h.call(bearer(get("/audit-log?limit=5&cursor=1"), &user.access));
    assert_eq!(resp.status, 200);
}
