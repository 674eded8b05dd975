//! Settings: names, defaults, production checks.

use tfa_core::contract::config::{Config, SETTING_NAMES};
use tfa_core::contract::outbox::SmtpTls;

fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
    Config::from_map(&Config::map_of(pairs.iter().copied())).map_err(|e| e.0)
}

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddddddddddd";

fn prod(overrides: &[(&'static str, &'static str)]) -> Result<Config, String> {
    let mut pairs = vec![
        ("NODE_ENV", "production"),
        ("JWT_ACCESS_SECRET", A),
        ("JWT_REFRESH_SECRET", B),
        ("TEMP_TOKEN_SECRET", C),
        ("DEVICE_TOKEN_SECRET", D),
        ("WEBAUTHN_RP_ID", "example.com"),
        ("WEBAUTHN_ORIGINS", "https://example.com"),
    ];
    pairs.extend_from_slice(overrides);
    parse(&pairs)
}

#[test]
fn defaults() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.port, 3001);
    assert_eq!(c.base_path, "/api");
    assert!(!c.production && c.rate_limit_enabled && !c.trust_proxy);
    assert_eq!(c.totp_issuer, "TwoFactorAuth");
    assert_eq!(
        (
            c.argon2.memory_kib,
            c.argon2.iterations,
            c.argon2.parallelism
        ),
        (19456, 2, 1)
    );
    assert!(c.twilio.is_none() && c.email.is_none());
    assert_eq!(
        c.warnings.len(),
        4,
        "one warning per generated secret: {:?}",
        c.warnings
    );
    assert!(
        SETTING_NAMES.contains(&"JWT_ACCESS_SECRET") && SETTING_NAMES.contains(&"EMAIL_SERVICE")
    );
}

#[test]
fn production_refuses_bad_secrets() {
    assert!(prod(&[]).is_ok());
    assert_eq!(
        prod(&[("TEMP_TOKEN_SECRET", "")]).unwrap_err(),
        "TEMP_TOKEN_SECRET is required in production"
    );
    assert_eq!(
        prod(&[("JWT_REFRESH_SECRET", "short")]).unwrap_err(),
        "JWT_REFRESH_SECRET must be at least 32 characters"
    );
    assert_eq!(
        prod(&[("DEVICE_TOKEN_SECRET", A)]).unwrap_err(),
        "DEVICE_TOKEN_SECRET must differ from JWT_ACCESS_SECRET"
    );
    // Outside production the same problems are warnings.
    let c = parse(&[
        ("JWT_ACCESS_SECRET", "short"),
        ("JWT_REFRESH_SECRET", "short"),
    ])
    .unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("must differ")));
}

#[test]
fn bad_values_name_the_setting() {
    assert_eq!(
        parse(&[("PORT", "http")]).unwrap_err(),
        "PORT must be a whole number in range"
    );
    assert_eq!(
        parse(&[("RATE_LIMIT_ENABLED", "maybe")]).unwrap_err(),
        "RATE_LIMIT_ENABLED must be true or false"
    );
    assert!(parse(&[("API_BASE_PATH", "api")]).is_err());
    assert!(parse(&[("ARGON2_ITERATIONS", "0")]).is_err());
    assert!(parse(&[("TWILIO_ACCOUNT_SID", "AC1")])
        .unwrap_err()
        .contains("together"));
    assert!(parse(&[("EMAIL_SERVICE", "carrier-pigeon")])
        .unwrap_err()
        .contains("EMAIL_SERVICE"));
    assert!(parse(&[("EMAIL_HOST", "smtp.example.com")])
        .unwrap_err()
        .contains("EMAIL_FROM"));
}

#[test]
fn email_presets_and_tls() {
    let c = parse(&[
        ("EMAIL_SERVICE", "Gmail"),
        ("EMAIL_USER", "me@gmail.com"),
        ("EMAIL_PASSWORD", "pw"),
    ])
    .unwrap();
    let e = c.email.unwrap();
    assert_eq!(
        (e.host.as_str(), e.port, e.tls),
        ("smtp.gmail.com", 465, SmtpTls::Implicit)
    );
    assert_eq!(e.from, "me@gmail.com");
    assert_eq!(e.auth, Some(("me@gmail.com".into(), "pw".into())));
    let c = parse(&[
        ("EMAIL_HOST", "mail.example.com"),
        ("EMAIL_FROM", "x@example.com"),
    ])
    .unwrap();
    let e = c.email.unwrap();
    assert_eq!(
        (e.port, e.tls, e.auth),
        (587, SmtpTls::StartTlsIfOffered, None)
    );
    assert_eq!(e.extra_ca_pem, None);
    let c = parse(&[("CORS_ORIGINS", "https://a.example, https://b.example/ ,")]).unwrap();
    assert_eq!(c.cors_origins, ["https://a.example", "https://b.example"]);
}

#[test]
fn email_extra_ca_pem() {
    let base = [("EMAIL_HOST", "127.0.0.1"), ("EMAIL_FROM", "x@example.com")];
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let c = parse(&[base[0], base[1], ("EMAIL_TLS_CA_PEM", pem)]).unwrap();
    assert_eq!(c.email.unwrap().extra_ca_pem.as_deref(), Some(pem.trim()));
    // One-line form with literal \n.
    let one_line = pem.trim().replace('\n', "\\n");
    let c = parse(&[base[0], base[1], ("EMAIL_TLS_CA_PEM", &one_line)]).unwrap();
    assert_eq!(c.email.unwrap().extra_ca_pem.as_deref(), Some(pem.trim()));
    assert!(
        parse(&[base[0], base[1], ("EMAIL_TLS_CA_PEM", "not a pem")])
            .unwrap_err()
            .contains("EMAIL_TLS_CA_PEM")
    );
    assert!(SETTING_NAMES.contains(&"EMAIL_TLS_CA_PEM"));
}

#[test]
fn webauthn_settings() {
    // Development defaults: the local host's origin, the TOTP issuer as name.
    let c = parse(&[("TOTP_ISSUER", "Acme")]).unwrap();
    assert_eq!(c.webauthn_rp_id, "localhost");
    assert_eq!(c.webauthn_origins, ["http://localhost:3001"]);
    assert_eq!(c.webauthn_rp_name, "Acme");
    for name in ["WEBAUTHN_RP_ID", "WEBAUTHN_RP_NAME", "WEBAUTHN_ORIGINS"] {
        assert!(SETTING_NAMES.contains(&name), "{name}");
    }
    // Production needs both the RP ID and the origins, like the secrets.
    assert_eq!(
        prod(&[("WEBAUTHN_RP_ID", "")]).unwrap_err(),
        "WEBAUTHN_RP_ID is required in production"
    );
    assert_eq!(
        prod(&[("WEBAUTHN_ORIGINS", " ")]).unwrap_err(),
        "WEBAUTHN_ORIGINS is required in production"
    );
    let c = prod(&[
        ("WEBAUTHN_RP_ID", "Example.COM"),
        (
            "WEBAUTHN_ORIGINS",
            "https://example.com/, https://login.example.com:8443",
        ),
        ("WEBAUTHN_RP_NAME", "Example"),
    ])
    .unwrap();
    assert_eq!(c.webauthn_rp_id, "example.com");
    assert_eq!(
        c.webauthn_origins,
        ["https://example.com", "https://login.example.com:8443"]
    );
    assert_eq!(c.webauthn_rp_name, "Example");
    // An RP ID is a bare domain; every origin is on it.
    for bad in [
        "https://example.com",
        "example.com:443",
        "exa mple.com",
        "a..b",
        "example.com/x",
    ] {
        assert!(
            parse(&[("WEBAUTHN_RP_ID", bad)])
                .unwrap_err()
                .contains("WEBAUTHN_RP_ID"),
            "{bad}"
        );
    }
    for bad in [
        "https://evil.example",
        "https://notexample.com",
        "ftp://example.com",
        "example.com",
        "https://example.com/path",
        ",",
    ] {
        let err =
            parse(&[("WEBAUTHN_RP_ID", "example.com"), ("WEBAUTHN_ORIGINS", bad)]).unwrap_err();
        assert!(err.contains("WEBAUTHN_ORIGINS"), "{bad}: {err}");
    }
    // Production warns about an http origin on a public domain.
    let c = prod(&[("WEBAUTHN_ORIGINS", "http://example.com")]).unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("not https")));
}
