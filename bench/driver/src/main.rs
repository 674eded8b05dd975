//! `tfa-bench`: the native half of the benchmarks that `scripts/bench.sh`
//! runs (see BENCHMARKS.md). Subcommands:
//!
//! * `wasm-core [--cache-dir D] <core_ops.wasm> [core-ops args…]`: the core
//!   operations as wasm under wasmtime (prints core-ops' JSON); with
//!   `--cache-dir`, compiled once into `D` and loaded from there after.
//! * `startup <component.wasm> [--label L] [--compile-runs N] [--instances M]`:
//!   compile time and per-request store + instantiation time in the host's
//!   own runtime configuration.
//! * `handle <component.wasm> [--label L] [--path P] [--signed-in | --login |
//!   --verify [--verify-users U]] [--requests N] [--reuse 1,R] [--cache-dir D]
//!   [--pool-slots N] [--perf-map] [--kv-engine sqlite|log] [--ready-file F]`: whole
//!   requests inside the host's runtime, one at a time, without a socket (one
//!   JSON line per reuse mode); `--verify` sends `POST /api/2fa/verify`s of U
//!   users prepared first (N + 50 by default); `--pool-slots 2` lets it run
//!   under valgrind, `--perf-map` names the compiled wasm functions, and
//!   `--ready-file` creates F (holding the process id) once everything before
//!   the requests is done and waits for it to be removed (up to 10 minutes) before sending them: the
//!   moment to switch callgrind's counting on.
//! * `kv-pause [--keys N] [--value-bytes B]`: the longest wait of the log
//!   store's calls while it compacts N keys (942,000 and 200 by default),
//!   beside the time to clone such a map (what the store paused for before).
//! * `user --port P`: registers one user (no 2FA); prints its e-mail,
//!   password and access token as JSON.
//! * `2fa --port P [--users N] [--conc 1,32] [--runs R] [--secs S]`: the
//!   2FA login under load (one JSON line per run and concurrency).
//! * `verify --port P[,P2…] [--users N] [--conc 1,32] [--runs R] [--secs S]
//!   [--floor-cmd CMD]`: `POST /2fa/verify` on its own, logins and codes
//!   prepared before each timed part (one JSON line per run, concurrency and
//!   host; several hosts are timed in turn); `--floor-cmd` times the floor
//!   before each run and concurrency (its JSON line goes into the records).
//! * `token --secret S`: an access token (mfa: true) valid for 15 minutes,
//!   for Envoy.
//! * `upstream --port P [--threads N] [--max-secs S]`: the app behind Envoy
//!   (one thread), and with `--threads` the host-floor row of the API
//!   benchmark: plain hyper answering a fixed 200.
//!
//! Everything talks to 127.0.0.1 only, and every loop is bounded in time.

mod client;
mod handle;
mod kvpause;
mod startup;
mod twofa;
mod upstream;
mod wasmcore;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::json;
use tfa_core::tokens::{Extra, TokenKeys, TokenKind};

/// The password of every benchmark user.
pub const PASSWORD: &str = "Str0ng!Passw0rd";

/// The monotonic clock, for timing.
#[allow(clippy::disallowed_methods)] // a benchmark driver times things; core never reads the clock
pub fn now() -> Instant {
    Instant::now()
}

/// Unix seconds (TOTP codes and tokens are for the host's real clock).
#[allow(clippy::disallowed_methods)] // computes TOTP codes as an authenticator app would
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Nearest-rank percentile `p` (0–100) of `v` (sorted in place); 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// `--name value` pairs after the positional arguments.
struct Args(Vec<String>);

impl Args {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
    /// A flag without a value.
    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T> {
        match self.get(name) {
            Some(v) => v
                .parse()
                .ok()
                .with_context(|| format!("{name}: not a number")),
            None => Ok(default),
        }
    }
    /// A comma-separated list of numbers (`1,32`), or `default`'s.
    fn nums(&self, name: &str, default: &str) -> anyhow::Result<Vec<usize>> {
        self.get(name)
            .unwrap_or(default)
            .split(',')
            .map(|v| v.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{name}: numbers"))
    }
    /// `--port N`: exactly one port.
    fn port(&self) -> anyhow::Result<u16> {
        match self.ports()?[..] {
            [port] => Ok(port),
            _ => bail!("--port: one port number"),
        }
    }
    /// `--port A,B,…`: one or more ports, comma-separated.
    fn ports(&self) -> anyhow::Result<Vec<u16>> {
        self.get("--port")
            .context("--port is required")?
            .split(',')
            .map(|p| p.trim().parse::<u16>())
            .collect::<Result<Vec<_>, _>>()
            .context("--port: port numbers, comma-separated")
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("tfa-bench: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = all.first().cloned() else {
        bail!(
            "usage: tfa-bench <wasm-core|startup|handle|kv-pause|user|2fa|verify|token|upstream> …"
        );
    };
    let rest = all[1..].to_vec();
    match cmd.as_str() {
        "wasm-core" => {
            // The host's options come before the module; everything after
            // it is the guest's.
            let usage = "wasm-core [--cache-dir D] <core_ops.wasm> [args…]";
            let (cache_dir, rest) = match rest.first().map(String::as_str) {
                Some("--cache-dir") => {
                    (Some(PathBuf::from(rest.get(1).context(usage)?)), &rest[2..])
                }
                _ => (None, &rest[..]),
            };
            let wasm = rest.first().context(usage)?;
            wasmcore::run(&PathBuf::from(wasm), cache_dir.as_deref(), &rest[1..])
        }
        "startup" => {
            let wasm = PathBuf::from(rest.first().context("startup <component.wasm>")?);
            let args = Args(rest[1..].to_vec());
            let label = args.get("--label").unwrap_or("component").to_string();
            let o = startup::Options {
                component: &wasm,
                label: &label,
                compile_runs: args.num("--compile-runs", 3)?,
                instances: args.num("--instances", 2000)?,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(startup::run(&o))
        }
        "handle" => {
            let wasm = PathBuf::from(rest.first().context("handle <component.wasm>")?);
            let args = Args(rest[1..].to_vec());
            let requests = args.num("--requests", 5000)?;
            let o = handle::Options {
                component: &wasm,
                label: args.get("--label").unwrap_or("component"),
                path: args.get("--path").unwrap_or("/api/health/live"),
                cache_dir: Path::new(args.get("--cache-dir").unwrap_or("target/bench/cache")),
                signed_in: args.has("--signed-in"),
                requests,
                reuse: args.nums("--reuse", "1")?,
                login: args.has("--login"),
                verify: args.has("--verify"),
                verify_users: args.num("--verify-users", requests + handle::WARM)?,
                kv_engine: tfa_host::kv::KvEngine::parse(args.get("--kv-engine"))
                    .map_err(anyhow::Error::msg)?,
                pool_slots: args.get("--pool-slots").map(str::parse).transpose()?,
                perf_map: args.has("--perf-map"),
                ready_file: args.get("--ready-file").map(Path::new),
            };
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(handle::run(&o))
        }
        "kv-pause" => {
            let args = Args(rest);
            kvpause::run(
                args.num("--keys", 942_000)?,
                args.num("--value-bytes", 200)?,
            )
        }
        "user" => {
            let args = Args(rest);
            let mut c = client::Conn::new(args.port()?);
            // Unique across calls within one second (bench.sh makes several).
            let name = format!("bplain{}p{}", unix_secs() % 1_000_000, std::process::id());
            let (email, access) = twofa::register(&mut c, &name)?;
            println!(
                "{}",
                json!({"email": email, "password": PASSWORD, "access": access})
            );
            Ok(())
        }
        "2fa" => {
            let args = Args(rest);
            let concurrency = args.nums("--conc", "1,32")?;
            let o = twofa::Options {
                users: args.num("--users", 200)?,
                concurrency,
                runs: args.num("--runs", 3)?,
                secs: args.num("--secs", 5.0)?,
            };
            twofa::run(&o, args.port()?)
        }
        "verify" => {
            let args = Args(rest);
            let concurrency = args.nums("--conc", "1,32")?;
            let o = twofa::Options {
                users: args.num("--users", 1000)?,
                concurrency,
                runs: args.num("--runs", 3)?,
                secs: args.num("--secs", 3.0)?,
            };
            // `--port A,B`: hosts timed in turn, run by run.
            twofa::run_verify(&o, &args.ports()?, args.get("--floor-cmd"))
        }
        "token" => {
            let args = Args(rest);
            let secret = args.get("--secret").context("--secret is required")?;
            let keys = TokenKeys::new(
                secret.as_bytes(),
                b"unused-refresh",
                b"unused-temp",
                b"unused-device",
                "two-factor-auth",
                "two-factor-auth-api",
            );
            let extra = Extra {
                sid: Some("bench-session".into()),
                jti: None,
                did: None,
                mfa: Some(true),
                amr: None,
            };
            println!(
                "{}",
                keys.issue(TokenKind::Access, "bench-user", extra, unix_secs())
            );
            Ok(())
        }
        "upstream" => {
            let args = Args(rest);
            let port = args.port()?;
            let max_secs = args.num("--max-secs", 3600)?;
            let threads: usize = args.num("--threads", 1)?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads.max(1))
                .enable_all()
                .build()?
                .block_on(upstream::run(port, max_secs))
        }
        other => bail!("unknown subcommand {other}"),
    }
}
