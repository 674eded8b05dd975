//! Processes the tests start and stop themselves, on 127.0.0.1 only: the
//! host serving the real component, and Redis.
//!
//! The host is the local host `tfa-host` by default. With
//! `TFA_E2E_RUNTIME=spin` and `SPIN_BIN=/path/to/spin` the same scenarios run
//! under real Spin instead: `spin up --from <repo>/spin.toml --listen
//! 127.0.0.1:<port> --state-dir <dir>`, the settings as Spin variables
//! (`SPIN_VARIABLE_<NAME>`), Redis through a generated runtime-config file
//! (see [`Runtime`] and [`Host::start`]).

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tfa_core::contract::config::SETTING_NAMES;

use crate::client::Client;

/// The runtime the end-to-end tests serve the component with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Our wasmtime-based local host `tfa-host` (the default).
    Local,
    /// Real Spin (`TFA_E2E_RUNTIME=spin`, binary in `SPIN_BIN`).
    Spin,
}

/// The runtime selected by `TFA_E2E_RUNTIME`: unset, empty or `local` is
/// the local host, `spin` is real Spin (then `SPIN_BIN` must name the
/// `spin` binary). Panics on any other value.
pub fn runtime() -> Runtime {
    match std::env::var("TFA_E2E_RUNTIME")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "" | "local" => Runtime::Local,
        "spin" => Runtime::Spin,
        other => panic!("TFA_E2E_RUNTIME={other:?}: expected \"spin\" or \"local\" (or unset)"),
    }
}

/// The `spin` binary (`SPIN_BIN`); panics with how to get one when it is
/// unset or missing.
pub fn spin_bin() -> PathBuf {
    let bin = std::env::var("SPIN_BIN").unwrap_or_default();
    assert!(
        !bin.trim().is_empty() && Path::new(&bin).is_file(),
        "TFA_E2E_RUNTIME=spin needs SPIN_BIN=/path/to/spin (got {bin:?}); \
         see ../shared/spin/BUILD.md for building Spin from source"
    );
    PathBuf::from(bin)
}

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

/// A unique scratch directory under the target directory: the process,
/// the time and a counter, since two tests of one process can ask within
/// the clock's resolution (two hosts then shared one data directory).
pub fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = crate::root().join("target").join("e2e-scratch");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(format!("{name}-{}-{nanos}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// How to start a host.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Data directory (a fresh one when None). Under Spin: the state
    /// directory (`--state-dir`: its SQLite key-value file and logs).
    pub data_dir: Option<PathBuf>,
    /// `KV_URL` (Redis) instead of SQLite. Under Spin: a generated
    /// runtime-config file with `[key_value_store.default] type = "redis"`.
    pub kv_url: Option<String>,
    /// Extra or overriding environment. Under Spin only the service's
    /// settings (passed as Spin variables) and `ALLOWED_OUTBOUND_HOSTS` with
    /// at most one `http(s)://` and one `tcp://` entry (passed as the
    /// manifest's `extra_outbound_host` / `email_outbound_host` variables)
    /// are accepted; anything else only the local host understands, and
    /// [`Host::start`] panics.
    pub env: Vec<(String, String)>,
}

/// A running host: the local host, or `spin up` (and its `spin trigger`
/// child, in their own process group).
pub struct Host {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    /// A client for it.
    pub client: Client,
    /// Its data directory (under Spin: its state directory).
    pub data_dir: PathBuf,
    output: Arc<Mutex<String>>,
    /// Under Spin: where the component's output goes.
    spin_logs: Option<SpinLogs>,
}

/// The component's log files under a Spin state directory, read from where
/// they ended when this host started (a restart on the same state directory
/// appends to the same files).
struct SpinLogs {
    dir: PathBuf,
    start: Vec<(PathBuf, u64)>,
}

impl SpinLogs {
    fn new(state_dir: &Path) -> SpinLogs {
        let dir = state_dir.join("logs");
        let start = log_files(&dir)
            .into_iter()
            .map(|p| {
                let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                (p, len)
            })
            .collect();
        SpinLogs { dir, start }
    }

    /// What the component wrote since this host started, file by file.
    fn read(&self) -> String {
        let mut out = String::new();
        for path in log_files(&self.dir) {
            let from = self
                .start
                .iter()
                .find(|(p, _)| *p == path)
                .map_or(0, |(_, len)| *len);
            let Ok(mut f) = std::fs::File::open(&path) else {
                continue;
            };
            let mut text = Vec::new();
            if f.seek(SeekFrom::Start(from)).is_ok() && f.read_to_end(&mut text).is_ok() {
                if text.is_empty() {
                    continue;
                }
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                out.push_str(&format!("--- component output ({name}) ---\n"));
                out.push_str(&String::from_utf8_lossy(&text));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// `*.txt` in `dir` (Spin's `<component>_stdout.txt`, `_stderr.txt`), sorted.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "txt"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
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

/// The Spin variables (environment `SPIN_VARIABLE_<NAME>`) for the test
/// settings and `env`; panics, naming them, on options only the local host
/// understands.
fn spin_variables(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    let mut unsupported = Vec::new();
    let (mut http_host, mut tcp_host) = (None::<String>, None::<String>);
    let settings = TEST_SETTINGS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()));
    for (k, v) in settings.chain(env.iter().cloned()) {
        if SETTING_NAMES.contains(&k.as_str()) {
            vars.push((format!("SPIN_VARIABLE_{k}"), v));
        } else if k == "ALLOWED_OUTBOUND_HOSTS" {
            // spin.toml allows one extra HTTP host and one SMTP (tcp://)
            // host through variables; more than that cannot be expressed.
            for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let slot = if entry.starts_with("tcp://") {
                    &mut tcp_host
                } else {
                    &mut http_host
                };
                match slot {
                    Some(prev) if prev != entry => unsupported.push(format!(
                        "ALLOWED_OUTBOUND_HOSTS={v:?} (spin.toml takes one http(s) host in \
                         extra_outbound_host and one tcp:// host in email_outbound_host)"
                    )),
                    _ => *slot = Some(entry.to_string()),
                }
            }
        } else {
            unsupported.push(format!("{k}={v:?}"));
        }
    }
    if !unsupported.is_empty() {
        unsupported.dedup();
        panic!(
            "TFA_E2E_RUNTIME=spin: this test needs options only the local host (tfa-host) \
             understands: {}. Skip the test under Spin (see scripts/test-spin.sh) or check \
             e2e::procs::runtime().",
            unsupported.join(", ")
        );
    }
    if let Some(h) = http_host {
        vars.push(("SPIN_VARIABLE_EXTRA_OUTBOUND_HOST".into(), h));
    }
    if let Some(h) = tcp_host {
        vars.push(("SPIN_VARIABLE_EMAIL_OUTBOUND_HOST".into(), h));
    }
    vars
}

/// Sends `signal` (`TERM`, `KILL`, `0`) to the process group `pgid`; true
/// when at least one process got it.
fn signal_group(pgid: u32, signal: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Host {
    /// Starts a host with the test settings and waits (bounded) until it
    /// answers: the local host, or real Spin when [`runtime`] says so (see
    /// `Host::start_spin`).
    pub fn start(opts: HostOptions) -> Host {
        if runtime() == Runtime::Spin {
            return Host::start_spin(opts);
        }
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
            .env("MAILER_PATH", crate::mailer_wasm())
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
        let child = cmd.spawn().expect("the host starts");
        let mut host = Host::spawned(child, port, data_dir, None);
        host.wait_ready(Duration::from_secs(180));
        host
    }

    /// A host around a process just spawned with piped output.
    fn spawned(
        mut child: Child,
        port: u16,
        data_dir: PathBuf,
        spin_logs: Option<SpinLogs>,
    ) -> Host {
        let output = Arc::new(Mutex::new(String::new()));
        pump(child.stdout.take().expect("stdout"), output.clone());
        pump(child.stderr.take().expect("stderr"), output.clone());
        Host {
            child: Some(child),
            port,
            client: Client::new(port),
            data_dir,
            output,
            spin_logs,
        }
    }

    /// Under Spin: `SPIN_BIN up --from <repo>/spin.toml --listen
    /// 127.0.0.1:<port> --state-dir <data dir> --quiet`, in a process group
    /// of its own (with the `spin trigger http` child it starts), with the
    /// settings as `SPIN_VARIABLE_<NAME>` and, for `kv_url`, a runtime-config
    /// file in a scratch directory. Component output goes to the state
    /// directory's `logs/`, which [`Host::output`] reads (`--quiet` keeps it
    /// out of Spin's own stderr, so nothing appears twice).
    fn start_spin(opts: HostOptions) -> Host {
        let vars = spin_variables(&opts.env);
        let spin = spin_bin();
        // spin.toml names the components by path; the tests must not run a
        // different build than the one they were given.
        let manifest = crate::root().join("spin.toml");
        let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        for (file, given, var) in [
            (
                "spin_app.wasm",
                crate::component_wasm(),
                "TFA_COMPONENT_WASM",
            ),
            ("tfa_mailer.wasm", crate::mailer_wasm(), "TFA_MAILER_WASM"),
        ] {
            let named = crate::root()
                .join("target/wasm32-wasip2/release")
                .join(file);
            assert!(
                same(&named, &given),
                "TFA_E2E_RUNTIME=spin: spin.toml serves {} but the component under test is {} \
                 ({var}); build it where spin.toml expects it (`spin build`)",
                named.display(),
                given.display()
            );
        }
        let port = crate::free_port();
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| scratch_dir("spin-state"));
        std::fs::create_dir_all(&data_dir).expect("state dir");
        let data_dir = data_dir.canonicalize().expect("state dir path");
        // Spin keeps its wasmtime cache under $HOME: one for all test hosts,
        // so only the first start compiles the component.
        let home = crate::root().join("target").join("e2e-spin-home");
        std::fs::create_dir_all(&home).expect("spin home");
        let mut cmd = Command::new(&spin);
        cmd.arg("up")
            .arg("--from")
            .arg(&manifest)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(&data_dir)
            .arg("--quiet");
        if let Some(url) = &opts.kv_url {
            let file = scratch_dir("spin-runtime-config").join("runtime-config.toml");
            let url = serde_json::to_string(url).expect("a string");
            std::fs::write(
                &file,
                format!("[key_value_store.default]\ntype = \"redis\"\nurl = {url}\n"),
            )
            .expect("runtime-config file");
            cmd.arg("--runtime-config-file").arg(file);
        }
        cmd.current_dir(&data_dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: `spin up` and its `spin trigger` child
            // are signalled together.
            .process_group(0);
        if let Ok(level) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", level);
        }
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let spin_logs = SpinLogs::new(&data_dir);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{} up: {e}", spin.display()));
        let mut host = Host::spawned(child, port, data_dir, Some(spin_logs));
        host.wait_ready(Duration::from_secs(300));
        if opts.kv_url.is_some() {
            // Spin names the store it opened; a runtime-config file it did
            // not take would leave the hosts on separate SQLite files.
            assert!(
                host.wait_output(
                    "Storing default key-value data to Redis",
                    Duration::from_secs(10)
                ),
                "spin up did not use the Redis runtime config; output:\n{}",
                host.output()
            );
        }
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

    fn wait_ready(&mut self, limit: Duration) {
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
            // `spin up` that has exited (a bad manifest, a port taken) will
            // not answer: say so at once.
            if self.spin_logs.is_some() {
                if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                    std::thread::sleep(Duration::from_millis(200)); // the pumps catch up
                    panic!("spin up exited ({status}); output:\n{}", self.output());
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "host did not become ready within {limit:?}; output:\n{}",
            self.output()
        );
    }

    /// Everything the host printed so far (under Spin: Spin's own stdout
    /// and stderr, then what the component wrote to its log files).
    pub fn output(&self) -> String {
        let mut out = self.output.lock().map(|s| s.clone()).unwrap_or_default();
        if let Some(logs) = &self.spin_logs {
            out.push_str(&logs.read());
        }
        out
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
    /// Under Spin the signal goes to the process group (`spin up` and its
    /// `spin trigger` child) and the code is `spin up`'s.
    pub fn stop(mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if self.spin_logs.is_some() {
            return stop_group(&mut child);
        }
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

    /// SIGKILL, at once (under Spin: to the whole process group).
    pub fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.spin_logs.is_some() {
                kill_group(&mut child);
            } else {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// SIGTERM to the group led by `child`, a bounded wait for the leader's
/// exit, then SIGKILL to whatever of the group is left.
fn stop_group(child: &mut Child) -> Option<i32> {
    let pgid = child.id();
    signal_group(pgid, "TERM");
    let start = Instant::now();
    let mut code = None;
    let mut exited = false;
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(status)) = child.try_wait() {
            code = status.code();
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The trigger child may outlive the leader by a moment.
    while exited && start.elapsed() < Duration::from_secs(35) && signal_group(pgid, "0") {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !exited || signal_group(pgid, "0") {
        kill_group(child);
        return if exited { code } else { None };
    }
    code
}

/// SIGKILL to the group led by `child`; reaps the leader.
fn kill_group(child: &mut Child) {
    signal_group(child.id(), "KILL");
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_now();
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
