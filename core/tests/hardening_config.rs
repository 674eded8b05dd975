//! Production settings: every misconfiguration of the four secrets is
//! refused by `Config::from_map` with a message naming the setting, and a
//! host that cannot build a service answers 503 without leaking the reason.

use tfa_core::contract::config::{Config, SECRET_NAMES};
use tfa_core::Service;

fn good() -> [String; 4] {
    [
        "a".repeat(40),
        "b".repeat(40),
        "c".repeat(40),
        "d".repeat(40),
    ]
}

fn production(secrets: &[Option<String>; 4]) -> Result<Config, String> {
    let mut vars = Config::map_of([
        ("NODE_ENV", "production"),
        ("WEBAUTHN_RP_ID", "example.com"),
        ("WEBAUTHN_ORIGINS", "https://example.com"),
    ]);
    for (name, value) in SECRET_NAMES.iter().zip(secrets) {
        if let Some(v) = value {
            vars.insert(name.to_string(), v.clone());
        }
    }
    Config::from_map(&vars).map_err(|e| e.0)
}

fn with(i: usize, value: Option<&str>) -> [Option<String>; 4] {
    let mut s = good().map(Some);
    s[i] = value.map(str::to_string);
    s
}

#[test]
fn good_production_secrets_are_accepted() {
    let c = production(&good().map(Some)).expect("valid");
    assert!(c.production);
    assert!(
        c.warnings.iter().all(|w| !w.contains("SECRET")),
        "{:?}",
        c.warnings
    );
    // Exactly 32 characters is enough; characters, not bytes, are counted.
    assert!(production(&with(0, Some(&"x".repeat(32)))).is_ok());
    assert!(production(&with(0, Some(&"é".repeat(32)))).is_ok());
}

#[test]
fn each_missing_secret_is_refused() {
    for (i, name) in SECRET_NAMES.iter().enumerate() {
        for missing in [None, Some(""), Some("   "), Some("\t\n")] {
            assert_eq!(
                production(&with(i, missing)).unwrap_err(),
                format!("{name} is required in production"),
                "{missing:?}"
            );
        }
    }
}

#[test]
fn each_short_secret_is_refused() {
    for (i, name) in SECRET_NAMES.iter().enumerate() {
        for short in [
            "x".to_string(),
            "x".repeat(31),
            "é".repeat(31),
            format!("  {}  ", "y".repeat(30)),
        ] {
            assert_eq!(
                production(&with(i, Some(&short))).unwrap_err(),
                format!("{name} must be at least 32 characters"),
                "{short:?}"
            );
        }
    }
}

#[test]
fn each_pair_of_equal_secrets_is_refused() {
    for i in 0..4 {
        for j in 0..i {
            let mut s = good().map(Some);
            s[i] = s[j].clone();
            assert_eq!(
                production(&s).unwrap_err(),
                format!("{} must differ from {}", SECRET_NAMES[i], SECRET_NAMES[j]),
            );
            // Surrounding whitespace does not make them differ.
            s[i] = s[j].as_ref().map(|v| format!(" {v} "));
            assert_eq!(
                production(&s).unwrap_err(),
                format!("{} must differ from {}", SECRET_NAMES[i], SECRET_NAMES[j]),
            );
        }
    }
    // All four equal: the first conflict is named.
    let same = Some("z".repeat(40));
    assert_eq!(
        production(&[same.clone(), same.clone(), same.clone(), same]).unwrap_err(),
        "JWT_REFRESH_SECRET must differ from JWT_ACCESS_SECRET"
    );
}

#[test]
fn outside_production_the_same_problems_are_warnings() {
    let mut vars = Config::map_of([
        ("JWT_ACCESS_SECRET", "short"),
        ("JWT_REFRESH_SECRET", "short"),
    ]);
    vars.insert("NODE_ENV".into(), "development".into());
    let c = Config::from_map(&vars).expect("development starts");
    assert!(c.warnings.iter().any(|w| w.contains("at least 32")));
    assert!(c.warnings.iter().any(|w| w.contains("must differ")));
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("TEMP_TOKEN_SECRET is not set")));
    // Production is the strict mode: any spelling of it counts.
    for env in ["Production", "PRODUCTION", " production "] {
        let vars = Config::map_of([("NODE_ENV", env)]);
        assert_eq!(
            Config::from_map(&vars).unwrap_err().0,
            "JWT_ACCESS_SECRET is required in production",
            "{env:?}"
        );
    }
}

#[test]
fn the_unavailable_answer_leaks_nothing() {
    let r = Service::unavailable_response();
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json(),
        serde_json::json!({ "success": false, "error": "Service unavailable" })
    );
    assert!(!String::from_utf8_lossy(&r.body).contains("SECRET"));
}
