//! The local host killed with SIGKILL while 32 clients register and log in:
//! after a restart every registration that was answered 201 is there and
//! logs in, with either store in `DATA_DIR`: SQLite (whose file then passes
//! its integrity check) and the log store (`KV_ENGINE=log`). A request killed
//! while it held a user record's lock leaves the lock behind; it lapses
//! after two lease periods (`tfa_core::plumbing::lock`, 20 s), during which that
//! user's login answers 503 `Service unavailable`, never anything else.

#![allow(clippy::disallowed_methods)] // the test bounds its wait with wall time
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::api::PASSWORD;
use e2e::procs::{Host, HostOptions};
use serde_json::json;

#[test]
fn acknowledged_registrations_survive_sigkill() {
    registrations_survive_sigkill(&[]);
}

#[test]
fn acknowledged_registrations_survive_sigkill_with_the_log_store() {
    registrations_survive_sigkill(&[("KV_ENGINE", "log")]);
}

fn registrations_survive_sigkill(engine: &[(&str, &str)]) {
    let engine: Vec<(String, String)> = engine
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let log_store = !engine.is_empty();
    let mut env = vec![("TRUST_PROXY".into(), "true".into())];
    env.extend(engine.iter().cloned());
    let opts = HostOptions {
        env,
        ..Default::default()
    };
    let host = Host::start(opts.clone());
    let client = host.client.clone();
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let (c, ack, stop) = (client.clone(), acknowledged.clone(), stop.clone());
            std::thread::spawn(move || {
                // Each worker is its own client address (TRUST_PROXY), so the
                // per-IP limits allow its 5 registrations and 5 logins.
                let ip = format!("10.20.{w}.1");
                for i in 0..5 {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let name = format!("crash{w}x{i}");
                    let body = json!({ "email": format!("{name}@example.com"), "username": name, "password": PASSWORD });
                    match c.try_send("POST", "/api/auth/register", &[("Content-Type", "application/json"), ("X-Forwarded-For", &ip)], body.to_string().as_bytes()) {
                        Ok(r) if r.status == 201 => ack.lock().unwrap().push(name.clone()),
                        Ok(_) => {}
                        Err(_) => return, // the host is gone
                    }
                    let login = json!({ "emailOrUsername": name, "password": PASSWORD });
                    if c.try_send("POST", "/api/auth/login", &[("Content-Type", "application/json"), ("X-Forwarded-For", &ip)], login.to_string().as_bytes()).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    // Let some registrations through, then kill the host mid-flight.
    let start = std::time::Instant::now();
    while acknowledged.lock().unwrap().len() < 40 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let restart = HostOptions {
        data_dir: Some(host.data_dir.clone()),
        ..opts
    };
    host.kill();
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    let names = acknowledged.lock().unwrap().clone();
    assert!(
        names.len() >= 40,
        "only {} registrations before the kill",
        names.len()
    );

    // The SQLite file is intact (the log store checks its own frames when
    // it opens, below).
    let db = restart.data_dir.as_ref().unwrap().join("kv.sqlite3");
    assert_eq!(db.exists(), !log_store);
    if !log_store {
        let check = std::process::Command::new("python3")
        .args(["-c", "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])"])
        .arg(&db)
        .output()
        .expect("python3 runs");
        assert_eq!(
            String::from_utf8_lossy(&check.stdout).trim(),
            "ok",
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }

    // Every acknowledged registration logs in after a restart.
    let mut env = vec![("RATE_LIMIT_ENABLED".into(), "false".into())];
    env.extend(engine);
    let host = Host::start(HostOptions { env, ..restart });
    let lapse = Duration::from_millis(2 * tfa_core::plumbing::lock::LEASE_MS + 5_000);
    let restarted = std::time::Instant::now();
    for name in &names {
        let body = json!({ "emailOrUsername": name, "password": PASSWORD });
        let mut r = host.client.post("/api/auth/login", &body, None);
        while r.status == 503 && restarted.elapsed() < lapse {
            r.assert_error(503, "Service unavailable");
            std::thread::sleep(Duration::from_millis(500));
            r = host.client.post("/api/auth/login", &body, None);
        }
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}
