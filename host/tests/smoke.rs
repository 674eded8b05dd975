//! Smoke test: the built `tfa-host` binary serving the real component.
//!
//! The component is `target/wasm32-wasip2/release/spin_app.wasm` (or
//! `TFA_COMPONENT_WASM`); when it is missing the test builds it once with
//! `cargo build --target wasm32-wasip2 --release -p spin-app` (into a
//! separate target directory, so it never waits on this test's own cargo
//! lock).

// The shared support module's bounded waits read the clock, as the other
// host tests allow.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

mod support;

use support::{real_component as component, spawn_listening, workspace_root, Lines};

struct Host {
    child: Child,
    port: u16,
    stdout: Lines,
    stderr: Lines,
}

impl Host {
    fn start(wasm: &Path, data_dir: &Path) -> Host {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tfa-host"));
        for name in tfa_core::contract::config::SETTING_NAMES {
            cmd.env_remove(name);
        }
        cmd.env("PORT", "0")
            .env("DATA_DIR", data_dir)
            .env("COMPONENT_PATH", wasm)
            .env("SPIN_MANIFEST", workspace_root().join("spin.toml"))
            .env_remove("KV_URL")
            .env_remove("TFA_FAIL_STORE_AFTER");
        let (child, port, stdout, stderr) = spawn_listening(&mut cmd);
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

    // SIGTERM stops it cleanly, and closes the store: SQLite's last close
    // copies the write-ahead log into the database file and removes it.
    let wal = data.join("kv.sqlite3-wal");
    assert!(wal.exists(), "the running host's store has its log");
    let status = host.terminate();
    assert!(status.success(), "exit status {status:?}");
    assert!(data.join("kv.sqlite3").exists());
    assert!(
        !wal.exists(),
        "the stopped host left its store's log behind"
    );

    // A second start loads the compiled component from the cache.
    let host = Host::start(&wasm, &data);
    assert!(host.stderr_has("loaded compiled component"));
    let (status, _, _) = host.request("GET", "/api/health", b"");
    assert_eq!(status, 200);
    drop(host);
    let _ = std::fs::remove_dir_all(&data);
}
