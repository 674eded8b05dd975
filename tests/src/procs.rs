//! Processes the tests start and stop themselves, on 127.0.0.1 only: the
//! local host serving the real component, and Redis.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::Client;

/// Settings every test host gets unless overridden: fixed secrets, cheap
/// Argon2 (the default parameters are exercised by core's known-answer
/// tests and by the benchmarks), CORS for one origin.
pub const TEST_SETTINGS: &[(&str, &str)] = &[
    (
        "JWT_ACCESS_SECRET",
        "e2e-access-secret-e2e-access-secret-e2e-access-01",
    ),
    (
        "JWT_REFRESH_SECRET",
        "e2e-refresh-secret-e2e-refresh-secret-e2e-refr-02",
    ),
    (
        "TEMP_TOKEN_SECRET",
        "e2e-temp-secret-e2e-temp-secret-e2e-temp-secret-03",
    ),
    (
        "DEVICE_TOKEN_SECRET",
        "e2e-device-secret-e2e-device-secret-e2e-device-04",
    ),
    ("ARGON2_MEMORY_KIB", "1024"),
    ("ARGON2_ITERATIONS", "1"),
    ("CORS_ORIGINS", "https://app.example.com"),
];

/// A unique scratch directory under the target directory.
pub fn scratch_dir(name: &str) -> PathBuf {
    let base = crate::root().join("target").join("e2e-scratch");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = base.join(format!("{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// How to start a host.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Data directory (a fresh one when None).
    pub data_dir: Option<PathBuf>,
    /// `KV_URL` (Redis) instead of SQLite.
    pub kv_url: Option<String>,
    /// Extra or overriding environment.
    pub env: Vec<(String, String)>,
}

/// A running local host.
pub struct Host {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    /// A client for it.
    pub client: Client,
    /// Its data directory.
    pub data_dir: PathBuf,
    output: Arc<Mutex<String>>,
}

fn pump(stream: impl Read + Send + 'static, sink: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Ok(mut s) = sink.lock() {
                s.push_str(&line);
                s.push('\n');
            }
        }
    });
}

impl Host {
    /// Starts a host with the test settings and waits (bounded) until it
    /// answers.
    pub fn start(opts: HostOptions) -> Host {
        let port = crate::free_port();
        let data_dir = opts.data_dir.clone().unwrap_or_else(|| scratch_dir("host"));
        let mut cmd = Command::new(crate::host_bin());
        cmd.current_dir(crate::root())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PORT", port.to_string())
            .env("DATA_DIR", &data_dir)
            .env(
                "CACHE_DIR",
                crate::root().join("target").join("e2e-compile-cache"),
            )
            .env("COMPONENT_PATH", crate::component_wasm())
            .env("SPIN_MANIFEST", crate::root().join("spin.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in TEST_SETTINGS {
            cmd.env(k, v);
        }
        if let Some(url) = &opts.kv_url {
            cmd.env("KV_URL", url);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the host starts");
        let output = Arc::new(Mutex::new(String::new()));
        pump(child.stdout.take().expect("stdout"), output.clone());
        pump(child.stderr.take().expect("stderr"), output.clone());
        let host = Host {
            child: Some(child),
            port,
            client: Client::new(port),
            data_dir,
            output,
        };
        host.wait_ready(Duration::from_secs(180));
        host
    }

    /// Restarts on the same data directory (after [`Host::stop`] or
    /// [`Host::kill`]).
    pub fn restart_options(&self) -> HostOptions {
        HostOptions {
            data_dir: Some(self.data_dir.clone()),
            ..Default::default()
        }
    }

    fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            // Any HTTP answer means it serves (a host with bad production
            // settings answers 503 to everything, by design).
            if self
                .client
                .try_send("GET", "/api/health/live", &[], b"")
                .is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "host did not become ready within {limit:?}; output:\n{}",
            self.output()
        );
    }

    /// Everything the host printed so far.
    pub fn output(&self) -> String {
        self.output.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits (bounded) until the output contains `needle`.
    pub fn wait_output(&self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.output().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// SIGTERM, then waits (bounded) for a clean exit; returns the exit code.
    pub fn stop(mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// SIGKILL, at once.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A real `redis-server` on 127.0.0.1, without persistence.
pub struct Redis {
    child: Child,
    /// Its port.
    pub port: u16,
}

impl Redis {
    /// Starts `redis-server` (Debian's package; the test script installs it)
    /// and waits until it answers PING.
    pub fn start() -> Redis {
        let port = crate::free_port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        let r = Redis { child, port };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if r.ping() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not answer PING");
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
