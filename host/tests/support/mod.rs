//! Shared by the host's tests: the test floor component and a `tfa-host`
//! process started and stopped by the test, on 127.0.0.1 (the operating
//! tests: `limits.rs`, `logs.rs`, `metrics.rs`, ...), and temporary
//! directories for the stores' tests.

#![allow(dead_code)] // each test file uses a part
#![allow(clippy::disallowed_methods)] // it waits for the host by the clock

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// The bench floor component built with its test-only routes (`/hang`, `/request-id`)
/// (`TFA_HANG_WASM`, else built once into `target/hang-build`, a target
/// directory of its own so it never waits on this test's cargo lock).
pub fn hang_component() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("TFA_HANG_WASM") {
                return PathBuf::from(p);
            }
            let root = workspace_root();
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target"))
                .join("hang-build");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args([
                    "build",
                    "--release",
                    "--target",
                    "wasm32-wasip2",
                    "-p",
                    "tfa-bench-floor",
                    "--features",
                    "test-routes",
                ])
                .env("CARGO_TARGET_DIR", &target)
                .current_dir(&root)
                .status()
                .expect("run cargo");
            assert!(status.success(), "building the floor component failed");
            let wasm = target.join("wasm32-wasip2/release/tfa_bench_floor.wasm");
            assert!(wasm.exists(), "{} was not produced", wasm.display());
            wasm
        })
        .clone()
}

pub struct Host {
    child: Child,
    pub port: u16,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    data: PathBuf,
}

impl Host {
    /// Starts `tfa-host` serving `wasm` with the settings `pairs`; waits
    /// (at most 600 s: the first start compiles) for its listening line.
    pub fn start(name: &str, wasm: &Path, pairs: &[(&str, &str)]) -> Host {
        let data = std::env::temp_dir().join(format!("tfa-host-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let cache = std::env::temp_dir().join("tfa-host-ops-cache");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tfa-host"));
        for n in tfa_core::contract::config::SETTING_NAMES {
            cmd.env_remove(n);
        }
        for n in [
            "KV_URL",
            "TFA_FAIL_STORE_AFTER",
            "REQUEST_TIMEOUT_MS",
            "HEADER_READ_TIMEOUT_MS",
            "IDLE_TIMEOUT_MS",
            "MAX_CONNECTIONS",
            "MAX_HEAVY_INSTANCES",
            "LOG_FORMAT",
            "METRICS_ADDR",
            "KV_CA_FILE",
        ] {
            cmd.env_remove(n);
        }
        cmd.env("PORT", "0")
            .env("DATA_DIR", &data)
            .env("CACHE_DIR", &cache)
            .env("COMPONENT_PATH", wasm)
            .env_remove("SPIN_MANIFEST")
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        for (k, v) in pairs {
            cmd.env(k, v);
        }
        let (child, port, stdout, stderr) = spawn_listening(&mut cmd);
        Host {
            child,
            port,
            stdout,
            stderr,
            data,
        }
    }

    /// Starts `tfa-host` as [`Host::start`] does, with metrics on a free
    /// loopback port (`METRICS_ADDR`); waits for its `metrics on` line.
    /// The host and the metrics port.
    pub fn start_with_metrics(name: &str, wasm: &Path, pairs: &[(&str, &str)]) -> (Host, u16) {
        let mport = free_port();
        let maddr = format!("127.0.0.1:{mport}");
        let mut all = vec![("METRICS_ADDR", maddr.as_str())];
        all.extend_from_slice(pairs);
        let host = Host::start(name, wasm, &all);
        host.wait_line(
            true,
            &format!("metrics on http://{maddr}/metrics"),
            Duration::from_secs(1),
        )
        .expect("the host says where its metrics are");
        (host, mport)
    }

    /// One request on a new connection; (status, head, body).
    pub fn request(&self, method: &str, path: &str, extra_headers: &str) -> (u16, String, String) {
        request(self.port, method, path, extra_headers)
    }

    /// Waits up to `within` for a line of stdout (`err`: stderr) with
    /// `needle`.
    pub fn wait_line(&self, err: bool, needle: &str, within: Duration) -> Option<String> {
        let until = Instant::now() + within;
        loop {
            let lines = if err { &self.stderr } else { &self.stdout };
            if let Some(l) = lines.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return Some(l.clone());
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn count_lines(&self, err: bool, needle: &str) -> usize {
        let lines = if err { &self.stderr } else { &self.stdout };
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// Lines a child process wrote, collected as they come.
pub type Lines = Arc<Mutex<Vec<String>>>;

/// Spawns `cmd` (a `tfa-host`), collects its stdout and stderr lines (stderr
/// also echoed with a `[tfa-host]` prefix), and waits (at most 600 s: the
/// first start compiles) for its `listening on` line; the port it names.
pub fn spawn_listening(cmd: &mut Command) -> (Child, u16, Lines, Lines) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tfa-host");
    let stdout: Lines = Arc::new(Mutex::new(Vec::new()));
    let stderr: Lines = Arc::new(Mutex::new(Vec::new()));
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
    (child, port, stdout, stderr)
}

/// One request with `Connection: close`; (status, head, body).
pub fn request(port: u16, method: &str, path: &str, extra_headers: &str) -> (u16, String, String) {
    request_with_body(port, method, path, extra_headers, "")
}

/// [`request`] with a body.
pub fn request_with_body(
    port: u16,
    method: &str,
    path: &str,
    extra_headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{extra_headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}

/// The API component (`TFA_COMPONENT_WASM`, else the release build in the
/// target directory; when it is missing both components are built once
/// into `target/smoke-build`).
pub fn real_component() -> PathBuf {
    real_wasm("TFA_COMPONENT_WASM", "spin_app.wasm")
}

/// The mailer component (`TFA_MAILER_WASM`, else beside the API
/// component, as `tfa-host` looks for it).
pub fn real_mailer() -> PathBuf {
    real_wasm("TFA_MAILER_WASM", "tfa_mailer.wasm")
}

fn real_wasm(var: &str, file: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let built = target.join("wasm32-wasip2/release").join(file);
    if built.exists() {
        return built;
    }
    static OWN: OnceLock<PathBuf> = OnceLock::new();
    let own = OWN.get_or_init(|| {
        let own = target.join("smoke-build");
        eprintln!(
            "host tests: {} is missing; building the components…",
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
                "-p",
                "tfa-mailer",
            ])
            .env("CARGO_TARGET_DIR", &own)
            .current_dir(workspace_root())
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the components failed");
        own
    });
    let wasm = own.join("wasm32-wasip2/release").join(file);
    assert!(wasm.exists(), "{} was not produced", wasm.display());
    wasm
}

/// A free port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The value of the sample named `name` with all of `labels` in the
/// Prometheus text `text`, or 0.
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// A fresh directory under the system's temporary one, removed on drop;
/// never a path this process used before (a test may make several of one
/// name).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("tfa-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// The SQLite store's database file in it.
    pub fn db(&self) -> PathBuf {
        self.0.join("kv.sqlite3")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
