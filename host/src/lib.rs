//! `tfa-host`: a local host for the two-factor-auth Spin application.
//!
//! It serves the same `.wasm` files that Spin runs: the API component
//! (`spin_app.wasm`, `COMPONENT_PATH`) on 127.0.0.1, and the mailer
//! component (`tfa_mailer.wasm`, `MAILER_PATH`, default: beside the API
//! component) which only the API reaches, at
//! `http://tfa-mailer.spin.internal` (Spin's local service chaining; see
//! [`runtime::Chained`]). Each component gets what its part of `spin.toml`
//! grants ([`runtime::Grants`]): the API the key-value store and outbound
//! HTTP, the mailer outbound TCP to the SMTP server. Between them they use:
//!
//! * the WASI 0.2 base (`wasmtime-wasi`: cli, clocks, random, io; files
//!   denied, TCP sockets for the mailer only),
//! * `wasi:http` incoming handler and outgoing handler (`wasmtime-wasi-http`),
//!   outgoing restricted to the allowed hosts ([`outbound`]),
//! * `fermyon:spin/key-value@2.0.0` and `wasi:keyvalue/{store,atomics,batch}
//!   @0.2.0-draft2` over one backend ([`kv`]: SQLite by default, Redis with
//!   `KV_URL`),
//! * `fermyon:spin/variables@2.0.0` and `wasi:config/store` (the same
//!   variables, all at once with `get-all`): the specification's settings
//!   that this process's environment sets ([`service_settings`]). A
//!   component's WASI environment variables are its `environment` in the
//!   manifest, as under `spin up` ([`manifest::Manifest::environment`]); the
//!   component reads a setting there when its variable is unset.
//!
//! Settings of the host itself: `PORT` (default 3001; 0 picks a free port),
//! `DATA_DIR` (default `./.data`), `CACHE_DIR` (compiled component, default
//! `DATA_DIR/cache`), `KV_URL` (`redis://…` or `rediss://user:pass@host:port/db`
//! over TLS, checked against the system's roots and the PEM CA certificates
//! of `KV_CA_FILE`), `KV_ENGINE` (`sqlite`, the default, or `log`: the
//! store in memory with an append-only log, [`logkv`]), `KV_EMULATE`
//! (`spin-4.0.2`, the default:
//! the stores behave exactly like Spin 4.0.2's, limits included; `none`:
//! this host's own, more capable semantics; see [`kv`]), `COMPONENT_PATH`
//! (default `target/wasm32-wasip2/release/spin_app.wasm`), `MAILER_PATH`
//! (default `tfa_mailer.wasm` in `COMPONENT_PATH`'s folder; when it is
//! missing the host serves the API alone and logs that e-mail cannot be
//! sent), `SPIN_MANIFEST` (default `./spin.toml` when present: each
//! component's `allowed_outbound_hosts` and `environment`) and `ALLOWED_OUTBOUND_HOSTS` (its
//! `tcp://` entries for the mailer, the others for the API; the Twilio API
//! base and the SMTP server named by the service's settings are allowed
//! without it). Test hook:
//! `TFA_FAIL_STORE_AFTER=N` makes every store operation from the N-th on fail
//! (`TFA_FAIL_STORE_COUNT=K` limits that to K operations);
//! `TFA_CLOCK_OFFSET_MS=N` shows the component a wall clock N ms ahead (to
//! reach the webhook retry schedule without waiting for it).
//!
//! Limits: `REQUEST_TIMEOUT_MS` (default 60000) is the longest an
//! instance runs, after-response work included; at the deadline it is
//! stopped, its slot freed, the client answered 503 if it had no answer
//! yet, and a line `request deadline exceeded` goes to stderr.
//! `HEADER_READ_TIMEOUT_MS` (default 10000): a connection that has not sent
//! a whole request head within it is closed (line `no complete request
//! head`). `IDLE_TIMEOUT_MS` (default 5000): a keep-alive connection idle
//! that long between requests is closed. `MAX_CONNECTIONS` (default 1024):
//! at that many open connections the host stops accepting (line
//! `connections open: not accepting more`) until one closes.
//! `MAX_HEAVY_INSTANCES` (default two per core): instances past 4 MiB of
//! linear memory at once ([`gate`]).
//!
//! Queue checks: `MAINTENANCE_INTERVAL_MS` (default 1000; 0: every
//! request, as on Spin): one request per interval reads whether a webhook
//! retry or an expiry sweep is due; the others are marked to skip that read
//! ([`maintenance`]).
//!
//! Logs: `LOG_LEVEL` (`error`, `warn`, `info` — the default —, `debug`)
//! filters the host's lines; `LOG_FORMAT` (`text`, the default, or `json`)
//! shapes the request line ([`accesslog`]). Metrics: `METRICS_ADDR`
//! (`127.0.0.1:9464`; off when unset) serves the Prometheus text format at
//! `/metrics` ([`metrics`]).
//!
//! It always listens on 127.0.0.1.

#![deny(missing_docs)]

pub mod accesslog;
pub mod conn;
pub mod gate;
pub mod hugepages;
pub mod kv;
pub mod layered;
pub mod log;
pub mod logkv;
pub mod maintenance;
pub mod manifest;
pub mod metrics;
pub mod netguard;
pub mod outbound;
pub mod readcache;
pub mod runtime;
pub mod send;
pub mod server;
pub mod walsync;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use tfa_core::contract::config::SETTING_NAMES;

/// The current instant (the host measures durations; core never reads it).
#[allow(clippy::disallowed_methods)] // the host reads the clock for logs and progress
pub fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// The host's settings.
#[derive(Debug, Clone)]
pub struct HostSettings {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Where the SQLite file lives.
    pub data_dir: PathBuf,
    /// Where the compiled component is cached (`CACHE_DIR`, default
    /// `DATA_DIR/cache`).
    pub cache_dir: PathBuf,
    /// `redis://…` (or `rediss://…`, TLS) to use Redis instead of SQLite.
    pub kv_url: Option<String>,
    /// PEM CA certificates trusted for `rediss://` besides the system's
    /// roots (`KV_CA_FILE`).
    pub kv_ca_file: Option<PathBuf>,
    /// Whose key-value semantics the stores follow (`KV_EMULATE`).
    pub kv_emulate: kv::KvEmulation,
    /// The store in `DATA_DIR` without `KV_URL` (`KV_ENGINE`).
    pub kv_engine: kv::KvEngine,
    /// The API component.
    pub component_path: PathBuf,
    /// The mailer component (`MAILER_PATH`).
    pub mailer_path: PathBuf,
    /// The Spin manifest to read `allowed_outbound_hosts` from.
    pub manifest: Option<PathBuf>,
    /// Extra allowed outbound hosts (comma-separated patterns).
    pub allowed_outbound_hosts: Option<String>,
    /// Fault injection: fail store operations from this one on.
    pub fail_store_after: Option<u64>,
    /// Fault injection: how many operations fail.
    pub fail_store_count: Option<u64>,
    /// Test hook: the component's wall clock runs this many ms ahead.
    pub clock_offset_ms: u64,
    /// Diagnostic (`KV_COUNT=true`): log each request's key-value operations.
    pub kv_count: bool,
    /// Diagnostic (`WASM_PERF_MAP=true`): wasmtime writes `/tmp/perf-PID.map`,
    /// which names the compiled wasm functions in `perf` profiles.
    pub perf_map: bool,
    /// Limits of the server (deadline, connections).
    pub limits: server::Limits,
    /// Which of the host's lines are written (`LOG_LEVEL`).
    pub log_level: log::Level,
    /// How request lines are written (`LOG_FORMAT`).
    pub log_format: accesslog::Format,
    /// Where metrics are served (`METRICS_ADDR`; off when unset).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Default of `REQUEST_TIMEOUT_MS`: longer than the component's slowest
/// legitimate work (an SMTP delivery may take 30 s, then after-response
/// webhook calls).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// Default of `HEADER_READ_TIMEOUT_MS`.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default of `IDLE_TIMEOUT_MS` (a connection idle between requests is
/// also closed at the header-read timeout, whichever comes first).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Default of `MAX_CONNECTIONS`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

impl HostSettings {
    /// Reads the settings through `env`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<HostSettings> {
        let get = |n: &str| {
            env(n)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let num = |n: &str| -> anyhow::Result<Option<u64>> {
            get(n)
                .map(|v| {
                    v.parse::<u64>()
                        .with_context(|| format!("{n} must be a whole number"))
                })
                .transpose()
        };
        let flag = |n: &str| -> anyhow::Result<bool> {
            match get(n).as_deref() {
                None | Some("false") => Ok(false),
                Some("true") => Ok(true),
                Some(other) => anyhow::bail!("{n} must be true or false, not {other:?}"),
            }
        };
        let data_dir = PathBuf::from(get("DATA_DIR").unwrap_or_else(|| "./.data".into()));
        let component_path = PathBuf::from(
            get("COMPONENT_PATH")
                .unwrap_or_else(|| "target/wasm32-wasip2/release/spin_app.wasm".into()),
        );
        let manifest = match get("SPIN_MANIFEST") {
            Some(p) => Some(PathBuf::from(p)),
            None => Some(PathBuf::from("spin.toml")).filter(|p| p.exists()),
        };
        let positive = |n: &str, default: u64| -> anyhow::Result<u64> {
            match num(n)? {
                Some(0) => anyhow::bail!("{n} must be at least 1"),
                Some(v) => Ok(v),
                None => Ok(default),
            }
        };
        let limits = server::Limits {
            request_timeout: std::time::Duration::from_millis(positive(
                "REQUEST_TIMEOUT_MS",
                DEFAULT_REQUEST_TIMEOUT_MS,
            )?),
            header_read_timeout: std::time::Duration::from_millis(positive(
                "HEADER_READ_TIMEOUT_MS",
                DEFAULT_HEADER_READ_TIMEOUT_MS,
            )?),
            idle_timeout: std::time::Duration::from_millis(positive(
                "IDLE_TIMEOUT_MS",
                DEFAULT_IDLE_TIMEOUT_MS,
            )?),
            max_connections: usize::try_from(positive(
                "MAX_CONNECTIONS",
                DEFAULT_MAX_CONNECTIONS as u64,
            )?)
            .context("MAX_CONNECTIONS is too large")?,
            heavy_instances: match num("MAX_HEAVY_INSTANCES")? {
                Some(0) => anyhow::bail!("MAX_HEAVY_INSTANCES must be at least 1"),
                Some(v) => usize::try_from(v)
                    .ok()
                    .filter(|&v| v <= runtime::MAX_INSTANCES as usize)
                    .with_context(|| {
                        format!(
                            "MAX_HEAVY_INSTANCES must be at most {} (the instance slots)",
                            runtime::MAX_INSTANCES
                        )
                    })?,
                None => gate::default_heavy_instances(),
            },
            maintenance_interval: std::time::Duration::from_millis(
                num("MAINTENANCE_INTERVAL_MS")?.unwrap_or(maintenance::DEFAULT_INTERVAL_MS),
            ),
        };
        Ok(HostSettings {
            limits,
            log_level: log::Level::parse(get("LOG_LEVEL").as_deref())
                .map_err(anyhow::Error::msg)?,
            log_format: accesslog::Format::parse(get("LOG_FORMAT").as_deref())
                .map_err(anyhow::Error::msg)?,
            metrics_addr: get("METRICS_ADDR")
                .map(|v| metrics::parse_addr(&v))
                .transpose()
                .map_err(anyhow::Error::msg)?,
            port: get("PORT")
                .map(|p| p.parse::<u16>().context("PORT must be a port number"))
                .transpose()?
                .unwrap_or(3001),
            data_dir: data_dir.clone(),
            cache_dir: get("CACHE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| data_dir.join("cache")),
            kv_url: get("KV_URL"),
            kv_ca_file: get("KV_CA_FILE").map(PathBuf::from),
            kv_emulate: kv::KvEmulation::parse(get("KV_EMULATE").as_deref())
                .map_err(anyhow::Error::msg)?,
            kv_engine: kv::KvEngine::parse(get("KV_ENGINE").as_deref())
                .map_err(anyhow::Error::msg)?,
            component_path: component_path.clone(),
            mailer_path: get("MAILER_PATH").map(PathBuf::from).unwrap_or_else(|| {
                component_path
                    .parent()
                    .unwrap_or(std::path::Path::new("."))
                    .join("tfa_mailer.wasm")
            }),
            manifest,
            allowed_outbound_hosts: get("ALLOWED_OUTBOUND_HOSTS"),
            fail_store_after: num("TFA_FAIL_STORE_AFTER")?,
            fail_store_count: num("TFA_FAIL_STORE_COUNT")?,
            clock_offset_ms: num("TFA_CLOCK_OFFSET_MS")?.unwrap_or(0),
            kv_count: flag("KV_COUNT")?,
            perf_map: flag("WASM_PERF_MAP")?,
        })
    }
}

/// The specification's settings that `env` sets (blank counts as unset):
/// (the component's Spin variables, by lower-case name; the same settings
/// by their upper-case names, as `Config::from_map` reads them).
///
/// Only set settings become variables: a component reads an unset one as
/// undefined, which it treats as it treats an empty value (Spin's manifest
/// declares each with default ""). So `wasi:config/store.get-all` hands the
/// component the few settings that are set, not some 35 empty strings,
/// each of which costs a call into the guest's allocator to copy (about
/// 9 µs of a 45 µs request, `tfa-bench handle`; docs/decisions.md,
/// "Settings in one host call"). They are not also passed as WASI
/// environment variables (`spin up` passes only the manifest's
/// `environment`, and so does this host): the component would read the
/// same values a second time.
pub fn service_settings(
    env: &dyn Fn(&str) -> Option<String>,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let mut vars = BTreeMap::new();
    let mut pairs = Vec::new();
    for name in SETTING_NAMES {
        if let Some(v) = env(name).filter(|v| !v.trim().is_empty()) {
            vars.insert(name.to_ascii_lowercase(), v.clone());
            pairs.push((name.to_string(), v));
        }
    }
    (vars, pairs)
}

/// The API component's id in `spin.toml`.
pub const API_COMPONENT: &str = "two-factor-auth";
/// The mailer component's id in `spin.toml` (its host name for local
/// service chaining is `tfa-mailer.spin.internal`).
pub const MAILER_COMPONENT: &str = "tfa-mailer";

/// The allow-lists of the API and the mailer component: each one's
/// `allowed_outbound_hosts` from the manifest (without one: the Twilio API
/// and the mailer for the API, nothing for the mailer), then
/// `ALLOWED_OUTBOUND_HOSTS` (`tcp://` entries to the mailer, the others to
/// the API) and the gateways the service's settings name (the Twilio API
/// base to the API, the SMTP server to the mailer). Both are logged.
fn allow_lists(
    settings: &HostSettings,
    manifest: Option<&manifest::Manifest>,
    core_config: Option<&tfa_core::Config>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(outbound::AllowList, outbound::AllowList)> {
    let mut warnings = Vec::new();
    let (mut api, mut mailer) = match manifest {
        Some(m) => (
            outbound::from_manifest(m, API_COMPONENT, env, &mut warnings)
                .map_err(anyhow::Error::msg)?,
            outbound::from_manifest(m, MAILER_COMPONENT, env, &mut warnings)
                .map_err(anyhow::Error::msg)?,
        ),
        None => (
            ["https://api.twilio.com", tfa_smtp::relay::MAILER_ORIGIN]
                .iter()
                .map(|p| outbound::HostPattern::parse(p))
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::msg)?,
            Vec::new(),
        ),
    };
    let mut add = |p: outbound::HostPattern| {
        if p.for_http() && !api.contains(&p) {
            api.push(p.clone());
        }
        if p.for_tcp() && !mailer.contains(&p) {
            mailer.push(p);
        }
    };
    if let Some(list) = &settings.allowed_outbound_hosts {
        outbound::from_list(list, &mut warnings)
            .into_iter()
            .for_each(&mut add);
    }
    // The gateways the settings name (Twilio base, SMTP server) are allowed
    // without repeating them in ALLOWED_OUTBOUND_HOSTS.
    if let Some(c) = core_config {
        let resolve = |host: &str, port: u16| -> Vec<std::net::IpAddr> {
            use std::net::ToSocketAddrs as _;
            (host, port)
                .to_socket_addrs()
                .map(|a| a.map(|a| a.ip()).collect())
                .unwrap_or_default()
        };
        outbound::gateway_patterns(
            c.twilio.as_ref().map(|t| t.api_base.as_str()),
            c.email.as_ref().map(|e| (e.host.as_str(), e.port)),
            &resolve,
            &mut warnings,
        )
        .into_iter()
        .for_each(&mut add);
    }
    for w in &warnings {
        eprintln!("tfa-host: warning: {w}");
    }
    let shown = |list: &[outbound::HostPattern]| {
        list.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "tfa-host: effective allowed outbound hosts (spin.toml, ALLOWED_OUTBOUND_HOSTS, \
         TWILIO_API_BASE, EMAIL_HOST:EMAIL_PORT): {API_COMPONENT}: {}; {MAILER_COMPONENT}: {}",
        shown(&api),
        shown(&mailer)
    );
    Ok((
        outbound::AllowList::new(api),
        outbound::AllowList::new(mailer),
    ))
}

/// Builds everything and serves until SIGINT/SIGTERM.
pub async fn run(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    let settings = HostSettings::from_env(env)?;
    log::set_level(settings.log_level);

    let manifest = settings
        .manifest
        .as_deref()
        .map(manifest::Manifest::read)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    // Each component's `environment` in spin.toml: its WASI environment,
    // as under `spin up` (names logged, values may be secrets).
    let (api_env, mailer_env) = match &manifest {
        Some(m) => (
            m.environment(API_COMPONENT).map_err(anyhow::Error::msg)?,
            m.environment(MAILER_COMPONENT)
                .map_err(anyhow::Error::msg)?,
        ),
        None => (Vec::new(), Vec::new()),
    };
    for (id, vars) in [(API_COMPONENT, &api_env), (MAILER_COMPONENT, &mailer_env)] {
        if !vars.is_empty() {
            let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
            eprintln!(
                "tfa-host: environment of {id} from the manifest: {}",
                names.join(", ")
            );
        }
    }

    // The service's own settings: checked here once so problems show at
    // start; the component re-reads them per request (and answers 503 if
    // they are unusable). It reads a setting from its environment when its
    // variable is unset, and so does this check.
    let (variables, set) = service_settings(env);
    let mut core_map: BTreeMap<String, String> = set.into_iter().collect();
    for (name, value) in &api_env {
        if SETTING_NAMES.contains(&name.as_str()) && !value.trim().is_empty() {
            core_map
                .entry(name.clone())
                .or_insert_with(|| value.clone());
        }
    }
    let core_config = match tfa_core::Config::from_map(&core_map) {
        Ok(c) => {
            for w in &c.warnings {
                eprintln!("tfa-host: warning: {w}");
            }
            Some(c)
        }
        Err(e) => {
            eprintln!("tfa-host: {e}; every request will be answered 503 until it is fixed");
            None
        }
    };

    // Allowed outbound hosts, per component.
    let (api_allow, mailer_allow) =
        allow_lists(&settings, manifest.as_ref(), core_config.as_ref(), env)?;

    // Connect-time SSRF check (host/src/netguard.rs).
    let hooks = netguard::TestHooks::from_env(env).map_err(anyhow::Error::msg)?;
    if hooks.enabled() {
        eprintln!(
            "tfa-host: WARNING: TEST HOOKS ON (TFA_TEST_RESOLVE / TFA_TEST_PUBLIC_ADDRS / \
             TFA_TEST_CA_FILE): \
             name resolution is overridden; never use this in production"
        );
    }
    let guard = netguard::NetGuard {
        allow_private: core_config
            .as_ref()
            .is_some_and(|c| c.webhook_allow_private),
        hooks,
    };
    eprintln!(
        "tfa-host: connect-time block of private/special networks: {}",
        if guard.allow_private {
            "off (WEBHOOK_ALLOW_PRIVATE=true)"
        } else {
            "on (destinations named without wildcards are exempt)"
        }
    );

    // Store.
    let mut backend = kv::open_store(
        settings.kv_url.as_deref(),
        &settings.data_dir,
        settings.kv_engine,
        settings.kv_emulate,
        settings.kv_ca_file.as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the key-value store: {e}"))?;
    if let Some(after) = settings.fail_store_after {
        backend = Arc::new(kv::FailingKv::new(
            backend,
            after,
            settings.fail_store_count,
        ));
    }
    eprintln!(
        "tfa-host: key-value store: {} (KV_EMULATE={})",
        backend.describe(),
        settings.kv_emulate
    );

    // Component.
    // Argon2's memory in 2 MiB pages (host/src/hugepages.rs).
    let (engine, huge_pages) = hugepages::advised(|| runtime::engine(settings.perf_map))?;
    match huge_pages {
        Ok(bytes) => log::info(&format!(
            "linear memories: transparent huge pages advised ({} GiB reserved)",
            bytes >> 30
        )),
        Err(why) => log::info(&format!("linear memories: no huge pages ({why})")),
    }
    runtime::start_epoch_ticker(&engine)?;
    let component =
        runtime::load_component(&engine, &settings.component_path, &settings.cache_dir).await?;
    let linker = runtime::linker(&engine)?;
    let pre = runtime::pre_instantiate(&linker, &component)?;
    let guard = Arc::new(guard);
    let clock_offset = std::time::Duration::from_millis(settings.clock_offset_ms);

    // The mailer: the API's e-mail, by local service chaining. It has no
    // variables and no store (spin.toml grants it none).
    let chain = if settings.mailer_path.exists() {
        let mailer =
            runtime::load_component(&engine, &settings.mailer_path, &settings.cache_dir).await?;
        let shared = Arc::new(runtime::Shared {
            kv: backend.clone(),
            variables: BTreeMap::new(),
            environment: mailer_env,
            allow: Arc::new(mailer_allow),
            guard: guard.clone(),
            clock_offset,
            kv_count: false,
            grants: runtime::Grants::MAILER,
            chain: None,
            // Its own gate: an API instance holding one of the API's
            // permits never waits for a permit the mailer needs.
            gate: gate::Gate::new(settings.limits.heavy_instances),
        });
        let pre = runtime::pre_instantiate(&linker, &mailer)?;
        Some(Arc::new(runtime::Chained::new(
            runtime::MAILER_HOST,
            pre,
            shared,
            settings.limits.request_timeout,
        )))
    } else {
        crate::log::warn(&format!(
            "no mailer component at {} (MAILER_PATH): e-mail codes cannot be sent",
            settings.mailer_path.display()
        ));
        None
    };

    let shared = Arc::new(runtime::Shared {
        kv: backend.clone(),
        variables,
        environment: api_env,
        allow: Arc::new(api_allow),
        guard,
        clock_offset,
        kv_count: settings.kv_count,
        grants: runtime::Grants::API,
        chain,
        gate: gate::Gate::new(settings.limits.heavy_instances),
    });
    if settings.clock_offset_ms > 0 {
        eprintln!(
            "tfa-host: test hook: the component's clock runs {} ms ahead",
            settings.clock_offset_ms
        );
    }
    eprintln!(
        "tfa-host: limits: REQUEST_TIMEOUT_MS={} HEADER_READ_TIMEOUT_MS={} IDLE_TIMEOUT_MS={} \
         MAX_CONNECTIONS={} MAX_HEAVY_INSTANCES={} MAINTENANCE_INTERVAL_MS={}",
        settings.limits.request_timeout.as_millis(),
        settings.limits.header_read_timeout.as_millis(),
        settings.limits.idle_timeout.as_millis(),
        settings.limits.max_connections,
        settings.limits.heavy_instances,
        settings.limits.maintenance_interval.as_millis(),
    );
    if let Some(addr) = settings.metrics_addr {
        let m = metrics::enable()?;
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on METRICS_ADDR={addr}"))?;
        eprintln!(
            "tfa-host: metrics on http://{}/metrics",
            l.local_addr().context("no local address")?
        );
        tokio::spawn(metrics::serve(l, m, shared.kv.clone()));
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", settings.port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", settings.port))?;
    eprintln!(
        "tfa-host: listening on http://{}",
        listener.local_addr().context("no local address")?
    );
    let server = Arc::new(server::Server::new(
        pre,
        shared,
        settings.limits.clone(),
        server::Observe {
            log_format: settings.log_format,
            base_path: core_config
                .as_ref()
                .map_or_else(|| "/api".to_string(), |c| c.base_path.clone()),
        },
    ));
    server.clone().serve(listener, shutdown_signal()).await;
    // Every instance has ended: what they wrote after their responses is
    // made durable before the process goes (`walsync`).
    if let Some(durable) = backend.durable() {
        if let Err(e) = durable.await {
            eprintln!("tfa-host: the store's last writes may not be durable: {e}");
        }
    }
    // Close the store: the last handles go with the server.
    drop(server);
    drop(backend);
    accesslog::flush();
    eprintln!("tfa-host: stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tfa-host: cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
