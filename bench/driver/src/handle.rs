//! One request's whole cost inside the host, without a network: a fresh
//! store, instantiation, the component's handler for one GET, the response
//! body read to its end, and the teardown, through `tfa_host::runtime` (the
//! server's engine configuration, linker and per-request store). One
//! request at a time on one thread, so the figure is the CPU time a request
//! costs the host minus HTTP parsing and the socket: what the component and
//! its host calls cost, free of the load generator's noise. Each request
//! carries the server's mark of a request that skips the queue check after
//! its response (`tfa_host::maintenance`), as all but one a second do there.
//!
//! `reuse` > 1 measures a design this host does not serve: one instance
//! answering that many requests in turn, as Spin 3.6 and 4.x do for WASIp3
//! components (`max_instance_reuse_count`, 128 by default) and never for
//! WASIp2 ones like ours. It shows what instantiation, teardown and a
//! fresh instance's cold memory cost per request.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use serde_json::json;
use tfa_host::runtime;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::WasiHttpView as _;

use tfa_core::crypto::totp;

use crate::twofa::code;
use crate::{now, percentile, unix_secs, PASSWORD};

/// Options of an in-process measurement.
pub struct Options<'a> {
    pub component: &'a Path,
    pub label: &'a str,
    pub path: &'a str,
    pub cache_dir: &'a Path,
    /// Register and log in a user first and send its access token.
    pub signed_in: bool,
    pub requests: usize,
    /// Requests each instance answers in turn (1: a fresh instance for
    /// every request, as the server and Spin run WASIp2 components). With
    /// several, their batches alternate and each gets its own figures.
    pub reuse: Vec<usize>,
    /// `POST /api/auth/login` as the signed-in user (an Argon2 verify)
    /// instead of `GET path`.
    pub login: bool,
    /// `POST /api/2fa/verify` instead of `GET path`: `verify_users` users
    /// with TOTP enabled are enrolled and logged in first (not timed, cheap
    /// Argon2 parameters), each request spends one of their temp tokens with
    /// a fresh code. The preparation does not depend on `requests`, so two
    /// processes that differ only in it differ by verifications alone.
    pub verify: bool,
    /// Users prepared for `verify` (at least the requests and the warm-up).
    pub verify_users: usize,
    /// The store (`--kv-engine`, as `KV_ENGINE`): SQLite by default.
    pub kv_engine: tfa_host::kv::KvEngine,
    /// Component instances in the engine's pool (the server's number when
    /// `None`): 2 lets the process run under valgrind (callgrind counts a
    /// request's instructions; `scripts/bench.sh`).
    pub pool_slots: Option<u32>,
    /// Have wasmtime write `/tmp/perf-PID.map`, which names the compiled
    /// wasm functions for `perf` and callgrind's addresses.
    pub perf_map: bool,
    /// Created once the preparation is done (engine, component, store,
    /// users), holding the process id; the requests start only after it is
    /// removed. Under
    /// `valgrind --tool=callgrind --instr-atstart=no`, `scripts/bench.sh`
    /// switches the counting on in between, so that the count is the
    /// requests' alone.
    pub ready_file: Option<&'a Path>,
}

/// How long [`Options::ready_file`] may wait to be removed.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Creates `file`, holding this process's id (under valgrind, the id of
/// the tool's process, which `callgrind_control` needs: `valgrind` itself
/// is a shell script here), and waits until someone removes it (bounded by
/// [`READY_WAIT`]). Asleep in the runtime meanwhile, so that the work the
/// preparation left after its responses runs before the count begins.
async fn handshake(file: &Path) -> anyhow::Result<()> {
    std::fs::write(file, format!("{}\n", std::process::id()))
        .with_context(|| format!("create {}", file.display()))?;
    let started = now();
    while file.exists() {
        if started.elapsed() > READY_WAIT {
            anyhow::bail!("{} was not removed within {READY_WAIT:?}", file.display());
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The signing secrets of the measured instance (fixed: nothing is signed
/// for anyone).
const SECRETS: [(&str, &str); 4] = [
    (
        "JWT_ACCESS_SECRET",
        "handle-bench-access-secret-0123456789abcdef",
    ),
    (
        "JWT_REFRESH_SECRET",
        "handle-bench-refresh-secret-0123456789abcdef",
    ),
    (
        "TEMP_TOKEN_SECRET",
        "handle-bench-temp-secret-0123456789abcdef",
    ),
    (
        "DEVICE_TOKEN_SECRET",
        "handle-bench-device-secret-0123456789abcdef",
    ),
];

/// What one request needs of the host.
struct Host<'a> {
    engine: &'a wasmtime::Engine,
    pre: &'a wasmtime_wasi_http::p2::bindings::ProxyPre<runtime::HostState>,
    shared: &'a Arc<runtime::Shared>,
}

impl Host<'_> {
    /// One request through a fresh instance, as the server runs it; the
    /// status and the whole body.
    async fn request(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, bytes::Bytes)> {
        let mut instance = self.instance().await?;
        let answer = instance.call(method, path, authorization, body).await?;
        drop(instance);
        Ok(answer)
    }

    /// A fresh store with the component instantiated in it.
    async fn instance(&self) -> anyhow::Result<Instance> {
        let mut store = runtime::new_store(self.engine, self.shared);
        let proxy = tokio::time::timeout(DEADLINE, self.pre.instantiate_async(&mut store))
            .await
            .map_err(|_| anyhow::anyhow!("deadline"))??;
        Ok(Instance { store, proxy })
    }
}

/// An instantiated component in its store.
struct Instance {
    store: wasmtime::Store<runtime::HostState>,
    proxy: wasmtime_wasi_http::p2::bindings::Proxy,
}

impl Instance {
    /// One request through this instance's `wasi:http/incoming-handler`;
    /// the status and the whole body.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, bytes::Bytes)> {
        let store = &mut self.store;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://127.0.0.1{path}"))
            .header("host", "127.0.0.1")
            // As the server marks every request but one a second
            // (`MAINTENANCE_INTERVAL_MS`): no queue check after the response.
            .header(tfa_host::maintenance::HEADER, tfa_host::maintenance::SKIP);
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let body = if body.is_empty() {
            http_body_util::Empty::new().boxed_unsync()
        } else {
            http_body_util::Full::new(bytes::Bytes::from(body.to_string())).boxed_unsync()
        };
        let req =
            req.body(body.map_err(|never| -> wasmtime_wasi_http::Error { match never {} }))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, req)?;
        let out = store.data_mut().http().new_response_outparam(tx)?;
        let handler = self.proxy.wasi_http_incoming_handler();
        // The body is read while the handler runs, as the server does: a
        // body larger than the stream's buffer (a QR code) holds the guest's
        // write until someone reads it.
        let handled = async {
            let r = tokio::time::timeout(DEADLINE, handler.call_handle(&mut *store, req, out))
                .await
                .map_err(|_| anyhow::anyhow!("deadline"))?;
            // As the server does at the response: the gate of memory-heavy
            // instances lets the next heavy store in.
            store.data().limiter.release().release();
            r.map_err(anyhow::Error::from)
        };
        let answered = async {
            let resp = rx.await?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .to_bytes();
            anyhow::Ok((status, body))
        };
        let (handled, answered) = tokio::join!(handled, answered);
        handled?;
        answered
    }
}

/// Requests in a batch: the unit of the best-batch figure and of the
/// alternation between reuse modes.
const BATCH: usize = 250;

/// Requests of each mode that warm the pool first and are not counted
/// (logins: 5).
pub const WARM: usize = 50;

/// How long one request may run.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn run(o: &Options<'_>) -> anyhow::Result<()> {
    let mut config = runtime::engine_config(o.pool_slots.unwrap_or(runtime::SERVER_POOL_SLOTS));
    if o.perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    // As the server does: the pool's linear memories in transparent huge
    // pages, so that a fresh instance's Argon2 memory is faulted in as the
    // server's is (2 MiB at a time), not 4 KiB at a time.
    let (engine, huge_pages) =
        tfa_host::hugepages::advised(|| Ok(wasmtime::Engine::new(&config)?))?;
    if let Err(why) = huge_pages {
        eprintln!("tfa-bench handle: linear memories: no huge pages ({why})");
    }
    // As the server loads it: compiled once into the cache directory, then
    // mapped from there (which also lets `perf` name the wasm functions).
    let component = runtime::load_component(&engine, o.component, o.cache_dir)
        .await
        .with_context(|| format!("load {}", o.component.display()))?;
    let linker = runtime::linker(&engine)?;
    let pre = runtime::pre_instantiate(&linker, &component)?;
    let dir = crate::startup::ScratchDir::new("handle");
    let env = |name: &str| match name {
        "RATE_LIMIT_ENABLED" => Some("false".to_string()),
        // A verification never hashes: its preparation's hashes are cheap.
        "ARGON2_MEMORY_KIB" if o.verify => Some("256".to_string()),
        "ARGON2_ITERATIONS" if o.verify => Some("1".to_string()),
        _ => SECRETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string()),
    };
    let (variables, _) = tfa_host::service_settings(&env);
    let shared = crate::startup::shared(dir.path(), o.kv_engine, variables)?;
    let host = Host {
        engine: &engine,
        pre: &pre,
        shared: &shared,
    };
    // Signed in: a user registered and logged in through the component
    // itself (not timed); its access token goes with every request.
    let token = if o.signed_in || o.login {
        let account = json!({"email": "handle@bench.test", "username": "handlebench",
                             "password": PASSWORD});
        host.request("POST", "/api/auth/register", None, &account.to_string())
            .await?;
        let login = json!({"emailOrUsername": "handlebench", "password": PASSWORD});
        let (status, body) = host
            .request("POST", "/api/auth/login", None, &login.to_string())
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let token = v["data"]["accessToken"]
            .as_str()
            .with_context(|| format!("login answered {status}: {v}"))?;
        Some(format!("Bearer {token}"))
    } else {
        None
    };
    let login = json!({"emailOrUsername": "handlebench", "password": PASSWORD}).to_string();
    let (method, path, body, auth) = if o.login {
        ("POST", "/api/auth/login", login.as_str(), None)
    } else if o.verify {
        ("POST", "/api/2fa/verify", "", None)
    } else {
        ("GET", o.path, "", token.as_deref())
    };
    // Every mode sends the warm-up and the requests, each with a user of its own.
    if o.verify && o.verify_users < (o.requests + WARM) * o.reuse.len() {
        anyhow::bail!(
            "--verify-users {} is fewer than the requests and the warm-up ({} per mode)",
            o.verify_users,
            o.requests + WARM
        );
    }
    let mut verifications = if o.verify {
        prepare_verifications(&host, o.verify_users).await?
    } else {
        Vec::new()
    };
    /// One way of running requests: its instance and timings.
    struct Mode {
        reuse: usize,
        served: usize,
        instance: Option<Instance>,
        took_us: Vec<f64>,
        status: u16,
    }
    let mut modes: Vec<Mode> = o
        .reuse
        .iter()
        .map(|&r| Mode {
            reuse: r.max(1),
            served: 0,
            instance: None,
            took_us: Vec::with_capacity(o.requests),
            status: 0,
        })
        .collect();
    // Batches of the modes alternate, so that drift in the machine's speed
    // falls on all of them alike. The first requests of each mode (50, or
    // 5 logins) warm the pooling allocator's slots and are not counted.
    // Each timing includes, when it falls to that request, making a new
    // instance and dropping the used one.
    let (warm, batch) = if o.login { (5, 5) } else { (WARM, BATCH) };
    if let Some(file) = o.ready_file {
        handshake(file).await?;
    }
    let mut done = 0;
    while done < o.requests + warm {
        let n = batch.min(o.requests + warm - done);
        for m in modes.iter_mut() {
            for i in done..done + n {
                let t = now();
                if m.served % m.reuse == 0 {
                    drop(m.instance.take());
                    m.instance = Some(host.instance().await?);
                }
                let inst = m.instance.as_mut().context("an instance")?;
                let prepared;
                let body = if o.verify {
                    prepared = verifications
                        .pop()
                        .context("--verify-users: too few users")?;
                    prepared.as_str()
                } else {
                    body
                };
                let (status, answer) = inst.call(method, path, auth, body).await?;
                if o.verify && status != 200 {
                    anyhow::bail!("2fa/verify {status}: {}", String::from_utf8_lossy(&answer));
                }
                m.status = status;
                m.served += 1;
                if m.reuse == 1 {
                    drop(m.instance.take());
                }
                if i >= warm {
                    m.took_us.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        done += n;
    }
    for m in &mut modes {
        drop(m.instance.take());
    }
    for m in modes {
        let mut took_us = m.took_us;
        // Other work on the machine inflates some stretches: the least
        // disturbed batch of 250 requests is the steadier figure.
        let mut batch_p50: Vec<f64> = took_us
            .chunks(BATCH)
            .map(|c| percentile(&mut c.to_vec(), 50.0))
            .collect();
        batch_p50.sort_by(f64::total_cmp);
        println!(
            "{}",
            json!({
                "bench": "handle", "component": o.label, "method": method, "path": path,
                "status": m.status, "signed_in": token.is_some(), "reuse": m.reuse,
                "requests": took_us.len(),
                "us_p50": percentile(&mut took_us, 50.0),
                "us_p50_best_batch": batch_p50.first().copied().unwrap_or(f64::NAN),
                "us_p90": percentile(&mut took_us, 90.0),
                "us_mean": took_us.iter().sum::<f64>() / took_us.len().max(1) as f64,
            })
        );
    }
    Ok(())
}

/// Enrols `users` users with TOTP (register, `totp/setup`, `verify-setup`)
/// and logs each in; returns one `/2fa/verify` body per user, with a code
/// of a step after the one spent at enrolment and not behind the clock.
async fn prepare_verifications(host: &Host<'_>, users: usize) -> anyhow::Result<Vec<String>> {
    let data = |status: u16, body: &[u8], what: &str| -> anyhow::Result<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        if !(200..300).contains(&status) {
            anyhow::bail!("{what}: {status} {v}");
        }
        Ok(v["data"].clone())
    };
    let mut out = Vec::with_capacity(users);
    for i in 0..users {
        let name = format!("verify{i}");
        let account = json!({"email": format!("{name}@bench.test"), "username": name,
                             "password": PASSWORD});
        let (s, b) = host
            .request("POST", "/api/auth/register", None, &account.to_string())
            .await?;
        let access = data(s, &b, "register")?["accessToken"]
            .as_str()
            .map(|t| format!("Bearer {t}"))
            .context("register: no accessToken")?;
        let (s, b) = host
            .request("POST", "/api/2fa/totp/setup", Some(&access), "{}")
            .await?;
        let b32 = data(s, &b, "totp/setup")?["secret"]
            .as_str()
            .context("totp/setup: no secret")?
            .to_string();
        let secret = totp::base32_decode(&b32).context("base32 secret")?;
        let step = unix_secs() / 30;
        let confirm = json!({"code": code(&secret, step)}).to_string();
        let (s, b) = host
            .request(
                "POST",
                "/api/2fa/totp/verify-setup",
                Some(&access),
                &confirm,
            )
            .await?;
        data(s, &b, "verify-setup")?;
        let login = json!({"emailOrUsername": name, "password": PASSWORD}).to_string();
        let (s, b) = host
            .request("POST", "/api/auth/login", None, &login)
            .await?;
        let temp = data(s, &b, "login")?["tempToken"]
            .as_str()
            .context("login: no tempToken")?
            .to_string();
        let step = (step + 1).max(unix_secs() / 30);
        out.push(json!({"tempToken": temp, "code": code(&secret, step)}).to_string());
    }
    Ok(out)
}
