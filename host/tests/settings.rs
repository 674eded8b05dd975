//! `KV_EMULATE`: its default, its values, a refusal to start on anything
//! else, and the start-up line that names the effective mode; the parsing
//! of `MAX_HEAVY_INSTANCES`; each component's `environment` in the
//! manifest, which becomes its WASI environment as under `spin up`.

// The shared support module's bounded waits read the clock, as the other
// host tests allow.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod support;

use tfa_host::kv::KvEmulation;
use tfa_host::HostSettings;

fn settings(pairs: &[(&str, &str)]) -> anyhow::Result<HostSettings> {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    HostSettings::from_env(&|n: &str| env.get(n).cloned())
}

#[test]
fn kv_emulate_parses() {
    assert_eq!(settings(&[]).unwrap().kv_emulate, KvEmulation::Spin402);
    assert_eq!(
        settings(&[("KV_EMULATE", "")]).unwrap().kv_emulate,
        KvEmulation::Spin402
    );
    assert_eq!(
        settings(&[("KV_EMULATE", " spin-4.0.2 ")])
            .unwrap()
            .kv_emulate,
        KvEmulation::Spin402
    );
    assert_eq!(
        settings(&[("KV_EMULATE", "none")]).unwrap().kv_emulate,
        KvEmulation::None
    );
    let e = settings(&[("KV_EMULATE", "spin-3")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("KV_EMULATE") && e.contains("spin-3") && e.contains("spin-4.0.2"),
        "{e}"
    );
}

/// `MAX_HEAVY_INSTANCES`: two per core unless set; at least 1 and at most
/// the instance slots.
#[test]
fn max_heavy_instances_parses() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(settings(&[]).unwrap().limits.heavy_instances, 2 * cores);
    assert_eq!(
        settings(&[("MAX_HEAVY_INSTANCES", " 3 ")])
            .unwrap()
            .limits
            .heavy_instances,
        3
    );
    for bad in ["0", "65", "-1", "two"] {
        let e = settings(&[("MAX_HEAVY_INSTANCES", bad)])
            .err()
            .unwrap_or_else(|| panic!("MAX_HEAVY_INSTANCES={bad} was taken"));
        assert!(format!("{e:#}").contains("MAX_HEAVY_INSTANCES"), "{e:#}");
    }
}

/// The component's variables are the settings that are set: an unset or
/// blank one is undefined (the component treats it as empty), so
/// `wasi:config/store.get-all` copies only these into the guest.
#[test]
fn only_the_settings_that_are_set_become_variables() {
    let env: HashMap<&str, &str> = [
        ("JWT_ACCESS_SECRET", "a-secret"),
        ("CORS_ORIGINS", "  "),
        ("NODE_ENV", ""),
        ("NOT_A_SETTING", "x"),
    ]
    .into_iter()
    .collect();
    let (variables, set) = tfa_host::service_settings(&|n: &str| env.get(n).map(|v| v.to_string()));
    assert_eq!(
        variables.into_iter().collect::<Vec<_>>(),
        vec![("jwt_access_secret".to_string(), "a-secret".to_string())]
    );
    assert_eq!(
        set,
        vec![("JWT_ACCESS_SECRET".to_string(), "a-secret".to_string())]
    );
}

/// Runs the host binary with `pairs` and a component path that does not
/// exist, so it stops by itself right after opening the store; killed if
/// it is still running after 60 s.
fn run_host(name: &str, pairs: &[(&str, &str)]) -> (Output, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tfa-host-settings-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tfa-host"))
        .env("PORT", "0")
        .env("DATA_DIR", &dir)
        .env("COMPONENT_PATH", dir.join("missing.wasm"))
        // host/ has no spin.toml: the default allow-list, no manifest.
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("SPIN_MANIFEST")
        .env_remove("KV_URL")
        .env_remove("KV_EMULATE")
        .env_remove("TFA_FAIL_STORE_AFTER")
        .envs(pairs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..600 {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), dir);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    panic!(
        "tfa-host did not stop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_unknown_kv_emulate_refuses_to_start() {
    let (out, dir) = run_host("bad", &[("KV_EMULATE", "spin")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("KV_EMULATE must be `spin-4.0.2`"), "{err}");
    // It stopped before opening (or creating) the store.
    assert!(!dir.exists());
}

#[test]
fn the_effective_mode_is_logged_with_the_store() {
    for (name, pairs, shown) in [
        ("default", &[][..], "KV_EMULATE=spin-4.0.2"),
        ("none", &[("KV_EMULATE", "none")][..], "KV_EMULATE=none"),
    ] {
        let (out, dir) = run_host(name, pairs);
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.starts_with("tfa-host: key-value store: sqlite "))
            .unwrap_or_else(|| panic!("no store line in {err}"));
        assert!(line.ends_with(&format!("({shown})")), "{line}");
        assert_eq!(err.matches("KV_EMULATE=").count(), 1, "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A manifest with the two components, the API's `environment` being
/// `api_env` (TOML inline-table entries).
fn manifest(name: &str, api_env: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tfa-manifest-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("spin.toml");
    std::fs::write(
        &path,
        format!(
            "spin_manifest_version = 2\n[application]\nname = \"t\"\n\
             [component.two-factor-auth]\nsource = \"spin_app.wasm\"\n\
             environment = {{ {api_env} }}\n\
             [component.tfa-mailer]\nsource = \"tfa_mailer.wasm\"\n"
        ),
    )
    .unwrap();
    path
}

/// `tfa-host` serving the real component under a manifest whose API
/// `environment` is `api_env`.
fn serve_with_environment(name: &str, api_env: &str) -> support::Host {
    let path = manifest(name, api_env);
    support::Host::start(
        &format!("manifest-{name}"),
        &support::real_component(),
        &[("SPIN_MANIFEST", path.to_str().unwrap())],
    )
}

fn has_hsts(head: &str) -> bool {
    head.to_ascii_lowercase()
        .contains("strict-transport-security")
}

#[test]
fn the_manifests_environment_reaches_the_component() {
    // NODE_ENV=production from the manifest alone: without its four
    // signing secrets the service answers 503 to everything.
    let host = serve_with_environment("prod", r#"NODE_ENV = "production""#);
    let (status, head, body) = host.request("GET", "/api/health", "");
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(body.contains(r#""success":false"#), "{body}");
    for (line, what) in [
        (
            "environment of two-factor-auth from the manifest: NODE_ENV",
            "the names are logged",
        ),
        (
            "every request will be answered 503",
            "the host's own check of the settings saw production without secrets",
        ),
    ] {
        host.wait_line(true, line, Duration::from_secs(5))
            .expect(what);
    }
    drop(host);

    // With the secrets (and the passkey origin) there too it serves, as
    // production (Strict-Transport-Security); the values are not logged.
    let secret = |c: char| c.to_string().repeat(40);
    let host = serve_with_environment(
        "prod-secrets",
        &format!(
            r#"NODE_ENV = "production", JWT_ACCESS_SECRET = "{}", JWT_REFRESH_SECRET = "{}", TEMP_TOKEN_SECRET = "{}", DEVICE_TOKEN_SECRET = "{}", WEBAUTHN_RP_ID = "example.com", WEBAUTHN_ORIGINS = "https://example.com""#,
            secret('a'),
            secret('b'),
            secret('c'),
            secret('d')
        ),
    );
    let (status, head, body) = host.request("GET", "/api/health", "");
    assert_eq!((status, has_hsts(&head)), (200, true), "{head}\n{body}");
    let logged = |needle: &str| host.count_lines(true, needle) + host.count_lines(false, needle);
    assert_eq!(logged(&secret('a')), 0, "a secret was logged");
    assert_eq!(logged("is not set"), 0, "the host's check saw the secrets");
    drop(host);

    // Without an `environment`, the same component serves in development.
    let host = serve_with_environment("dev", "");
    let (status, head, _) = host.request("GET", "/api/health", "");
    assert_eq!((status, has_hsts(&head)), (200, false), "{head}");
}

#[test]
fn an_environment_value_that_is_not_a_string_refuses_to_start() {
    let path = manifest("bad", "RATE_LIMIT_ENABLED = false");
    let (out, dir) = run_host("bad-env", &[("SPIN_MANIFEST", path.to_str().unwrap())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "environment RATE_LIMIT_ENABLED of [component.two-factor-auth] is not a string"
        ),
        "{err}"
    );
    assert!(!dir.exists(), "it stopped before opening the store");
}
