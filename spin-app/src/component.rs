//! The Spin glue: the HTTP entry point and the ports over Spin's APIs.

use std::cell::OnceCell;

use futures::StreamExt;
use spin_sdk::http::{Fields, IncomingRequest, OutgoingResponse, ResponseOutparam};
use spin_sdk::http_component;
use spin_sdk::key_value;
use spin_sdk::wit::wasi::keyvalue::{atomics, store as wasi_store};
use tfa_core::contract::error::ApiError;
use tfa_core::contract::outbox::HttpCall;
use tfa_core::plumbing::web;
use tfa_core::{
    Config, Delivery, DeliveryError, Env, Request, Response, Rng, Service, Step, Store, StoreError,
};
use tfa_smtp::relay::{self, RelayRequest};

use crate::util;

/// The Spin key-value store label the service uses.
const STORE_LABEL: &str = "default";

/// The request header by which a host asks for the user id of the reply
/// (`tfa-user-id` on the response) for its log. Spin's own `spin-*`
/// headers are the host's; a client that sets it anyway learns only its
/// own id ([`tfa_core::Reply::user_id`] is never set by a failed attempt).
const OBSERVE_HEADER: &str = "spin-tfa-observe";

/// The request header by which a host says that another request checks the
/// service's queues often enough (`tfa-host` lets one request a second
/// check; see [`tfa_core::Reply::skip_maintenance`]). Spin never sets it,
/// so there every request checks; a client that sets it anyway only skips
/// its own request's check.
const MAINTENANCE_HEADER: &str = "spin-tfa-maintenance";

/// What the host asks of this request through its `spin-*` headers.
#[derive(Default)]
struct HostHints {
    /// Report the user id of the reply ([`OBSERVE_HEADER`]).
    observe: bool,
    /// Skip the queue check after the response ([`MAINTENANCE_HEADER`]).
    skip_maintenance: bool,
}

#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    // 1–2. Settings: every variable in one host call (`wasi:config`).
    let variables = variables();
    let outbound_host = variables
        .iter()
        .find(|(name, _)| name == "email_outbound_host")
        .map(|(_, value)| value.clone());
    let env = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)));
    let mut settings = util::collect_settings(variables, env);
    let smtp_address = util::smtp_address(&mut settings, outbound_host.as_deref());
    let config = match Config::from_settings(&settings) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tfa: refusing requests: {e}");
            send(out, web::host_error(&ApiError::Unavailable, None)).await;
            return;
        }
    };
    let email_ca = config.email.as_ref().and_then(|e| e.extra_ca_pem.clone());
    let service = Service::new(config);

    // 3. The request (core never sees `spin-*` headers).
    let (request, hints) = match read_request(req, service.config()).await {
        Ok(r) => r,
        Err(early) => {
            send(out, early).await;
            return;
        }
    };

    // 4–5. Handle, performing deliveries until there is a reply.
    let store = SpinStore::default();
    let mut rng = WasiRng::default();
    let mut reply = {
        let mut env = Env {
            store: &store,
            rng: &mut rng,
            now_ms: now_ms(),
        };
        let mut step = service.handle(&mut env, &request);
        loop {
            match step {
                Step::Respond(reply) => break reply,
                Step::Deliver(delivery, pending) => {
                    let result = deliver(delivery, email_ca.as_deref(), smtp_address).await;
                    if let Err(e) = &result {
                        eprintln!("tfa: delivery failed: {}", e.0);
                    }
                    let mut env = Env {
                        store: &store,
                        rng: &mut rng,
                        now_ms: now_ms(),
                    };
                    step = service.resume(&mut env, pending, result);
                }
            }
        }
    };

    // A host that has another request check the queues says so.
    if hints.skip_maintenance {
        reply.skip_maintenance();
    }

    // 6. Answer the client (the body is finished when `send` returns). A
    // host that logs the user (tfa-host with LOG_FORMAT=json) asks with
    // `spin-tfa-observe: user` and strips `tfa-user-id` from the response.
    let mut response = reply.response;
    if let Some(user) = reply.user_id.filter(|_| hints.observe) {
        response.set_header("tfa-user-id", user);
    }
    send(out, response).await;

    // 7. After-response effects: audit records, webhook fan-out and due
    // retries, housekeeping; then the webhook calls, each result reported.
    let mut env = Env {
        store: &store,
        rng: &mut rng,
        now_ms: now_ms(),
    };
    let done = service.complete(&mut env, reply.effects);
    for line in &done.log {
        eprintln!("tfa: {line}");
    }
    for webhook in done.webhooks {
        let result = http_status(webhook.call).await;
        let mut env = Env {
            store: &store,
            rng: &mut rng,
            now_ms: now_ms(),
        };
        for line in service.webhook_result(&mut env, &webhook.delivery_id, result) {
            eprintln!("tfa: {line}");
        }
    }
}

/// The component's variables, all at once (`wasi:config/store.get-all`:
/// one host call instead of one per setting). A host that cannot list them
/// gets asked one by one (`fermyon:spin/variables`).
fn variables() -> Vec<(String, String)> {
    match spin_sdk::wit::wasi::config::store::get_all() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("tfa: wasi:config get-all failed ({e:?}); reading variables one by one");
            tfa_core::contract::config::SETTING_NAMES
                .iter()
                .map(|n| n.to_ascii_lowercase())
                .chain(["email_outbound_host".to_string()])
                .filter_map(|n| spin_sdk::variables::get(&n).ok().map(|v| (n, v)))
                .collect()
        }
    }
}

/// The one place the component reads the clock.
#[allow(clippy::disallowed_methods)] // core takes time as a parameter; the host reads it here.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Turns the incoming request into core's shape and the host's hints, or an
/// early answer.
async fn read_request(
    req: IncomingRequest,
    config: &Config,
) -> Result<(Request, HostHints), Response> {
    let mut method = req.method().to_string();
    method.make_ascii_uppercase();
    let path = req.path_with_query().unwrap_or_else(|| "/".to_string());
    let mut headers = Vec::new();
    let mut peer = None;
    let mut hints = HostHints::default();
    for (name, value) in req.headers().entries() {
        // Valid UTF-8 (nearly every value) is moved, not copied.
        let value = String::from_utf8(value)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        if name.eq_ignore_ascii_case("spin-client-addr") {
            peer = Some(util::strip_port(&value));
        } else if name.eq_ignore_ascii_case(OBSERVE_HEADER) {
            hints.observe = true;
        } else if name.eq_ignore_ascii_case(MAINTENANCE_HEADER) {
            hints.skip_maintenance = value == "skip";
        } else if !name
            .as_bytes()
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"spin-"))
        {
            headers.push((name, value));
        }
    }
    // wasi:http carries the `Host` header as the request's authority; core
    // compares it with `Origin` for same-origin requests.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        if let Some(authority) = req.authority() {
            headers.push(("host".to_string(), authority));
        }
    }
    let mut body = Vec::new();
    if util::may_have_body(&method, &headers) {
        let mut stream = req.into_body_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    body.extend_from_slice(&bytes);
                    if body.len() > web::MAX_BODY_BYTES {
                        return Err(web::host_error(&ApiError::BodyTooLarge, Some(config)));
                    }
                }
                Err(e) => {
                    eprintln!("tfa: could not read the request body: {e}");
                    return Err(web::host_error(
                        &ApiError::Validation("could not read the request body".into()),
                        Some(config),
                    ));
                }
            }
        }
    }
    Ok((
        Request {
            method,
            path,
            headers,
            body,
            peer,
        },
        hints,
    ))
}

/// Writes `response` to the client and finishes its body.
async fn send(out: ResponseOutparam, mut response: Response) {
    if util::status_has_body(response.status) && response.header_value("content-length").is_none() {
        let len = response.body.len().to_string();
        response.set_header("content-length", len);
    }
    // The header strings are moved, not copied: two allocations fewer per
    // header (`wasi:http` wants the names in lower case).
    let fields: Vec<(String, Vec<u8>)> = std::mem::take(&mut response.headers)
        .into_iter()
        .map(|(mut name, value)| {
            name.make_ascii_lowercase();
            (name, value.into_bytes())
        })
        .collect();
    let (headers, body) = match Fields::from_list(&fields) {
        Ok(h) => (h, response.body),
        Err(e) => {
            eprintln!("tfa: invalid response headers: {e:?}");
            let mut fallback = web::host_error(&ApiError::Internal, None);
            let len = fallback.body.len().to_string();
            fallback.set_header("content-length", len);
            response.status = fallback.status;
            let fields: Vec<(String, Vec<u8>)> = fallback
                .headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
                .collect();
            let h = Fields::from_list(&fields).unwrap_or_else(|_| Fields::new());
            (h, fallback.body)
        }
    };
    let outgoing = OutgoingResponse::new(headers);
    if outgoing.set_status_code(response.status).is_err() {
        let _ = outgoing.set_status_code(500);
    }
    // `body` and `write` are called once on a fresh response, so they
    // cannot fail. The body goes out with `blocking-write-and-flush`, one
    // host call per 4096 bytes (the most one call may take): the SDK's sink
    // makes five to eight calls (check-write, write, flush, subscribe,
    // poll) even for a body of a few bytes. "Blocking" suspends only this
    // request's guest while the host waits for the client.
    let sink = outgoing.body();
    out.set(outgoing);
    let Ok(sink) = sink else {
        return;
    };
    if let Ok(stream) = sink.write() {
        if let Err(e) = util::write_chunked(&body, |chunk| stream.blocking_write_and_flush(chunk)) {
            eprintln!("tfa: could not write the response body: {e}");
        }
    }
    if let Err(e) = spin_sdk::http::OutgoingBody::finish(sink, None) {
        eprintln!("tfa: could not finish the response body: {e:?}");
    }
}

// ---------------------------------------------------------------- deliveries

async fn deliver(
    delivery: Delivery,
    email_ca: Option<&str>,
    smtp_address: Option<std::net::SocketAddr>,
) -> Result<(), DeliveryError> {
    match delivery {
        Delivery::Sms(call) => send_http(call).await,
        Delivery::Email(message) => relay_email(RelayRequest {
            message,
            extra_ca_pem: email_ca.map(str::to_string),
            address: smtp_address,
        }),
    }
}

/// Has the mailer component send one e-mail (local service chaining; see
/// `tfa_smtp::relay`): its answer, or why there is none.
fn relay_email(request: RelayRequest) -> Result<(), DeliveryError> {
    let call = HttpCall {
        method: "POST".into(),
        url: relay::MAILER_URL.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: request.to_json(),
    };
    let answer = crate::outbound::send_with(&call, crate::outbound::RELAY_TIMEOUT_NS)
        .map_err(DeliveryError)?;
    relay::read_answer(answer.status, &answer.body).map_err(DeliveryError)
}

/// Sends a webhook call; the status of any answer, or why none came.
async fn http_status(call: HttpCall) -> Result<u16, String> {
    crate::outbound::send(&call).map(|a| a.status)
}

async fn send_http(call: HttpCall) -> Result<(), DeliveryError> {
    let target = call.url.split('?').next().unwrap_or("").to_string();
    let answer = crate::outbound::send(&call).map_err(DeliveryError)?;
    if (200..300).contains(&answer.status) {
        Ok(())
    } else {
        Err(DeliveryError(format!(
            "{target} answered {}: {}",
            answer.status,
            util::excerpt(&answer.body, 200)
        )))
    }
}

// --------------------------------------------------------------------- ports

/// Random bytes from `wasi:random`, fetched [`RANDOM_BATCH`] at a time: a
/// request draws several small values (ids, token ids, salts), and each host
/// call costs far more than the bytes it returns. Bytes handed out are
/// zeroed in the batch; the batch lives as long as the request's instance.
#[derive(Default)]
struct WasiRng {
    batch: Vec<u8>,
    used: usize,
}

/// Bytes per `get-random-bytes` call.
const RANDOM_BATCH: u64 = 256;

impl Rng for WasiRng {
    fn fill(&mut self, dest: &mut [u8]) {
        let mut at = 0;
        while at < dest.len() {
            if self.used >= self.batch.len() {
                self.batch = wasi::random::random::get_random_bytes(RANDOM_BATCH);
                self.used = 0;
                if self.batch.is_empty() {
                    // A host that returns nothing: one u64 at a time.
                    self.batch = wasi::random::random::get_random_u64()
                        .to_le_bytes()
                        .to_vec();
                }
            }
            let n = (dest.len() - at).min(self.batch.len() - self.used);
            let from = &mut self.batch[self.used..self.used + n];
            dest[at..at + n].copy_from_slice(from);
            from.fill(0);
            self.used += n;
            at += n;
        }
    }
}

/// [`Store`] over Spin's key-value store `default` (get/set/delete) and
/// `wasi:keyvalue/atomics` `increment` opened on the same label: the
/// operations every Spin backend implements correctly (no compare-and-swap,
/// no batch; see `tfa_core::contract::ports`). Both handles
/// are opened on first use; an open failure is a [`StoreError`] on every call.
#[derive(Default)]
struct SpinStore {
    kv: OnceCell<Result<key_value::Store, String>>,
    bucket: OnceCell<Result<wasi_store::Bucket, String>>,
}

impl SpinStore {
    fn kv(&self) -> Result<&key_value::Store, StoreError> {
        self.kv
            .get_or_init(|| {
                key_value::Store::open(STORE_LABEL).map_err(|e| format!("open {STORE_LABEL}: {e}"))
            })
            .as_ref()
            .map_err(|e| StoreError(e.clone()))
    }

    fn bucket(&self) -> Result<&wasi_store::Bucket, StoreError> {
        self.bucket
            .get_or_init(|| {
                wasi_store::open(STORE_LABEL).map_err(|e| format!("open {STORE_LABEL}: {e}"))
            })
            .as_ref()
            .map_err(|e| StoreError(e.clone()))
    }
}

fn kv_err(e: key_value::Error) -> StoreError {
    StoreError(format!("key-value: {e}"))
}

fn wasi_err(e: wasi_store::Error) -> StoreError {
    StoreError(format!("wasi:keyvalue: {e}"))
}

impl Store for SpinStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.kv()?.get(key).map_err(kv_err)
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.kv()?.set(key, value).map_err(kv_err)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.kv()?.delete(key).map_err(kv_err)
    }

    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        atomics::increment(self.bucket()?, key, delta).map_err(wasi_err)
    }

    /// Waits a little before the next attempt at a lock another request
    /// holds: [`tfa_core::plumbing::lock::pause_for`], 1 ms growing to 10 ms
    /// (`wasi:clocks` through std's sleep).
    fn pause(&self, attempt: u32) {
        std::thread::sleep(tfa_core::plumbing::lock::pause_for(attempt));
    }
}
