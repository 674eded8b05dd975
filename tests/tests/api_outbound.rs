//! Issue #14, through the real `.wasm` in the local host: webhooks to a name
//! listed nowhere (only the wildcard `https://*:*`) are delivered over TLS;
//! the same kind of name resolving to a blocked network is refused at
//! connect time, with the reason in the delivery log, and nothing reaches a
//! listener; a name answering a public address first and a private one
//! second is refused on the second; a 3xx is not followed.
//!
//! Name resolution comes from the host's test hook `TFA_TEST_RESOLVE` (no
//! DNS), the receiver's CA from `TFA_TEST_CA_FILE`, and 127.0.0.2 stands in
//! for a public address (`TFA_TEST_PUBLIC_ADDRS`); all three need
//! `TFA_TEST_HOOKS=1`. Blocked addresses are refused before any connect, so
//! no packet leaves for them. Local host only (Spin has no such hooks).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e::api::*;
use e2e::client::Client;
use e2e::procs::{Host, HostOptions};
use serde_json::{json, Value};

/// `tests/hooks/receiver.py`: HTTPS for `hook.test` and `flip.test` on 127.0.0.2.
struct Receiver {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Receiver {
    fn start() -> Receiver {
        Self::start_on("127.0.0.2", 0, "hook.test,flip.test").expect("receiver")
    }

    /// Starts the receiver on `bind:port` for the comma-separated `names`;
    /// `Err` with the reason when it cannot bind.
    fn start_on(bind: &str, port: u16, names: &str) -> Result<Receiver, String> {
        let dir = std::env::temp_dir().join(format!(
            "tfa-hook-receiver-{}-{bind}-{port}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("receiver dir");
        let mut child = Command::new(e2e::smtp::python())
            .arg(e2e::root().join("tests/hooks/receiver.py"))
            .arg("--dir")
            .arg(&dir)
            .args(["--name", names, "--bind", bind, "--lifetime", "120"])
            .args(["--port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("receiver output");
        let Some(port) = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
        else {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("receiver did not start: {line:?}"));
        };
        Ok(Receiver { child, port, dir })
    }

    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("requests.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The delivery `delivery_id` of hook `id` once it has an attempt (bounded).
fn delivery(c: &Client, token: &str, id: &str, delivery_id: &str) -> Value {
    for _ in 0..60 {
        let log = c
            .get(&format!("/api/webhooks/{id}/deliveries"), Some(token))
            .data();
        let found = log["deliveries"].as_array().and_then(|ds| {
            ds.iter()
                .find(|d| d["id"] == delivery_id)
                .filter(|d| d["attempts"].as_array().is_some_and(|a| !a.is_empty()))
                .cloned()
        });
        if let Some(d) = found {
            return d;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("hook {id}: delivery {delivery_id} has no attempt");
}

/// Registers a hook at `url` and sends it a test event: (hook, delivery).
fn hook_and_test(c: &Client, token: &str, url: &str) -> (String, String) {
    let r = c.post(
        "/api/webhooks",
        &json!({ "url": url, "events": ["user.login"] }),
        Some(token),
    );
    let id = r.data()["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{url}: {}", r.json()))
        .to_string();
    let delivery_id = send_test(c, token, &id);
    (id, delivery_id)
}

fn send_test(c: &Client, token: &str, id: &str) -> String {
    let r = c.post(&format!("/api/webhooks/{id}/test"), &json!({}), Some(token));
    r.data()["deliveryId"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.json()))
        .to_string()
}

const BLOCKED: &[&str] = &[
    "127.0.0.1",
    "10.0.0.5",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "198.18.0.1",
    "203.0.113.7",
    "224.0.0.1",
    "0.0.0.0",
    "::1",
    "fe80::1",
    "fd00:ec2::254",
    "fc00::1",
    "::ffff:10.0.0.5",
    "64:ff9b::a00:5",
    "2002:a00:5::1",
    "2001:db8::1",
];

#[test]
fn webhooks_to_unlisted_names_and_the_connect_time_block_list() {
    if e2e::procs::runtime() != e2e::procs::Runtime::Local {
        return;
    }
    let rx = Receiver::start();
    let port = rx.port;
    let mut resolve = vec![
        format!("hook.test:{port}:127.0.0.2"),
        // Rebinding: public on the first lookup, private on the second.
        format!("flip.test:{port}:127.0.0.2"),
        format!("flip.test:{port}:10.0.0.5"),
    ];
    for (i, addr) in BLOCKED.iter().enumerate() {
        resolve.push(format!("blocked{i}.test:{port}:{addr}"));
    }
    let host = Host::start(HostOptions {
        env: vec![
            ("TFA_TEST_HOOKS".into(), "1".into()),
            ("TFA_TEST_RESOLVE".into(), resolve.join(",")),
            ("TFA_TEST_PUBLIC_ADDRS".into(), "127.0.0.2".into()),
            (
                "TFA_TEST_CA_FILE".into(),
                rx.dir.join("ca.pem").display().to_string(),
            ),
            // The deployer's opt-in to webhook URLs on any port: a wildcard,
            // so these names are listed nowhere explicitly.
            ("ALLOWED_OUTBOUND_HOSTS".into(), "https://*:*".into()),
            ("RATE_LIMIT_ENABLED".into(), "false".into()),
        ],
        ..Default::default()
    });
    assert!(host.output().contains("TEST HOOKS ON"), "{}", host.output());
    let c = &host.client;

    // Delivered over TLS to a name listed nowhere.
    let u = register(c, "hana");
    let (id, d) = hook_and_test(c, &u.access, &format!("https://hook.test:{port}/hook"));
    let got = delivery(c, &u.access, &id, &d);
    assert_eq!(
        got["attempts"][0]["statusCode"],
        200,
        "{got}\n{}",
        host.output()
    );
    assert_eq!(rx.requests(), ["POST /hook"]);

    // A 3xx is not followed: one request, the redirect recorded as such.
    let (id, d) = hook_and_test(c, &u.access, &format!("https://hook.test:{port}/redirect"));
    let got = delivery(c, &u.access, &id, &d);
    assert_eq!(got["attempts"][0]["statusCode"], 302, "{got}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(rx.requests(), ["POST /hook", "POST /redirect"]);

    // Public, then private: the second delivery is refused at connect time.
    let (id, d) = hook_and_test(c, &u.access, &format!("https://flip.test:{port}/flip"));
    let got = delivery(c, &u.access, &id, &d);
    assert_eq!(got["attempts"][0]["statusCode"], 200, "{got}");
    let d = send_test(c, &u.access, &id);
    let got = delivery(c, &u.access, &id, &d);
    let err = got["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(err.contains("blocked network 10.0.0.5"), "{got}");
    assert_eq!(rx.requests().len(), 3, "{:?}", rx.requests());

    // Every blocked range: refused, reason in the delivery log, nothing sent.
    // (At most 10 hooks per user: a new user per batch.)
    for (batch, chunk) in BLOCKED.chunks(9).enumerate() {
        let u = register(c, &format!("blk{batch}"));
        for (j, addr) in chunk.iter().enumerate() {
            let i = batch * 9 + j;
            let (id, d) = hook_and_test(c, &u.access, &format!("https://blocked{i}.test:{port}/x"));
            let got = delivery(c, &u.access, &id, &d);
            let err = got["attempts"][0]["error"].as_str().unwrap_or_default();
            let shown = addr.parse::<std::net::IpAddr>().unwrap().to_string();
            assert!(
                err.contains(&format!("blocked network {shown}")),
                "{addr}: {got}"
            );
        }
    }
    assert!(
        host.output()
            .contains("denied: blocked network 169.254.169.254"),
        "{}",
        host.output()
    );
    assert_eq!(rx.requests().len(), 3, "{:?}", rx.requests());
}

/// The shipped `spin.toml` alone (no `ALLOWED_OUTBOUND_HOSTS`): its
/// `https://*:443` entry lets a webhook reach a customer's name on port 443,
/// and a URL on another port is denied by the allow-list, with that reason
/// in the delivery log. The receiver binds 127.0.0.3:443, which needs root
/// (or CAP_NET_BIND_SERVICE); without it the test says so and returns.
#[test]
fn the_manifest_alone_allows_webhooks_on_443() {
    if e2e::procs::runtime() != e2e::procs::Runtime::Local {
        return;
    }
    let name = "hooks.customer.example";
    let rx = match Receiver::start_on("127.0.0.3", 443, name) {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("SKIPPED the_manifest_alone_allows_webhooks_on_443: cannot bind 127.0.0.3:443 ({e})");
            return;
        }
    };
    let host = Host::start(HostOptions {
        env: vec![
            ("TFA_TEST_HOOKS".into(), "1".into()),
            (
                "TFA_TEST_RESOLVE".into(),
                format!("{name}:443:127.0.0.3,{name}:8443:127.0.0.3"),
            ),
            ("TFA_TEST_PUBLIC_ADDRS".into(), "127.0.0.3".into()),
            (
                "TFA_TEST_CA_FILE".into(),
                rx.dir.join("ca.pem").display().to_string(),
            ),
        ],
        ..Default::default()
    });
    assert!(
        host.output().contains("https://*:443"),
        "the effective allow-list, logged at start, has the manifest's wildcard:\n{}",
        host.output()
    );
    let c = &host.client;
    let u = register(c, "wilma");
    let (id, d) = hook_and_test(c, &u.access, &format!("https://{name}/hook"));
    let got = delivery(c, &u.access, &id, &d);
    assert_eq!(
        got["attempts"][0]["statusCode"],
        200,
        "{got}\n{}",
        host.output()
    );
    assert_eq!(rx.requests(), ["POST /hook"]);

    let (id, d) = hook_and_test(c, &u.access, &format!("https://{name}:8443/other"));
    let got = delivery(c, &u.access, &id, &d);
    let err = got["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(err.contains("denied by allowed_outbound_hosts"), "{got}");
    assert_eq!(rx.requests(), ["POST /hook"]);
}
