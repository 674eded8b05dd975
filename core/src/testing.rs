//! Test doubles for the ports (feature `testing`): an in-memory store, one
//! that interleaves concurrent operations, one that fails on demand, a
//! seeded random source, and a harness that drives [`Service`] the way a
//! host does, with a manual clock and a record of deliveries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::contract::outbox::{Delivery, DeliveryError};
use crate::contract::ports::{Env, Rng, Store, StoreError};
use crate::Step;
use crate::{Config, Request, Response, Service};

pub mod fuzzing;

/// A thread-safe in-memory store; every operation is atomic. As on Spin's
/// backends, `get` on a counter finds it (as decimal digits, like Redis),
/// but core only ever uses that to tell whether the counter exists.
#[derive(Default)]
pub struct MemoryStore {
    values: Mutex<HashMap<String, Vec<u8>>>,
    counters: Mutex<HashMap<String, i64>>,
}

/// One stored entry, as [`MemoryStore::entries`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A plain value.
    Value(Vec<u8>),
    /// A counter.
    Counter(i64),
}

impl Clone for MemoryStore {
    /// An independent copy of everything stored (tests: snapshot a prepared
    /// state once, start many runs from it).
    fn clone(&self) -> Self {
        MemoryStore {
            values: Mutex::new(self.values.lock().map(|v| v.clone()).unwrap_or_default()),
            counters: Mutex::new(self.counters.lock().map(|c| c.clone()).unwrap_or_default()),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys (values and counters): lets tests check that storage
    /// does not grow without bound.
    pub fn len(&self) -> usize {
        self.values.lock().map(|v| v.len()).unwrap_or(0)
            + self.counters.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All keys, sorted (tests only; the service never lists keys).
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self
            .values
            .lock()
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default();
        k.extend(
            self.counters
                .lock()
                .map(|c| c.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        k.sort();
        k
    }

    /// Every key with its value or counter, sorted by key (tests only: lets
    /// a test compare what a request changed).
    pub fn entries(&self) -> std::collections::BTreeMap<String, Entry> {
        let mut out = std::collections::BTreeMap::new();
        if let Ok(v) = self.values.lock() {
            for (k, v) in v.iter() {
                out.insert(k.clone(), Entry::Value(v.clone()));
            }
        }
        if let Ok(c) = self.counters.lock() {
            for (k, c) in c.iter() {
                out.insert(k.clone(), Entry::Counter(*c));
            }
        }
        out
    }

    /// A raw value (tests only).
    pub fn raw(&self, key: &str) -> Option<Vec<u8>> {
        self.values.lock().ok()?.get(key).cloned()
    }

    fn err() -> StoreError {
        StoreError("poisoned lock".into())
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.values.lock().map_err(|_| Self::err())?.get(key) {
            return Ok(Some(v.clone()));
        }
        Ok(self
            .counters
            .lock()
            .map_err(|_| Self::err())?
            .get(key)
            .map(|c| c.to_string().into_bytes()))
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.values
            .lock()
            .map_err(|_| Self::err())?
            .insert(key.to_string(), value.to_vec());
        Ok(())
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.values.lock().map_err(|_| Self::err())?.remove(key);
        self.counters.lock().map_err(|_| Self::err())?.remove(key);
        Ok(())
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut c = self.counters.lock().map_err(|_| Self::err())?;
        let e = c.entry(key.to_string()).or_insert(0);
        *e = e
            .checked_add(delta)
            .ok_or_else(|| StoreError("counter overflow".into()))?;
        Ok(*e)
    }
}

/// Wraps a store and yields the thread before and after every operation, so
/// that requests running on several threads interleave at every store step.
pub struct InterleavingStore<S: Store> {
    inner: S,
}

impl<S: Store> InterleavingStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        InterleavingStore { inner }
    }
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
    fn around<T>(&self, f: impl FnOnce(&S) -> T) -> T {
        std::thread::yield_now();
        let out = f(&self.inner);
        std::thread::yield_now();
        out
    }
}

impl<S: Store> Store for InterleavingStore<S> {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.around(|s| s.get(key))
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.around(|s| s.set(key, value))
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.around(|s| s.delete(key))
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.around(|s| s.increment(key, delta))
    }
    /// Sleeps as the component does ([`crate::plumbing::lock::pause_for`]),
    /// so that a waiting thread lets the lock holder run (a bare yield lets
    /// fifty waiters use up their attempts while the holder is not
    /// scheduled) and the waiters have the component's budget of about 4 s.
    /// Until 2026-12-07 it slept a tenth of that, a budget of 0.36 s, which
    /// a request behind fifteen others at a boundary used up once under
    /// CI's load.
    fn pause(&self, attempt: u32) {
        std::thread::sleep(crate::plumbing::lock::pause_for(attempt));
    }
}

/// Wraps a store and fails every operation from the `n`-th on (counting
/// from 1) while armed; counts operations while disarmed too.
pub struct FailingStore<S: Store> {
    inner: S,
    ops: AtomicU64,
    fail_from: AtomicU64,
}

impl<S: Store> FailingStore<S> {
    /// Wraps `inner`, disarmed.
    pub fn new(inner: S) -> Self {
        FailingStore {
            inner,
            ops: AtomicU64::new(0),
            fail_from: AtomicU64::new(u64::MAX),
        }
    }
    /// Operations so far will not fail; the `n`-th operation from now on
    /// (1 = the next) and all after it will.
    pub fn fail_after(&self, n: u64) {
        self.ops.store(0, Ordering::SeqCst);
        self.fail_from.store(n, Ordering::SeqCst);
    }
    /// Stops failing.
    pub fn disarm(&self) {
        self.fail_from.store(u64::MAX, Ordering::SeqCst);
    }
    /// Operations counted since the last `fail_after` / creation.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
    fn check(&self) -> Result<(), StoreError> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.fail_from.load(Ordering::SeqCst) {
            Err(StoreError("injected failure".into()))
        } else {
            Ok(())
        }
    }
}

impl<S: Store> Store for FailingStore<S> {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.check()?;
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.check()?;
        self.inner.delete(key)
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.check()?;
        self.inner.increment(key, delta)
    }
    fn pause(&self, attempt: u32) {
        self.inner.pause(attempt)
    }
}

/// Wraps a store and records every operation as `"<op> <key>"` (`get`,
/// `set`, `delete`, `increment`), in order: what a request costs the store.
pub struct RecordingStore<S: Store> {
    inner: S,
    log: std::sync::Mutex<Vec<String>>,
}

impl<S: Store> RecordingStore<S> {
    /// Wraps `inner`, with an empty record.
    pub fn new(inner: S) -> Self {
        RecordingStore {
            inner,
            log: Default::default(),
        }
    }
    /// The operations recorded since the last call, oldest first.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }
    fn note(&self, op: &str, key: &str) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{op} {key}"));
    }
}

impl<S: Store> Store for RecordingStore<S> {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.note("get", key);
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.note("set", key);
        self.inner.set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.note("delete", key);
        self.inner.delete(key)
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.note("increment", key);
        self.inner.increment(key, delta)
    }
    fn pause(&self, attempt: u32) {
        self.inner.pause(attempt)
    }
}

/// A deterministic random source (SplitMix64) for tests. Not secure.
pub struct SeededRng(u64);

impl SeededRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Rng for SeededRng {
    fn fill(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// How the harness answers deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Every delivery succeeds.
    Succeed,
    /// Every delivery fails.
    Fail,
}

/// Drives a [`Service`] like a host: manual clock, seeded randomness,
/// deliveries recorded, effects completed after each response.
pub struct Harness<S: Store = MemoryStore> {
    /// The service under test.
    pub service: Service,
    /// The store.
    pub store: S,
    /// Current time (ms).
    pub now_ms: u64,
    /// Every delivery asked for, in order.
    pub deliveries: Vec<Delivery>,
    /// How deliveries are answered.
    pub delivery_mode: DeliveryMode,
    /// Lines the service asked to log.
    pub log: Vec<String>,
    /// Every webhook call attempted, in order.
    pub webhook_calls: Vec<crate::api::webhooks::WebhookCall>,
    /// Answers for the next webhook calls (then 200).
    pub webhook_answers: std::collections::VecDeque<Result<u16, String>>,
    /// The last reply's [`crate::Reply::user_id`] (what a host logs).
    pub last_user_id: Option<String>,
    rng: SeededRng,
}

/// Settings for tests: fixed secrets, cheap Argon2, SMS and e-mail
/// configured, plus `extra`.
pub fn test_config(extra: &[(&str, &str)]) -> Config {
    let mut vars = Config::map_of([
        (
            "JWT_ACCESS_SECRET",
            "access-secret-access-secret-access-secret-0001",
        ),
        (
            "JWT_REFRESH_SECRET",
            "refresh-secret-refresh-secret-refresh-secret-02",
        ),
        (
            "TEMP_TOKEN_SECRET",
            "temp-secret-temp-secret-temp-secret-temp-sec-03",
        ),
        (
            "DEVICE_TOKEN_SECRET",
            "device-secret-device-secret-device-secret-0004",
        ),
        ("ARGON2_MEMORY_KIB", "64"),
        ("ARGON2_ITERATIONS", "1"),
        ("WEBAUTHN_RP_ID", "localhost"),
        ("WEBAUTHN_ORIGINS", "http://localhost:3001"),
        ("TWILIO_ACCOUNT_SID", "AC0123456789abcdef0123456789abcdef"),
        ("TWILIO_AUTH_TOKEN", "twilio-token"),
        ("TWILIO_PHONE_NUMBER", "+15550000000"),
        ("TWILIO_API_BASE", "http://127.0.0.1:9"),
        ("EMAIL_HOST", "127.0.0.1"),
        ("EMAIL_PORT", "2525"),
        ("EMAIL_FROM", "noreply@example.com"),
        ("CORS_ORIGINS", "https://app.example.com"),
    ]);
    for (k, v) in extra {
        vars.insert(k.to_string(), v.to_string());
    }
    Config::from_map(&vars).expect("test settings are valid")
}

/// A fixed start time: 2026-01-01T00:00:00Z.
pub const T0_MS: u64 = 1_767_225_600_000;

impl Harness<MemoryStore> {
    /// A harness with [`test_config`] and an empty memory store.
    pub fn new() -> Self {
        Self::with(test_config(&[]), MemoryStore::new())
    }
}

impl Default for Harness<MemoryStore> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Store> Harness<S> {
    /// A harness over `store` with `config`.
    pub fn with(config: Config, store: S) -> Self {
        Harness {
            service: Service::new(config),
            store,
            now_ms: T0_MS,
            deliveries: Vec::new(),
            delivery_mode: DeliveryMode::Succeed,
            log: Vec::new(),
            webhook_calls: Vec::new(),
            webhook_answers: Default::default(),
            last_user_id: None,
            rng: SeededRng::new(42),
        }
    }

    /// Restarts the random source from `seed` (a harness built over a copied
    /// store must not draw the ids the original already drew).
    pub fn reseed(&mut self, seed: u64) {
        self.rng = SeededRng::new(seed);
    }

    /// Advances the clock.
    pub fn advance_secs(&mut self, secs: u64) {
        self.now_ms += secs * 1000;
    }

    /// Sends `req` (peer 203.0.113.7 unless set) and returns the response,
    /// performing deliveries and completing effects like a host.
    pub fn call(&mut self, req: Request) -> Response {
        let reply = self.respond(req);
        self.complete(reply.effects);
        reply.response
    }

    /// The first half of [`Harness::call`]: handles `req` (peer
    /// 203.0.113.7 unless set), performing its deliveries, and returns the
    /// reply without running what follows the response.
    pub fn respond(&mut self, mut req: Request) -> crate::Reply {
        if req.peer.is_none() {
            req.peer = Some("203.0.113.7".into());
        }
        let mut env = Env {
            store: &self.store,
            rng: &mut self.rng,
            now_ms: self.now_ms,
        };
        let mut step = self.service.handle(&mut env, &req);
        let reply = loop {
            match step {
                Step::Respond(reply) => break reply,
                Step::Deliver(d, pending) => {
                    self.deliveries.push(d);
                    let result = match self.delivery_mode {
                        DeliveryMode::Succeed => Ok(()),
                        DeliveryMode::Fail => Err(DeliveryError("gateway refused".into())),
                    };
                    step = self.service.resume(&mut env, pending, result);
                }
            }
        };
        self.last_user_id = reply.user_id.clone();
        reply
    }

    /// The second half of [`Harness::call`]: runs what follows a response
    /// and attempts the webhook calls it returns (answered from
    /// `webhook_answers`, 200 when empty).
    pub fn complete(&mut self, effects: Vec<crate::Effect>) {
        let mut env = Env {
            store: &self.store,
            rng: &mut self.rng,
            now_ms: self.now_ms,
        };
        let done = self.service.complete(&mut env, effects);
        self.log.extend(done.log);
        for call in done.webhooks {
            let answer = self.webhook_answers.pop_front().unwrap_or(Ok(200));
            let lines = self
                .service
                .webhook_result(&mut env, &call.delivery_id, answer);
            self.log.extend(lines);
            self.webhook_calls.push(call);
        }
    }

    /// The 6-digit code in the last delivery.
    pub fn last_code(&self) -> Option<String> {
        let text = match self.deliveries.last()? {
            Delivery::Sms(call) => String::from_utf8_lossy(&call.body).to_string(),
            Delivery::Email(m) => m.text.clone(),
        };
        let text = text.replace("%20", " ");
        let after = text.split("verification code is ").nth(1)?;
        let code: String = after.chars().take(6).collect();
        (code.len() == 6 && code.chars().all(|c| c.is_ascii_digit())).then_some(code)
    }
}
