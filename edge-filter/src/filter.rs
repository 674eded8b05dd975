//! The proxy-wasm glue (wasm32 only): reads what the host has, calls the
//! pure modules, and writes their decision back.
//!
//! Host calls go through `proxy_wasm::hostcalls`, whose functions return
//! `Err` for every status the ABI allows a call to fail with (shared data
//! CAS mismatch, unknown cluster, missing metric, …); each such `Err` is
//! handled here. The SDK's `Context` convenience methods, which unwrap, are
//! not used, nor is its logger (which unwraps too).

use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use tfa_core::crypto::token_memo::MemoVerifier;

use crate::config::{Config, Requirement};
use crate::headers::Headers;
use crate::introspect::{self, CacheSlot, Cached};
use crate::policy::{self, Denial};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { state: None, metrics: None })
    });
}}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// Counter ids; `None` where the host refused to define one.
struct Metrics {
    allowed: Option<u32>,
    denied: [Option<u32>; Denial::ALL.len()],
    introspection_calls: Option<u32>,
    cache_hits: Option<u32>,
    api_errors: Option<u32>,
    fail_open: Option<u32>,
}

impl Metrics {
    fn define() -> Metrics {
        let def = |name: &str| hostcalls::define_metric(MetricType::Counter, name).ok();
        Metrics {
            allowed: def("tfa_edge.allowed"),
            denied: Denial::ALL.map(|d| def(&format!("tfa_edge.denied.{}", d.reason()))),
            introspection_calls: def("tfa_edge.introspection.calls"),
            cache_hits: def("tfa_edge.introspection.cache_hits"),
            api_errors: def("tfa_edge.introspection.api_errors"),
            fail_open: def("tfa_edge.introspection.fail_open"),
        }
    }

    fn inc(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}

struct State {
    cfg: Config,
    verifier: MemoVerifier,
}

struct Root {
    state: Option<Rc<State>>,
    metrics: Option<Rc<Metrics>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        if self.metrics.is_none() {
            self.metrics = Some(Rc::new(Metrics::define()));
        }
        self.state = None;
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(b) => b.unwrap_or_default(),
            Err(s) => {
                log(
                    LogLevel::Error,
                    &format!("tfa-edge: configuration refused: cannot read it ({s:?})"),
                );
                return false;
            }
        };
        match Config::parse(&bytes) {
            Ok(cfg) => {
                for w in cfg.warnings() {
                    log(LogLevel::Warn, &format!("tfa-edge: {w}"));
                }
                let verifier = policy::verifier(&cfg);
                self.state = Some(Rc::new(State { cfg, verifier }));
                log(LogLevel::Info, "tfa-edge: configuration accepted");
                true
            }
            Err(e) => {
                log(
                    LogLevel::Error,
                    &format!("tfa-edge: configuration refused: {e}"),
                );
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let metrics = self
            .metrics
            .clone()
            .unwrap_or_else(|| Rc::new(Metrics::define()));
        Some(Box::new(Filter {
            state: self.state.clone(),
            metrics,
            pending: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// A request paused on an introspection call.
struct Pending {
    token_id: u32,
    slot: CacheSlot,
    forward: Vec<(String, String)>,
    html: bool,
    original: String,
}

struct Filter {
    state: Option<Rc<State>>,
    metrics: Rc<Metrics>,
    pending: Option<Pending>,
}

/// The host's time since the Unix epoch, if it gives one.
fn now() -> Option<Duration> {
    hostcalls::get_current_time()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The request's header map as the host serialised it: one buffer, read in
/// place by [`Headers`] (the SDK's `get_map_bytes` copies every name and
/// value, and panics on a map it cannot parse).
fn request_header_bytes() -> Vec<u8> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the host writes a pointer to a buffer it allocated in this
    // module's memory through `proxy_on_memory_allocate` (the SDK's
    // allocator: a `Vec<u8>` of exactly that capacity, forgotten), and its
    // size; we take ownership of it exactly as the SDK's own
    // `get_map_bytes` does.
    unsafe {
        match proxy_get_header_map_pairs(MapType::HttpRequestHeaders, &mut data, &mut size) {
            Status::Ok if !data.is_null() => Vec::from_raw_parts(data, size, size),
            _ => Vec::new(),
        }
    }
}

#[link(wasm_import_module = "env")]
extern "C" {
    // The same import as the SDK's (identical signature).
    fn proxy_get_header_map_pairs(
        map_type: MapType,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> Status;
}

impl Filter {
    fn allow(&self, forward: &[(String, String)]) {
        for (name, value) in forward {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value));
        }
        Metrics::inc(self.metrics.allowed);
    }

    fn deny(&self, denial: Denial, html: bool, original: &str) {
        Metrics::inc(self.metrics.denied[denial.index()]);
        log(
            LogLevel::Debug,
            &format!("tfa-edge: denied ({})", denial.reason()),
        );
        let login = self.state.as_deref().and_then(|s| policy::login_of(&s.cfg));
        let response = policy::denial_response(login, denial, html, original);
        let headers: Vec<(&str, &str)> = response
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let _ = hostcalls::send_http_response(response.status, headers, Some(&response.body));
    }

    /// The API gave no usable answer: the configured policy decides.
    fn api_failed(
        &self,
        fail_open: bool,
        forward: &[(String, String)],
        html: bool,
        original: &str,
    ) -> Action {
        Metrics::inc(self.metrics.api_errors);
        if fail_open {
            Metrics::inc(self.metrics.fail_open);
            self.allow(forward);
            Action::Continue
        } else {
            self.deny(Denial::ApiUnavailable, html, original);
            Action::Pause
        }
    }
}

/// Writes `record` to `slot`, compare-and-swap: a write racing another
/// worker's is retried on the fresh version a few times, then dropped (the
/// cache is only a cache).
fn store(slot: &CacheSlot, record: Cached) {
    let value = introspect::encode(&slot.token_hash, record);
    for _ in 0..3 {
        let cas = match hostcalls::get_shared_data(&slot.key) {
            Ok((_, cas)) => cas,
            Err(_) => return,
        };
        match hostcalls::set_shared_data(&slot.key, Some(&value), cas) {
            Ok(()) => return,
            Err(Status::CasMismatch) => continue,
            Err(_) => return,
        }
    }
    log(
        LogLevel::Debug,
        "tfa-edge: cache write lost three CAS races; skipped",
    );
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            self.deny(Denial::NotConfigured, false, "");
            return Action::Pause;
        };
        // 1. Client-sent copies of the trusted headers go, on every request.
        // One read of all headers, then one removal per protected header
        // that is actually there (usually none: each host call into Envoy
        // costs about as much as the rest of a header check).
        let raw = request_header_bytes();
        let headers = Headers::parse(&raw).unwrap_or_default();
        for name in &state.cfg.protected_headers {
            if headers.contains(name) {
                let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name);
            }
        }
        let method = headers.text(":method").unwrap_or_default();
        let path = headers.text(":path").unwrap_or_default();

        // 2. Preflights and `none` rules pass.
        if policy::is_preflight(
            method,
            headers.first("origin"),
            headers.first("access-control-request-method"),
        ) {
            Metrics::inc(self.metrics.allowed);
            return Action::Continue;
        }
        let requirement = policy::requirement(&state.cfg, method, path);
        if requirement == Requirement::None {
            Metrics::inc(self.metrics.allowed);
            return Action::Continue;
        }

        // 3. The token. What a refusal needs (browser or not, the original
        // URL) is worked out only for a refusal.
        let refusal = || {
            let html = policy::wants_html(headers.first("accept"));
            let original =
                policy::original_url(headers.text(":scheme"), headers.text(":authority"), path);
            (html, original)
        };
        let cookies: Vec<&[u8]> = match state.cfg.cookie_name {
            Some(_) => headers.all("cookie").collect(),
            None => Vec::new(),
        };
        let token = policy::extract_token(
            headers.first("authorization"),
            &cookies,
            state.cfg.cookie_name.as_deref(),
        );
        let Some(now) = now() else {
            log(LogLevel::Error, "tfa-edge: the host gave no current time");
            let (html, original) = refusal();
            self.deny(Denial::NotConfigured, html, &original);
            return Action::Pause;
        };
        let claims = match policy::check_token(
            &state.verifier,
            token.as_deref(),
            requirement,
            now.as_secs(),
        ) {
            Ok(claims) => claims,
            Err(denial) => {
                let (html, original) = refusal();
                self.deny(denial, html, &original);
                return Action::Pause;
            }
        };
        let forward = policy::forwarded_headers(&state.cfg, &claims);
        let (Some(intro), Some(token)) = (&state.cfg.introspection, token) else {
            self.allow(&forward);
            return Action::Continue;
        };

        // 4. The session: cached answer, else ask the API.
        let slot = introspect::slot(&state.cfg, intro, &token);
        if let Ok((raw, _)) = hostcalls::get_shared_data(&slot.key) {
            if let Some(cached) = introspect::lookup(raw.as_deref(), &slot.token_hash, millis(now))
            {
                Metrics::inc(self.metrics.cache_hits);
                if cached.active {
                    self.allow(&forward);
                    return Action::Continue;
                }
                let (html, original) = refusal();
                self.deny(Denial::SessionInactive, html, &original);
                return Action::Pause;
            }
        }
        let (html, original) = refusal();
        Metrics::inc(self.metrics.introspection_calls);
        // The request's id (Envoy sets or keeps `x-request-id`) goes with
        // the call, so the API's log line of the introspection matches the
        // request it was made for.
        let mut call_headers = introspect::request_headers(intro);
        if let Some(id) = headers.text("x-request-id") {
            call_headers.push(("x-request-id", id));
        }
        match hostcalls::dispatch_http_call(
            &intro.cluster,
            call_headers,
            Some(&introspect::request_body(&token)),
            Vec::new(),
            Duration::from_millis(intro.timeout_ms),
        ) {
            Ok(token_id) => {
                self.pending = Some(Pending {
                    token_id,
                    slot,
                    forward,
                    html,
                    original,
                });
                Action::Pause
            }
            Err(s) => {
                log(
                    LogLevel::Warn,
                    &format!(
                        "tfa-edge: introspection call to cluster {:?} failed: {s:?}",
                        intro.cluster
                    ),
                );
                self.api_failed(intro.fail_open, &forward, html, &original)
            }
        }
    }
}

impl Context for Filter {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(state) = self.state.clone() else {
            return;
        };
        let Some(intro) = &state.cfg.introspection else {
            return;
        };
        let Some(p) = self.pending.take_if(|p| p.token_id == token_id) else {
            return;
        };
        let status = if num_headers == 0 {
            None
        } else {
            hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
                .ok()
                .flatten()
                .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
        };
        let body = if body_size == 0 || body_size > introspect::MAX_BODY {
            // Oversized bodies are refused by parse_response's own check.
            vec![b' '; body_size.min(introspect::MAX_BODY + 1)]
        } else {
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        match introspect::parse_response(status, &body) {
            Ok(active) => {
                if let Some(record) =
                    now().and_then(|n| introspect::record_for(intro, active, millis(n)))
                {
                    store(&p.slot, record);
                }
                if active {
                    self.allow(&p.forward);
                    let _ = hostcalls::resume_http_request();
                } else {
                    self.deny(Denial::SessionInactive, p.html, &p.original);
                }
            }
            Err(e) => {
                log(
                    LogLevel::Warn,
                    &format!("tfa-edge: introspection answer unusable: {e:?}"),
                );
                if let Action::Continue =
                    self.api_failed(intro.fail_open, &p.forward, p.html, &p.original)
                {
                    let _ = hostcalls::resume_http_request();
                }
            }
        }
    }
}
