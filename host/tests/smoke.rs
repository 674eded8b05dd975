//! Smoke test: the built `tfa-host` binary serving the real component.
//!
//! The component is `target/wasm32-wasip2/release/spin_app.wasm` (or
//! `TFA_COMPONENT_WASM`); when it is missing the test builds it once with
//! `cargo build --target wasm32-wasip2 --release -p spin-app` (into a
//! separate target directory, so it never waits on this test's own cargo
//! lock).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

fn component() -> PathBuf {
    if let Some(p) = std::env::var_os("TFA_COMPONENT_WASM") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let built = target.join("wasm32-wasip2/release/spin_app.wasm");
    if built.exists() {
        return built;
    }
    let own_target = target.join("smoke-build");
    let wasm = own_target.join("wasm32-wasip2/release/spin_app.wasm");
    eprintln!(
        "smoke: {} is missing; building the component…",
        built.display()
    );
    // The target may be missing on a fresh machine.
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("wasm32-wasip2"))
        .unwrap_or(true);
    if !installed {
        let ok = Command::new("rustup")
            .args(["target", "add", "wasm32-wasip2"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "rustup target add wasm32-wasip2 failed");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--target",
            "wasm32-wasip2",
            "--release",
            "-p",
            "spin-app",
        ])
        .env("CARGO_TARGET_DIR", &own_target)
        .current_dir(&root)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the component failed");
    assert!(wasm.exists(), "{} was not produced", wasm.display());
    wasm
}

struct Host {
    child: Child,
    port: u16,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Host {
    fn start(wasm: &Path, data_dir: &Path) -> Host {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tfa-host"));
        for name in tfa_core::contract::config::SETTING_NAMES {
            cmd.env_remove(name);
        }
        let mut child = cmd
            .env("PORT", "0")
            .env("DATA_DIR", data_dir)
            .env("COMPONENT_PATH", wasm)
            .env("SPIN_MANIFEST", workspace_root().join("spin.toml"))
            .env_remove("KV_URL")
            .env_remove("TFA_FAIL_STORE_AFTER")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tfa-host");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[tfa-host] {line}");
                if let Some(addr) = line.strip_prefix("tfa-host: listening on http://") {
                    let _ = tx.send(addr.rsplit(':').next().unwrap().parse::<u16>().unwrap());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(600))
            .expect("tfa-host did not start listening");
        Host {
            child,
            port,
            stdout,
            stderr,
        }
    }

    /// Sends one request; returns (status, headers, body).
    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        // The host may answer before reading a large body; ignore a reset.
        let _ = s.write_all(body);
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP response");
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.as_bytes().to_vec()
        };
        (status, head.to_string(), body)
    }

    fn wait_for_stdout(&self, needle: &str) -> bool {
        for _ in 0..100 {
            if self
                .stdout
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn stderr_has(&self, needle: &str) -> bool {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("tfa-host did not stop within 10 s of SIGTERM");
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&rest.as_bytes()[..n]);
        s = &rest[n + 2..];
    }
    out
}

#[test]
fn serves_the_component() {
    let wasm = component();
    let data = std::env::temp_dir().join(format!("tfa-host-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);

    let host = Host::start(&wasm, &data);
    assert!(host.stderr_has("compiling"), "first start compiles");

    // The real service behind the component: health answers 200 with the
    // health object (not wrapped in the envelope).
    let (status, head, body) = host.request("GET", "/api/health?probe=1", b"");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(health["status"], "healthy", "{health}");
    assert_eq!(health["checks"]["database"], "up", "{health}");
    // One log line per request: method, path without query, status, ms.
    assert!(
        host.wait_for_stdout("GET /api/health 200 "),
        "no request line in {:?}",
        host.stdout.lock().unwrap()
    );
    let line = host
        .stdout
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.starts_with("GET /api/health 200 "))
        .cloned()
        .unwrap();
    assert!(line.ends_with("ms") && !line.contains('?'), "{line}");

    // A body over 64 KiB is refused by the component itself.
    let big = vec![b'x'; 65537];
    let (status, head, body) = host.request("POST", "/api/auth/login", &big);
    assert_eq!(status, 413, "{head}");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({ "success": false, "error": "Request body too large" })
    );
    // Built by core's envelope builder: the security headers are there.
    assert!(
        head.to_ascii_lowercase()
            .contains("x-content-type-options: nosniff"),
        "{head}"
    );

    // Requests are served concurrently.
    let port = host.port;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.write_all(b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let mut raw = String::new();
                s.read_to_string(&mut raw).unwrap();
                raw.starts_with("HTTP/1.1 404")
            })
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().unwrap()));

    // SIGTERM stops it cleanly.
    let status = host.terminate();
    assert!(status.success(), "exit status {status:?}");

    // A second start loads the compiled component from the cache.
    let host = Host::start(&wasm, &data);
    assert!(host.stderr_has("loaded compiled component"));
    let (status, _, _) = host.request("GET", "/api/health", b"");
    assert_eq!(status, 200);
    drop(host);
    let _ = std::fs::remove_dir_all(&data);
}
