//! The 2FA login under load: many users with TOTP enabled; each flow is
//! `POST /auth/login` (password, answered with a temporary token) then
//! `POST /2fa/verify` with a fresh code of that user. A code is accepted
//! once per user and 30-second step (replay protection), with one step of
//! leeway either side, so users are taken round-robin and a user is only
//! reused once a new step is acceptable for it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use tfa_core::crypto::totp;

use crate::client::Conn;
use crate::{now, percentile, unix_secs, PASSWORD};

/// A user with TOTP enabled.
struct User {
    email: String,
    secret: Vec<u8>,
    /// The last step whose code was accepted for this user.
    last_step: u64,
}

/// Registers a user; returns (email, access token).
pub fn register(c: &mut Conn, name: &str) -> anyhow::Result<(String, String)> {
    let email = format!("{name}@example.com");
    let body = json!({"email": email, "username": name, "password": PASSWORD}).to_string();
    let r = c.call("POST", "/api/auth/register", Some(&body), None)?;
    if r.status != 201 {
        bail!(
            "register {name}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    let access = r.json()["data"]["accessToken"]
        .as_str()
        .context("no accessToken")?
        .to_string();
    Ok((email, access))
}

/// The authenticator's code of `secret` at `step` (SHA-1, six digits).
pub(crate) fn code(secret: &[u8], step: u64) -> String {
    totp::code_at_step(secret, step, totp::TotpAlgorithm::Sha1, totp::DIGITS)
}

/// The step the server records as spent when it accepts the code of
/// `step`: of the steps in its window whose code is that code, it records
/// the latest, so when the next step's code happens to be the same (one
/// chance in a million) that later step is spent too, and sending it next
/// would be refused as a replay. A window is at most `step + 2` ahead.
fn spent_by(secret: &[u8], step: u64) -> u64 {
    let sent = code(secret, step);
    (step + 1..=step + 2)
        .rev()
        .find(|&later| code(secret, later) == sent)
        .unwrap_or(step)
}

fn enrol(c: &mut Conn, name: &str) -> anyhow::Result<User> {
    let (email, access) = register(c, name)?;
    let r = c.call("POST", "/api/2fa/totp/setup", Some("{}"), Some(&access))?;
    let b32 = r.json()["data"]["secret"]
        .as_str()
        .with_context(|| format!("totp setup: {}", String::from_utf8_lossy(&r.body)))?
        .to_string();
    let secret = totp::base32_decode(&b32).context("base32 secret")?;
    let step = unix_secs() / 30;
    let body = json!({"code": code(&secret, step)}).to_string();
    let r = c.call(
        "POST",
        "/api/2fa/totp/verify-setup",
        Some(&body),
        Some(&access),
    )?;
    if r.status != 200 {
        bail!(
            "verify-setup: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    Ok(User {
        email,
        last_step: spent_by(&secret, step),
        secret,
    })
}

/// Options of a 2FA run.
pub struct Options {
    pub users: usize,
    pub concurrency: Vec<usize>,
    pub runs: usize,
    pub secs: f64,
}

/// Latencies of one flow, in microseconds.
struct Sample {
    login_us: f64,
    verify_us: f64,
    flow_us: f64,
}

/// Enrols the users (two threads), then for each run and each concurrency
/// drives the flow for `secs`; prints one JSON line per (run, concurrency).
pub fn run(o: &Options, port: u16) -> anyhow::Result<()> {
    let tag = unix_secs() % 1_000_000;
    let started = now();
    let queue: Arc<Mutex<VecDeque<User>>> = Arc::default();
    let enrolled = std::thread::scope(|s| -> anyhow::Result<usize> {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let queue = queue.clone();
                s.spawn(move || -> anyhow::Result<usize> {
                    let mut c = Conn::new(port);
                    let mut n = 0;
                    for i in (w..o.users).step_by(2) {
                        let u = enrol(&mut c, &format!("b2fa{tag}x{i}"))?;
                        queue
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push_back(u);
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        let mut total = 0;
        for w in workers {
            total += w
                .join()
                .map_err(|_| anyhow::anyhow!("enrol thread panicked"))??;
        }
        Ok(total)
    })?;
    eprintln!(
        "tfa-bench 2fa: enrolled {enrolled} users in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    for run in 0..o.runs {
        for &conc in &o.concurrency {
            let deadline = now() + Duration::from_secs_f64(o.secs);
            let t0 = now();
            let results = std::thread::scope(|s| {
                let workers: Vec<_> = (0..conc)
                    .map(|_| {
                        let queue = queue.clone();
                        s.spawn(move || worker(port, &queue, deadline))
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_default())
                    .collect::<Vec<_>>()
            });
            let elapsed = t0.elapsed().as_secs_f64();
            let mut samples = Vec::new();
            let (mut errors, mut starved_ms) = (0u64, 0u64);
            for r in results {
                samples.extend(r.samples);
                errors += r.errors;
                starved_ms += r.starved_ms;
            }
            let mut login: Vec<f64> = samples.iter().map(|s| s.login_us).collect();
            let mut verify: Vec<f64> = samples.iter().map(|s| s.verify_us).collect();
            let mut flow: Vec<f64> = samples.iter().map(|s| s.flow_us).collect();
            let stats = |v: &mut Vec<f64>| json!({"p50_us": percentile(v, 50.0), "p99_us": percentile(v, 99.0)});
            println!(
                "{}",
                json!({
                    "bench": "2fa_login", "run": run, "concurrency": conc,
                    "flows": samples.len(), "secs": elapsed,
                    "flows_per_s": samples.len() as f64 / elapsed,
                    "errors": errors, "starved_ms": starved_ms,
                    "login": stats(&mut login), "verify": stats(&mut verify),
                    "flow": stats(&mut flow),
                })
            );
        }
    }
    Ok(())
}

#[derive(Default)]
struct WorkerResult {
    samples: Vec<Sample>,
    errors: u64,
    starved_ms: u64,
}

/// The next user for whom a fresh code is acceptable now (the step after
/// its last one is at most one step ahead of the clock).
fn take(queue: &Mutex<VecDeque<User>>) -> Option<User> {
    let mut q = queue.lock().ok()?;
    let now_step = unix_secs() / 30;
    // The front is the user used longest ago.
    if q.front().is_none_or(|u| u.last_step > now_step) {
        return None;
    }
    q.pop_front()
}

/// The step whose code to send now: after the user's last one, and never
/// behind the clock (a login can take a second under load, so a code of the
/// previous step could expire before the server sees it).
fn fresh_step(user: &User) -> u64 {
    (user.last_step + 1).max(unix_secs() / 30)
}

fn worker(port: u16, queue: &Mutex<VecDeque<User>>, deadline: Instant) -> WorkerResult {
    let mut c = Conn::new(port);
    let mut r = WorkerResult::default();
    // Bounded: stops at the deadline whatever happens.
    while now() < deadline {
        let Some(mut user) = take(queue) else {
            std::thread::sleep(Duration::from_millis(20));
            r.starved_ms += 20;
            continue;
        };
        let login_body = json!({"emailOrUsername": user.email, "password": PASSWORD}).to_string();
        let t0 = now();
        let mut step = user.last_step + 1;
        let ok = (|| -> anyhow::Result<Sample> {
            let a = c.call("POST", "/api/auth/login", Some(&login_body), None)?;
            let t1 = now();
            let temp = a.json()["data"]["tempToken"]
                .as_str()
                .with_context(|| {
                    format!("login {}: {}", a.status, String::from_utf8_lossy(&a.body))
                })?
                .to_string();
            step = fresh_step(&user);
            let body = json!({"tempToken": temp, "code": code(&user.secret, step)}).to_string();
            let t2 = now();
            let v = c.call("POST", "/api/2fa/verify", Some(&body), None)?;
            let t3 = now();
            if v.status != 200 {
                bail!(
                    "2fa/verify {}: {}",
                    v.status,
                    String::from_utf8_lossy(&v.body)
                );
            }
            Ok(Sample {
                login_us: (t1 - t0).as_secs_f64() * 1e6,
                verify_us: (t3 - t2).as_secs_f64() * 1e6,
                flow_us: (t3 - t0).as_secs_f64() * 1e6 - (t2 - t1).as_secs_f64() * 1e6,
            })
        })();
        // Spent, or (after an error) maybe spent: never tried again.
        user.last_step = spent_by(&user.secret, step);
        match ok {
            Ok(s) => r.samples.push(s),
            Err(e) => {
                if r.errors < 3 {
                    eprintln!("tfa-bench 2fa: {e:#}");
                }
                r.errors += 1;
            }
        }
        if let Ok(mut q) = queue.lock() {
            q.push_back(user);
        }
    }
    r
}

/// A login answered with a temporary token, and the code to send with it.
struct Prepared {
    body: String,
}

/// Logs in every user whose next step is acceptable now and builds its
/// `/2fa/verify` body (two threads); the users go back to the queue with
/// that step spent.
///
/// At most `o.users` are prepared, each for a different user: a user taken
/// twice would hold codes of two steps, and the timed part sends the later
/// one first (it pops from the end), after which the server refuses the
/// earlier one as a replay.
fn prepare(o: &Options, port: u16, queue: &Mutex<VecDeque<User>>) -> anyhow::Result<Vec<Prepared>> {
    let out: Mutex<Vec<Prepared>> = Mutex::default();
    // Slots handed out: checked before taking a user, so the two threads
    // together never prepare more than `o.users`.
    let slots = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (out, slots) = (&out, &slots);
                s.spawn(move || -> anyhow::Result<()> {
                    let mut c = Conn::new(port);
                    while slots.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < o.users {
                        let Some(mut user) = take(queue) else {
                            break;
                        };
                        let login = json!({"emailOrUsername": user.email, "password": PASSWORD})
                            .to_string();
                        let a = c.call("POST", "/api/auth/login", Some(&login), None)?;
                        let temp = a.json()["data"]["tempToken"]
                            .as_str()
                            .with_context(|| format!("login {}", a.status))?
                            .to_string();
                        let step = fresh_step(&user);
                        user.last_step = spent_by(&user.secret, step);
                        let body = json!({"tempToken": temp, "code": code(&user.secret, step)})
                            .to_string();
                        out.lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push(Prepared { body });
                        // Spent for now: back of the queue, behind `take`'s check.
                        queue
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push_back(user);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("prepare thread panicked"))??;
        }
        Ok(())
    })?;
    out.into_inner().map_err(|_| anyhow::anyhow!("poisoned"))
}

/// `POST /2fa/verify` on its own: before each timed part, every user is
/// logged in and its code computed (not timed); the timed part sends the
/// prepared requests until the deadline or until they run out. Prints one
/// JSON line per (run, concurrency, host). With more than one host (a store
/// on tmpfs and one on disk, say), each run and concurrency is timed on every
/// host in turn, so that a ratio between hosts compares runs minutes apart
/// at most, not a whole series made before the other.
///
/// With `floor_cmd`, each run and concurrency first runs that shell command
/// (`sh -c`, with `CONC` set to the concurrency; bench.sh gives it wrk on the
/// floor component), and the last line of its output that is a JSON object
/// goes into every line of that run and concurrency as `floor`: a ratio over
/// the floor is then one of requests timed seconds apart.
pub fn run_verify(o: &Options, ports: &[u16], floor_cmd: Option<&str>) -> anyhow::Result<()> {
    let queues = ports
        .iter()
        .map(|&port| enrol_all(o, port))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for run in 0..o.runs {
        for &conc in &o.concurrency {
            let floor = match floor_cmd {
                Some(cmd) => floor_run(cmd, conc)?,
                None => Value::Null,
            };
            for (&port, queue) in ports.iter().zip(&queues) {
                time_verify(o, port, queue, run, conc, &floor)?;
            }
        }
    }
    Ok(())
}

/// Runs `cmd` under `sh -c` with `CONC=conc` and returns the last line of
/// its standard output that parses as a JSON object.
fn floor_run(cmd: &str, conc: usize) -> anyhow::Result<Value> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("CONC", conc.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("--floor-cmd {cmd}"))?;
    anyhow::ensure!(out.status.success(), "--floor-cmd {cmd}: {}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(Value::is_object)
        })
        .with_context(|| format!("--floor-cmd {cmd} printed no JSON object"))
}

/// Registers `o.users` users with TOTP on the host at `port`.
fn enrol_all(o: &Options, port: u16) -> anyhow::Result<Mutex<VecDeque<User>>> {
    let tag = unix_secs() % 1_000_000;
    let queue: Mutex<VecDeque<User>> = Mutex::default();
    let started = now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let queue = &queue;
                s.spawn(move || -> anyhow::Result<()> {
                    let mut c = Conn::new(port);
                    for i in (w..o.users).step_by(2) {
                        let u = enrol(&mut c, &format!("bver{tag}x{i}"))?;
                        queue
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push_back(u);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("enrol thread panicked"))??;
        }
        Ok(())
    })?;
    eprintln!(
        "tfa-bench verify: enrolled {} users on port {port} in {:.1} s",
        o.users,
        started.elapsed().as_secs_f64()
    );
    Ok(queue)
}

/// One timed part: prepares the users of `queue`, then sends their
/// verifications to `port` from `conc` connections for `o.secs`.
fn time_verify(
    o: &Options,
    port: u16,
    queue: &Mutex<VecDeque<User>>,
    run: usize,
    conc: usize,
    floor: &Value,
) -> anyhow::Result<()> {
    // Bounded wait for the users' next step to become acceptable.
    let wait_until = now() + Duration::from_secs(40);
    let prepared = loop {
        let p = prepare(o, port, queue)?;
        if p.len() * 2 >= o.users || now() > wait_until {
            break p;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let total = prepared.len();
    // A marker for a profiler attached from outside (see BENCHMARKS.md).
    eprintln!("tfa-bench verify: timed part, run {run}, concurrency {conc}, port {port}");
    let pool = Mutex::new(prepared);
    let deadline = now() + Duration::from_secs_f64(o.secs);
    let t0 = now();
    let results: Vec<(Vec<f64>, u64, Instant)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..conc)
            .map(|_| {
                let pool = &pool;
                s.spawn(move || {
                    let mut c = Conn::new(port);
                    let (mut lat, mut errors) = (Vec::new(), 0u64);
                    while now() < deadline {
                        let Some(p) = pool.lock().ok().and_then(|mut v| v.pop()) else {
                            break;
                        };
                        let t = now();
                        match c.call("POST", "/api/2fa/verify", Some(&p.body), None) {
                            Ok(r) if r.status == 200 => lat.push(t.elapsed().as_secs_f64() * 1e6),
                            Ok(r) => {
                                if errors < 3 {
                                    eprintln!(
                                        "tfa-bench verify: {} {}",
                                        r.status,
                                        String::from_utf8_lossy(&r.body)
                                    );
                                }
                                errors += 1;
                            }
                            Err(e) => {
                                if errors < 3 {
                                    eprintln!("tfa-bench verify: {e:#}");
                                }
                                errors += 1;
                            }
                        }
                    }
                    (lat, errors, now())
                })
            })
            .collect();
        workers.into_iter().filter_map(|w| w.join().ok()).collect()
    });
    // Until the last worker stopped (the deadline, or no requests left).
    let ended = results.iter().map(|r| r.2).max().unwrap_or_else(now);
    let elapsed = (ended - t0).as_secs_f64();
    let mut lat: Vec<f64> = results.iter().flat_map(|r| r.0.clone()).collect();
    let errors: u64 = results.iter().map(|r| r.1).sum();
    println!(
        "{}",
        json!({
            "bench": "2fa_verify", "run": run, "concurrency": conc, "port": port,
            "prepared": total, "requests": lat.len(), "secs": elapsed,
            "requests_per_s": lat.len() as f64 / elapsed,
            "errors": errors,
            "p50_us": percentile(&mut lat, 50.0),
            "p99_us": percentile(&mut lat, 99.0),
            "floor": floor,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by search: this secret's codes of steps 59,109,884 and
    /// 59,109,885 are both 467203.
    const SECRET: &[u8] = b"bench-collision-secret-20bytes!!";

    #[test]
    fn a_code_shared_with_the_next_step_spends_that_step_too() {
        assert_eq!(code(SECRET, 59_109_884), code(SECRET, 59_109_885));
        assert_eq!(spent_by(SECRET, 59_109_884), 59_109_885);
        // The step before shares nothing ahead of it within the window.
        assert_eq!(spent_by(SECRET, 59_109_883), 59_109_883);
        assert_eq!(spent_by(SECRET, 59_109_885), 59_109_885);
    }
}
