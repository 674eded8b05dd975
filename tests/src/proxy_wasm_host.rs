//! A proxy-wasm host (ABI 0.2.1) on wasmtime's core-module API, for tests of
//! the edge filter: it loads the built `.wasm`, plays Envoy's part, and lets
//! a test drive every callback and look at every effect.
//!
//! What it implements: logging; a clock the test sets
//! (`proxy_get_current_time_nanoseconds`, also WASI `clock_time_get`);
//! buffers (VM and plugin configuration, HTTP call response body); header
//! maps (request and response headers of the effective stream, HTTP call
//! response headers); local responses; HTTP callouts recorded for the test to
//! answer (or fail, as a timeout would); shared data with real
//! compare-and-swap, shareable between several VMs like Envoy's workers, with
//! a hook that makes another "worker" write between a read and a write;
//! properties; counters, gauges and histograms; stream continue/close;
//! effective context. Other `env` imports answer `Unimplemented` (12) and
//! leave a log line; WASI preview1 imports are stubbed (`fd_write` is
//! captured, `random_get` is deterministic, the environment is empty, the
//! rest answer `ENOSYS`).
//!
//! A trap in the module surfaces as an `Err` from the driving call, so a
//! test that drives the filter with `?`/`expect` also proves it never traps.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime::{
    Caller, Engine, Extern, ExternType, Instance, Linker, Memory, Module, Store, Val, ValType,
};

pub use wasmtime::Result;

/// proxy-wasm status codes.
pub mod status {
    /// Success.
    pub const OK: i32 = 0;
    /// No such key/value.
    pub const NOT_FOUND: i32 = 1;
    /// Bad argument.
    pub const BAD_ARGUMENT: i32 = 2;
    /// Compare-and-swap lost.
    pub const CAS_MISMATCH: i32 = 8;
    /// Not implemented by this host.
    pub const UNIMPLEMENTED: i32 = 12;
}

/// Log levels as the ABI numbers them.
pub mod level {
    /// Trace.
    pub const TRACE: u32 = 0;
    /// Debug.
    pub const DEBUG: u32 = 1;
    /// Info.
    pub const INFO: u32 = 2;
    /// Warn.
    pub const WARN: u32 = 3;
    /// Error.
    pub const ERROR: u32 = 4;
    /// Critical.
    pub const CRITICAL: u32 = 5;
}

const MAP_REQUEST_HEADERS: i32 = 0;
const MAP_RESPONSE_HEADERS: i32 = 2;
const MAP_CALL_RESPONSE_HEADERS: i32 = 6;
const MAP_CALL_RESPONSE_TRAILERS: i32 = 7;
const BUFFER_CALL_RESPONSE_BODY: i32 = 4;
const BUFFER_VM_CONFIGURATION: i32 = 6;
const BUFFER_PLUGIN_CONFIGURATION: i32 = 7;
const WASI_ENOSYS: i32 = 52;

/// A header list; names lower case, values raw bytes.
pub type Headers = Vec<(String, Vec<u8>)>;

/// Compiled filter, reusable by any number of [`Plugin`]s.
#[derive(Clone)]
pub struct FilterModule {
    engine: Engine,
    module: Module,
}

impl FilterModule {
    /// Compiles the module at `path` and checks that it speaks ABI 0.2.1.
    pub fn load(path: &Path) -> Result<FilterModule> {
        let engine = Engine::default();
        let module = Module::from_file(&engine, path)?;
        if module.get_export("proxy_abi_version_0_2_1").is_none() {
            wasmtime::bail!("{} does not export proxy_abi_version_0_2_1", path.display());
        }
        Ok(FilterModule { engine, module })
    }

    /// Names of the module's imports, `module.name`.
    pub fn imports(&self) -> Vec<String> {
        self.module
            .imports()
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect()
    }
}

/// One shared-data entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedEntry {
    /// Value.
    pub value: Vec<u8>,
    /// Version; never 0.
    pub cas: u32,
}

/// Shared data of a set of VMs (Envoy's per-`vm_id` key-value store).
#[derive(Debug, Default)]
pub struct SharedData {
    /// Entries by key.
    pub entries: HashMap<String, SharedEntry>,
    next_cas: u32,
    /// Keys for which the next read is followed by another writer's update
    /// (so a write with the CAS just read must fail).
    interfere: Vec<String>,
    /// `proxy_set_shared_data` calls refused for a stale CAS.
    pub cas_mismatches: u32,
    /// `proxy_set_shared_data` calls accepted.
    pub writes: u32,
}

impl SharedData {
    fn bump(&mut self) -> u32 {
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        self.next_cas
    }

    /// Writes `value` unconditionally, as another worker would.
    pub fn put(&mut self, key: &str, value: &[u8]) {
        let cas = self.bump();
        self.entries.insert(
            key.to_string(),
            SharedEntry {
                value: value.to_vec(),
                cas,
            },
        );
    }

    /// After the next read of `key`, another writer updates it.
    pub fn interfere_after_next_read(&mut self, key: &str) {
        self.interfere.push(key.to_string());
    }

    fn get(&mut self, key: &str) -> Option<SharedEntry> {
        let found = self.entries.get(key).cloned();
        if let Some(pos) = self.interfere.iter().position(|k| k == key) {
            self.interfere.remove(pos);
            self.put(key, b"written by another worker");
        }
        found
    }

    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> i32 {
        if let Some(e) = self.entries.get(key) {
            if cas != 0 && cas != e.cas {
                self.cas_mismatches += 1;
                return status::CAS_MISMATCH;
            }
        }
        self.writes += 1;
        self.put(key, value);
        status::OK
    }
}

/// A handle on shared data that several plugins can hold.
pub type SharedStore = Arc<Mutex<SharedData>>;

/// Locks a store, surviving a poisoned lock (a failed test elsewhere).
pub fn lock(store: &SharedStore) -> MutexGuard<'_, SharedData> {
    store.lock().unwrap_or_else(|e| e.into_inner())
}

/// A local response sent by the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// Status code.
    pub status: u32,
    /// Status code details.
    pub details: String,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// gRPC status, -1 for none.
    pub grpc_status: i32,
}

impl LocalResponse {
    /// First header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// An HTTP callout made by the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// Stream that made it.
    pub context_id: u32,
    /// Token the host returned.
    pub token: u32,
    /// Cluster.
    pub upstream: String,
    /// Headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// Timeout, milliseconds.
    pub timeout_ms: u32,
}

impl HttpCall {
    /// First header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Where a request stands after a callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Goes on to the upstream with these request headers.
    Continued(Vec<(String, String)>),
    /// Answered by the filter.
    Responded(LocalResponse),
    /// Waiting; the filter's callouts of this stream that are unanswered.
    Paused(Vec<HttpCall>),
    /// The filter closed the stream.
    Reset,
}

impl Outcome {
    /// The forwarded request headers, if the request went on.
    pub fn forwarded(&self) -> Option<&[(String, String)]> {
        match self {
            Outcome::Continued(h) => Some(h),
            _ => None,
        }
    }

    /// Forwarded header `name`, if the request went on and has it.
    pub fn forwarded_header(&self, name: &str) -> Option<&str> {
        self.forwarded()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The local response, if any.
    pub fn response(&self) -> Option<&LocalResponse> {
        match self {
            Outcome::Responded(r) => Some(r),
            _ => None,
        }
    }

    /// The single pending callout, if paused on exactly one.
    pub fn call(&self) -> Option<&HttpCall> {
        match self {
            Outcome::Paused(calls) if calls.len() == 1 => calls.first(),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Stream {
    request_headers: Headers,
    response_headers: Headers,
    local_response: Option<LocalResponse>,
    continued: bool,
    closed: bool,
}

/// A metric defined by the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Name.
    pub name: String,
    /// 0 counter, 1 gauge, 2 histogram.
    pub kind: u32,
    /// Value.
    pub value: i64,
}

/// Everything the host keeps for one VM.
pub struct HostState {
    now_ns: u64,
    vm_config: Vec<u8>,
    plugin_config: Vec<u8>,
    effective: u32,
    streams: HashMap<u32, Stream>,
    call_response_headers: Headers,
    call_response_trailers: Headers,
    call_response_body: Vec<u8>,
    calls: Vec<HttpCall>,
    next_token: u32,
    known_clusters: Option<Vec<String>>,
    shared: SharedStore,
    properties: HashMap<Vec<u8>, Vec<u8>>,
    metrics: Vec<Metric>,
    logs: Vec<(u32, String)>,
    stdout: Vec<u8>,
    random_state: u64,
}

fn memory(caller: &mut Caller<'_, HostState>) -> Result<Memory> {
    caller
        .get_export("memory")
        .and_then(Extern::into_memory)
        .ok_or_else(|| wasmtime::format_err!("module exports no memory"))
}

fn read(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<Vec<u8>> {
    let m = memory(caller)?;
    let mut buf = vec![0u8; len as u32 as usize];
    m.read(&*caller, ptr as u32 as usize, &mut buf)?;
    Ok(buf)
}

fn read_str(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<String> {
    Ok(String::from_utf8_lossy(&read(caller, ptr, len)?).into_owned())
}

fn write(caller: &mut Caller<'_, HostState>, ptr: i32, bytes: &[u8]) -> Result<()> {
    let m = memory(caller)?;
    m.write(&mut *caller, ptr as u32 as usize, bytes)?;
    Ok(())
}

fn write_u32(caller: &mut Caller<'_, HostState>, ptr: i32, v: u32) -> Result<()> {
    write(caller, ptr, &v.to_le_bytes())
}

/// Copies `bytes` into memory the module allocates, and stores pointer and
/// size at `ret_ptr` and `ret_size`.
fn return_bytes(
    caller: &mut Caller<'_, HostState>,
    bytes: &[u8],
    ret_ptr: i32,
    ret_size: i32,
) -> Result<()> {
    let alloc = caller
        .get_export("proxy_on_memory_allocate")
        .and_then(Extern::into_func)
        .ok_or_else(|| wasmtime::format_err!("module exports no proxy_on_memory_allocate"))?;
    let alloc = alloc.typed::<i32, i32>(&*caller)?;
    let len = i32::try_from(bytes.len())?;
    let ptr = alloc.call(&mut *caller, len)?;
    write(caller, ptr, bytes)?;
    write_u32(caller, ret_ptr, ptr as u32)?;
    write_u32(caller, ret_size, len as u32)
}

/// The ABI's map serialisation.
pub fn serialize_map(map: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (k, v) in map {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in map {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Reads the ABI's map serialisation; `None` when malformed.
pub fn deserialize_map(bytes: &[u8]) -> Option<Headers> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let word = |at: usize| -> Option<usize> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(b) as usize)
    };
    let n = word(0)?;
    let mut p = 4usize.checked_add(n.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(n.min(1024));
    for i in 0..n {
        let (ks, vs) = (word(4 + i * 8)?, word(8 + i * 8)?);
        let k = bytes.get(p..p + ks)?;
        p += ks + 1;
        let v = bytes.get(p..p + vs)?;
        p += vs + 1;
        out.push((String::from_utf8_lossy(k).to_ascii_lowercase(), v.to_vec()));
    }
    Some(out)
}

impl HostState {
    fn map_mut(&mut self, map_type: i32) -> Option<&mut Headers> {
        match map_type {
            MAP_REQUEST_HEADERS => self
                .streams
                .get_mut(&self.effective)
                .map(|s| &mut s.request_headers),
            MAP_RESPONSE_HEADERS => self
                .streams
                .get_mut(&self.effective)
                .map(|s| &mut s.response_headers),
            MAP_CALL_RESPONSE_HEADERS => Some(&mut self.call_response_headers),
            MAP_CALL_RESPONSE_TRAILERS => Some(&mut self.call_response_trailers),
            _ => None,
        }
    }

    fn metric_mut(&mut self, id: i32) -> Option<&mut Metric> {
        let idx = usize::try_from(id).ok()?.checked_sub(1)?;
        self.metrics.get_mut(idx)
    }
}

fn define_env(linker: &mut Linker<HostState>) -> Result<Vec<&'static str>> {
    let mut defined = Vec::new();
    macro_rules! host_fn {
        ($name:literal, $f:expr) => {{
            linker.func_wrap("env", $name, $f)?;
            defined.push($name);
        }};
    }

    host_fn!("proxy_log", |mut c: Caller<'_, HostState>,
                           lvl: i32,
                           p: i32,
                           n: i32|
     -> Result<i32> {
        let msg = read_str(&mut c, p, n)?;
        eprintln!("[wasm log {lvl}] {msg}");
        c.data_mut().logs.push((lvl as u32, msg));
        Ok(status::OK)
    });
    host_fn!("proxy_get_log_level", |mut c: Caller<'_, HostState>,
                                     ret: i32|
     -> Result<i32> {
        write_u32(&mut c, ret, level::TRACE)?;
        Ok(status::OK)
    });
    host_fn!("proxy_get_current_time_nanoseconds", |mut c: Caller<
        '_,
        HostState,
    >,
                                                    ret: i32|
     -> Result<i32> {
        let now = c.data().now_ns;
        write(&mut c, ret, &now.to_le_bytes())?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_tick_period_milliseconds", |_c: Caller<
        '_,
        HostState,
    >,
                                                    _p: i32|
     -> i32 {
        status::OK
    });
    host_fn!("proxy_get_buffer_bytes", |mut c: Caller<'_, HostState>,
                                        ty: i32,
                                        start: i32,
                                        max: i32,
                                        ret_p: i32,
                                        ret_n: i32|
     -> Result<i32> {
        let data = match ty {
            BUFFER_VM_CONFIGURATION => c.data().vm_config.clone(),
            BUFFER_PLUGIN_CONFIGURATION => c.data().plugin_config.clone(),
            BUFFER_CALL_RESPONSE_BODY => c.data().call_response_body.clone(),
            _ => return Ok(status::NOT_FOUND),
        };
        let start = (start as u32 as usize).min(data.len());
        let end = start.saturating_add(max as u32 as usize).min(data.len());
        let slice = &data[start..end];
        if slice.is_empty() {
            return Ok(status::NOT_FOUND);
        }
        return_bytes(&mut c, slice, ret_p, ret_n)?;
        Ok(status::OK)
    });
    host_fn!("proxy_get_header_map_pairs", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            ret_p: i32,
                                            ret_n: i32|
     -> Result<i32> {
        let map = c
            .data_mut()
            .map_mut(ty)
            .map(|m| m.clone())
            .unwrap_or_default();
        let bytes = serialize_map(&map);
        return_bytes(&mut c, &bytes, ret_p, ret_n)?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_header_map_pairs", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            p: i32,
                                            n: i32|
     -> Result<i32> {
        let bytes = read(&mut c, p, n)?;
        let Some(new) = deserialize_map(&bytes) else {
            return Ok(status::BAD_ARGUMENT);
        };
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                *m = new;
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_get_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            kp: i32,
                                            kn: i32,
                                            ret_p: i32,
                                            ret_n: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let value = c.data_mut().map_mut(ty).and_then(|m| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&key))
                .map(|(_, v)| v.clone())
        });
        match value {
            Some(v) => {
                return_bytes(&mut c, &v, ret_p, ret_n)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_remove_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                               ty: i32,
                                               kp: i32,
                                               kn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        if let Some(m) = c.data_mut().map_mut(ty) {
            m.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
        }
        Ok(status::OK)
    });
    host_fn!("proxy_replace_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                                ty: i32,
                                                kp: i32,
                                                kn: i32,
                                                vp: i32,
                                                vn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?.to_ascii_lowercase();
        let value = read(&mut c, vp, vn)?;
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                m.retain(|(k, _)| *k != key);
                m.push((key, value));
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_add_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            kp: i32,
                                            kn: i32,
                                            vp: i32,
                                            vn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?.to_ascii_lowercase();
        let value = read(&mut c, vp, vn)?;
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                m.push((key, value));
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_get_property", |mut c: Caller<'_, HostState>,
                                    pp: i32,
                                    pn: i32,
                                    ret_p: i32,
                                    ret_n: i32|
     -> Result<i32> {
        let path = read(&mut c, pp, pn)?;
        match c.data().properties.get(&path).cloned() {
            Some(v) => {
                return_bytes(&mut c, &v, ret_p, ret_n)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_set_property", |mut c: Caller<'_, HostState>,
                                    pp: i32,
                                    pn: i32,
                                    vp: i32,
                                    vn: i32|
     -> Result<i32> {
        let path = read(&mut c, pp, pn)?;
        let value = read(&mut c, vp, vn)?;
        c.data_mut().properties.insert(path, value);
        Ok(status::OK)
    });
    host_fn!("proxy_get_shared_data", |mut c: Caller<'_, HostState>,
                                       kp: i32,
                                       kn: i32,
                                       ret_p: i32,
                                       ret_n: i32,
                                       ret_cas: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let shared = c.data().shared.clone();
        let entry = lock(&shared).get(&key);
        match entry {
            Some(e) => {
                return_bytes(&mut c, &e.value, ret_p, ret_n)?;
                write_u32(&mut c, ret_cas, e.cas)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_set_shared_data", |mut c: Caller<'_, HostState>,
                                       kp: i32,
                                       kn: i32,
                                       vp: i32,
                                       vn: i32,
                                       cas: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let value = read(&mut c, vp, vn)?;
        let shared = c.data().shared.clone();
        let st = lock(&shared).set(&key, &value, cas as u32);
        Ok(st)
    });
    host_fn!("proxy_continue_stream", |mut c: Caller<'_, HostState>,
                                       _ty: i32|
     -> i32 {
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.continued = true;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_close_stream", |mut c: Caller<'_, HostState>,
                                    _ty: i32|
     -> i32 {
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.closed = true;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_send_local_response", |mut c: Caller<
        '_,
        HostState,
    >,
                                           code: i32,
                                           dp: i32,
                                           dn: i32,
                                           bp: i32,
                                           bn: i32,
                                           hp: i32,
                                           hn: i32,
                                           grpc: i32|
     -> Result<i32> {
        let details = read_str(&mut c, dp, dn)?;
        let body = read(&mut c, bp, bn)?;
        let raw = read(&mut c, hp, hn)?;
        let Some(headers) = deserialize_map(&raw) else {
            return Ok(status::BAD_ARGUMENT);
        };
        let response = LocalResponse {
            status: code as u32,
            details,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
            body,
            grpc_status: grpc,
        };
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.local_response = Some(response);
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_http_call", |mut c: Caller<'_, HostState>,
                                 up: i32,
                                 un: i32,
                                 hp: i32,
                                 hn: i32,
                                 bp: i32,
                                 bn: i32,
                                 tp: i32,
                                 tn: i32,
                                 timeout: i32,
                                 ret_token: i32|
     -> Result<i32> {
        let upstream = read_str(&mut c, up, un)?;
        let raw = read(&mut c, hp, hn)?;
        let body = read(&mut c, bp, bn)?;
        let _trailers = read(&mut c, tp, tn)?;
        let Some(headers) = deserialize_map(&raw) else {
            return Ok(status::BAD_ARGUMENT);
        };
        if let Some(known) = &c.data().known_clusters {
            if !known.contains(&upstream) {
                return Ok(status::BAD_ARGUMENT);
            }
        }
        let token = {
            let st = c.data_mut();
            st.next_token += 1;
            st.next_token
        };
        let call = HttpCall {
            context_id: c.data().effective,
            token,
            upstream,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
            body,
            timeout_ms: timeout as u32,
        };
        c.data_mut().calls.push(call);
        write_u32(&mut c, ret_token, token)?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_effective_context", |mut c: Caller<
        '_,
        HostState,
    >,
                                             id: i32|
     -> i32 {
        c.data_mut().effective = id as u32;
        status::OK
    });
    host_fn!("proxy_done", |_c: Caller<'_, HostState>| -> i32 {
        status::OK
    });
    host_fn!("proxy_define_metric", |mut c: Caller<'_, HostState>,
                                     kind: i32,
                                     np: i32,
                                     nn: i32,
                                     ret_id: i32|
     -> Result<i32> {
        if !(0..=2).contains(&kind) {
            return Ok(status::BAD_ARGUMENT);
        }
        let name = read_str(&mut c, np, nn)?;
        let st = c.data_mut();
        let id = match st.metrics.iter().position(|m| m.name == name) {
            Some(i) => i + 1,
            None => {
                st.metrics.push(Metric {
                    name,
                    kind: kind as u32,
                    value: 0,
                });
                st.metrics.len()
            }
        };
        write_u32(&mut c, ret_id, id as u32)?;
        Ok(status::OK)
    });
    host_fn!("proxy_increment_metric", |mut c: Caller<'_, HostState>,
                                        id: i32,
                                        by: i64|
     -> i32 {
        match c.data_mut().metric_mut(id) {
            Some(m) if m.kind == 2 => status::BAD_ARGUMENT,
            Some(m) => {
                m.value = m.value.saturating_add(by);
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_record_metric", |mut c: Caller<'_, HostState>,
                                     id: i32,
                                     v: i64|
     -> i32 {
        match c.data_mut().metric_mut(id) {
            Some(m) => {
                m.value = v;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_get_metric", |mut c: Caller<'_, HostState>,
                                  id: i32,
                                  ret: i32|
     -> Result<i32> {
        let v = match c.data_mut().metric_mut(id) {
            Some(m) => m.value,
            None => return Ok(status::NOT_FOUND),
        };
        write(&mut c, ret, &(v as u64).to_le_bytes())?;
        Ok(status::OK)
    });
    Ok(defined)
}

fn define_wasi(linker: &mut Linker<HostState>) -> Result<Vec<&'static str>> {
    const M: &str = "wasi_snapshot_preview1";
    let mut defined = Vec::new();
    macro_rules! wasi {
        ($name:literal, $f:expr) => {{
            linker.func_wrap(M, $name, $f)?;
            defined.push($name);
        }};
    }
    wasi!("fd_write", |mut c: Caller<'_, HostState>,
                       _fd: i32,
                       iovs: i32,
                       n: i32,
                       ret: i32|
     -> Result<i32> {
        let mut total = 0u32;
        for i in 0..n {
            let iov = read(&mut c, iovs + i * 8, 8)?;
            let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
            let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
            let bytes = read(&mut c, ptr as i32, len as i32)?;
            c.data_mut().stdout.extend_from_slice(&bytes);
            total += len;
        }
        write_u32(&mut c, ret, total)?;
        Ok(0)
    });
    wasi!("random_get", |mut c: Caller<'_, HostState>,
                         p: i32,
                         n: i32|
     -> Result<i32> {
        let mut bytes = vec![0u8; n as u32 as usize];
        for b in &mut bytes {
            let st = c.data_mut();
            st.random_state = st
                .random_state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (st.random_state >> 33) as u8;
        }
        write(&mut c, p, &bytes)?;
        Ok(0)
    });
    wasi!("clock_time_get", |mut c: Caller<'_, HostState>,
                             _id: i32,
                             _prec: i64,
                             ret: i32|
     -> Result<i32> {
        let now = c.data().now_ns;
        write(&mut c, ret, &now.to_le_bytes())?;
        Ok(0)
    });
    for name in ["environ_sizes_get", "args_sizes_get"] {
        linker.func_wrap(
            M,
            name,
            |mut c: Caller<'_, HostState>, a: i32, b: i32| -> Result<i32> {
                write_u32(&mut c, a, 0)?;
                write_u32(&mut c, b, 0)?;
                Ok(0)
            },
        )?;
        defined.push(name);
    }
    for name in ["environ_get", "args_get"] {
        linker.func_wrap(
            M,
            name,
            |_c: Caller<'_, HostState>, _a: i32, _b: i32| -> i32 { 0 },
        )?;
        defined.push(name);
    }
    wasi!("proc_exit", |_c: Caller<'_, HostState>,
                        code: i32|
     -> Result<()> {
        wasmtime::bail!("proc_exit({code})")
    });
    Ok(defined)
}

/// Options of a new plugin.
#[derive(Clone, Default)]
pub struct PluginOptions {
    /// Shared data, to share with other plugins (workers); fresh if `None`.
    pub shared: Option<SharedStore>,
    /// Clusters `proxy_http_call` accepts; any if `None`.
    pub known_clusters: Option<Vec<String>>,
    /// Initial clock, Unix seconds.
    pub now_secs: u64,
    /// VM configuration.
    pub vm_config: Vec<u8>,
}

/// One VM running the filter, with its root context.
pub struct Plugin {
    store: Store<HostState>,
    instance: Instance,
    root_id: u32,
    next_id: u32,
}

impl Plugin {
    /// Instantiates the module, runs `_initialize`, creates the root
    /// context and starts the VM (not yet configured).
    pub fn start(module: &FilterModule, opts: PluginOptions) -> Result<Plugin> {
        let mut linker = Linker::new(&module.engine);
        let mut defined: Vec<String> = define_env(&mut linker)?
            .into_iter()
            .map(|n| format!("env.{n}"))
            .collect();
        defined.extend(
            define_wasi(&mut linker)?
                .into_iter()
                .map(|n| format!("wasi_snapshot_preview1.{n}")),
        );
        for import in module.module.imports() {
            let full = format!("{}.{}", import.module(), import.name());
            if defined.contains(&full) {
                continue;
            }
            let ExternType::Func(ty) = import.ty() else {
                wasmtime::bail!("import {full} is not a function");
            };
            let code = if import.module() == "env" {
                status::UNIMPLEMENTED
            } else {
                WASI_ENOSYS
            };
            let results: Vec<ValType> = ty.results().collect();
            let name = full.clone();
            linker.func_new(
                import.module(),
                import.name(),
                ty,
                move |mut c, _params, out| {
                    c.data_mut().logs.push((
                        level::CRITICAL,
                        format!("host: unimplemented import {name} called"),
                    ));
                    if let (Some(slot), Some(ValType::I32)) = (out.first_mut(), results.first()) {
                        *slot = Val::I32(code);
                    }
                    Ok(())
                },
            )?;
            defined.push(full);
        }
        let state = HostState {
            now_ns: opts.now_secs.saturating_mul(1_000_000_000),
            vm_config: opts.vm_config,
            plugin_config: Vec::new(),
            effective: 0,
            streams: HashMap::new(),
            call_response_headers: Vec::new(),
            call_response_trailers: Vec::new(),
            call_response_body: Vec::new(),
            calls: Vec::new(),
            next_token: 0,
            known_clusters: opts.known_clusters,
            shared: opts.shared.unwrap_or_default(),
            properties: HashMap::new(),
            metrics: Vec::new(),
            logs: Vec::new(),
            stdout: Vec::new(),
            random_state: 0x5eed,
        };
        let mut store = Store::new(&module.engine, state);
        let instance = linker.instantiate(&mut store, &module.module)?;
        if let Some(init) = instance.get_func(&mut store, "_initialize") {
            init.typed::<(), ()>(&store)?.call(&mut store, ())?;
        }
        let mut plugin = Plugin {
            store,
            instance,
            root_id: 1,
            next_id: 2,
        };
        plugin.store.data_mut().effective = plugin.root_id;
        plugin.call_void2("proxy_on_context_create", plugin.root_id as i32, 0)?;
        let size = plugin.store.data().vm_config.len() as i32;
        let ok = plugin
            .instance
            .get_typed_func::<(i32, i32), i32>(&mut plugin.store, "proxy_on_vm_start")?
            .call(&mut plugin.store, (plugin.root_id as i32, size))?;
        if ok == 0 {
            wasmtime::bail!("proxy_on_vm_start returned false");
        }
        Ok(plugin)
    }

    /// Starts a VM and configures it; `Ok(None)` when the configuration is
    /// refused (`proxy_on_configure` returned false).
    pub fn with_config(module: &FilterModule, opts: PluginOptions, config: &str) -> Result<Plugin> {
        let mut p = Plugin::start(module, opts)?;
        if !p.configure(config)? {
            wasmtime::bail!("configuration refused: {:?}", p.logs());
        }
        Ok(p)
    }

    fn call_void2(&mut self, name: &str, a: i32, b: i32) -> Result<()> {
        self.instance
            .get_typed_func::<(i32, i32), ()>(&mut self.store, name)?
            .call(&mut self.store, (a, b))
    }

    /// Calls `proxy_on_configure` with `config`; its answer.
    pub fn configure(&mut self, config: &str) -> Result<bool> {
        self.store.data_mut().plugin_config = config.as_bytes().to_vec();
        self.store.data_mut().effective = self.root_id;
        let ok = self
            .instance
            .get_typed_func::<(i32, i32), i32>(&mut self.store, "proxy_on_configure")?
            .call(&mut self.store, (self.root_id as i32, config.len() as i32))?;
        Ok(ok != 0)
    }

    /// Sets the clock, Unix seconds.
    pub fn set_time_secs(&mut self, secs: u64) {
        self.store.data_mut().now_ns = secs.saturating_mul(1_000_000_000);
    }

    /// Sets the clock, Unix milliseconds.
    pub fn set_time_ms(&mut self, ms: u64) {
        self.store.data_mut().now_ns = ms.saturating_mul(1_000_000);
    }

    /// The clock, Unix milliseconds.
    pub fn time_ms(&self) -> u64 {
        self.store.data().now_ns / 1_000_000
    }

    /// Sets a property (path parts joined by NUL, as the ABI serialises them).
    pub fn set_property(&mut self, path: &[&str], value: &[u8]) {
        self.store
            .data_mut()
            .properties
            .insert(path.join("\0").into_bytes(), value.to_vec());
    }

    /// A property, as set by the host or the module.
    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.store
            .data()
            .properties
            .get(path.join("\0").as_bytes())
            .cloned()
    }

    /// Log lines so far, `(level, message)`.
    pub fn logs(&self) -> Vec<(u32, String)> {
        self.store.data().logs.clone()
    }

    /// What the module wrote to stdout/stderr through WASI.
    pub fn stdout(&self) -> Vec<u8> {
        self.store.data().stdout.clone()
    }

    /// Value of metric `name`, if defined.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.store
            .data()
            .metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Every metric.
    pub fn metrics(&self) -> Vec<Metric> {
        self.store.data().metrics.clone()
    }

    /// The shared data of this VM.
    pub fn shared(&self) -> SharedStore {
        self.store.data().shared.clone()
    }

    /// Callouts not answered yet.
    pub fn pending_calls(&self) -> Vec<HttpCall> {
        self.store.data().calls.clone()
    }

    /// Sends a request's headers through the filter (`proxy_on_context_create`
    /// then `proxy_on_request_headers`). Header names are lower-cased.
    pub fn request(&mut self, headers: &[(&str, &str)]) -> Result<(u32, Outcome)> {
        let id = self.next_id;
        self.next_id += 1;
        let stream = Stream {
            request_headers: headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
                .collect(),
            ..Stream::default()
        };
        let n = stream.request_headers.len() as i32;
        self.store.data_mut().streams.insert(id, stream);
        self.store.data_mut().effective = self.root_id;
        self.call_void2("proxy_on_context_create", id as i32, self.root_id as i32)?;
        self.store.data_mut().effective = id;
        let action = self
            .instance
            .get_typed_func::<(i32, i32, i32), i32>(&mut self.store, "proxy_on_request_headers")?
            .call(&mut self.store, (id as i32, n, 1))?;
        let outcome = self.outcome(id, action == 0)?;
        Ok((id, outcome))
    }

    /// Answers callout `call` with `status` (`None`: no response at all, as
    /// on a timeout or connection failure), `headers` and `body`.
    pub fn answer(
        &mut self,
        call: &HttpCall,
        status: Option<u16>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Outcome> {
        let pos = self
            .store
            .data()
            .calls
            .iter()
            .position(|c| c.token == call.token)
            .ok_or_else(|| wasmtime::format_err!("no pending call with token {}", call.token))?;
        self.store.data_mut().calls.remove(pos);
        let mut response_headers: Headers = Vec::new();
        if let Some(s) = status {
            response_headers.push((":status".into(), s.to_string().into_bytes()));
            for (k, v) in headers {
                response_headers.push((k.to_ascii_lowercase(), v.as_bytes().to_vec()));
            }
        }
        let n_headers = response_headers.len() as i32;
        let body = if status.is_some() {
            body.to_vec()
        } else {
            Vec::new()
        };
        let n_body = body.len() as i32;
        {
            let st = self.store.data_mut();
            st.call_response_headers = response_headers;
            st.call_response_body = body;
            st.call_response_trailers = Vec::new();
            st.effective = self.root_id;
        }
        self.instance
            .get_typed_func::<(i32, i32, i32, i32, i32), ()>(
                &mut self.store,
                "proxy_on_http_call_response",
            )?
            .call(
                &mut self.store,
                (
                    call.context_id as i32,
                    call.token as i32,
                    n_headers,
                    n_body,
                    0,
                ),
            )?;
        {
            let st = self.store.data_mut();
            st.call_response_headers.clear();
            st.call_response_body.clear();
        }
        self.outcome(call.context_id, false)
    }

    fn outcome(&mut self, id: u32, continued_by_action: bool) -> Result<Outcome> {
        let st = self.store.data_mut();
        let calls: Vec<HttpCall> = st
            .calls
            .iter()
            .filter(|c| c.context_id == id)
            .cloned()
            .collect();
        let Some(stream) = st.streams.get_mut(&id) else {
            wasmtime::bail!("stream {id} vanished");
        };
        let outcome = if let Some(r) = stream.local_response.take() {
            Outcome::Responded(r)
        } else if stream.closed {
            Outcome::Reset
        } else if continued_by_action || stream.continued {
            Outcome::Continued(
                stream
                    .request_headers
                    .iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
            )
        } else {
            Outcome::Paused(calls)
        };
        if !matches!(outcome, Outcome::Paused(_)) {
            self.finish(id)?;
        }
        Ok(outcome)
    }

    /// Ends a stream: `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`,
    /// each only if the module exports it, as Envoy does (a module built
    /// without them is not called; one that exports them with another
    /// signature is an error).
    fn finish(&mut self, id: u32) -> Result<()> {
        self.store.data_mut().effective = id;
        if let Some(f) = self.instance.get_func(&mut self.store, "proxy_on_done") {
            f.typed::<i32, i32>(&self.store)?
                .call(&mut self.store, id as i32)?;
        }
        for name in ["proxy_on_log", "proxy_on_delete"] {
            if let Some(f) = self.instance.get_func(&mut self.store, name) {
                f.typed::<i32, ()>(&self.store)?
                    .call(&mut self.store, id as i32)?;
            }
        }
        self.store.data_mut().streams.remove(&id);
        self.store.data_mut().effective = self.root_id;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_round_trip() {
        let m: Headers = vec![
            (":path".into(), b"/".to_vec()),
            ("x".into(), Vec::new()),
            ("y".into(), b"\xffz".to_vec()),
        ];
        assert_eq!(deserialize_map(&serialize_map(&m)), Some(m));
        assert_eq!(deserialize_map(&[1, 0, 0, 0, 9, 9]), None);
        assert_eq!(deserialize_map(&[]), Some(Vec::new()));
    }

    #[test]
    fn shared_data_cas() {
        let mut d = SharedData::default();
        assert_eq!(d.set("k", b"a", 0), status::OK);
        let e = d.get("k").expect("entry");
        assert_eq!(d.set("k", b"b", e.cas), status::OK);
        assert_eq!(d.set("k", b"c", e.cas), status::CAS_MISMATCH);
        let e = d.get("k").expect("entry");
        assert_eq!(e.value, b"b");
        d.interfere_after_next_read("k");
        let e = d.get("k").expect("entry");
        assert_eq!(d.set("k", b"d", e.cas), status::CAS_MISMATCH);
        assert_eq!(d.cas_mismatches, 2);
    }

    /// A module with the callbacks a request needs, each doing nothing;
    /// with `optional`, also `proxy_on_done`, `proxy_on_log` and
    /// `proxy_on_delete`, each adding one to the exported global `ended`.
    fn minimal_filter(optional: bool) -> Vec<u8> {
        use wasm_encoder::{
            CodeSection, ConstExpr, ExportKind, ExportSection, Function, FunctionSection,
            GlobalSection, GlobalType, Instruction as I, MemorySection, MemoryType, Module,
            TypeSection, ValType as T,
        };
        let mut types = TypeSection::new();
        types.ty().function([], []); // 0: proxy_abi_version_0_2_1
        types.ty().function([T::I32, T::I32], []); // 1: proxy_on_context_create
        types.ty().function([T::I32, T::I32], [T::I32]); // 2: vm_start, configure
        types.ty().function([T::I32, T::I32, T::I32], [T::I32]); // 3: request_headers
        types.ty().function([T::I32], [T::I32]); // 4: proxy_on_done
        types.ty().function([T::I32], []); // 5: proxy_on_log, proxy_on_delete
        let mut names = vec![
            ("proxy_abi_version_0_2_1", 0),
            ("proxy_on_context_create", 1),
            ("proxy_on_vm_start", 2),
            ("proxy_on_configure", 2),
            ("proxy_on_request_headers", 3),
        ];
        if optional {
            names.extend([
                ("proxy_on_done", 4),
                ("proxy_on_log", 5),
                ("proxy_on_delete", 5),
            ]);
        }
        let mut funcs = FunctionSection::new();
        let mut code = CodeSection::new();
        let mut exports = ExportSection::new();
        for (i, (name, ty)) in names.iter().enumerate() {
            funcs.function(*ty);
            exports.export(name, ExportKind::Func, i as u32);
            let mut f = Function::new([]);
            // Types 4 and 5 are the optional callbacks only: each counts its call.
            if matches!(ty, 4 | 5) {
                f.instruction(&I::GlobalGet(0))
                    .instruction(&I::I32Const(1))
                    .instruction(&I::I32Add)
                    .instruction(&I::GlobalSet(0));
            }
            match ty {
                2 | 4 => {
                    f.instruction(&I::I32Const(1));
                }
                3 => {
                    f.instruction(&I::I32Const(0)); // Continue
                }
                _ => {}
            }
            f.instruction(&I::End);
            code.function(&f);
        }
        let mut memory = MemorySection::new();
        memory.memory(MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        exports.export("memory", ExportKind::Memory, 0);
        let mut globals = GlobalSection::new();
        globals.global(
            GlobalType {
                val_type: T::I32,
                mutable: true,
                shared: false,
            },
            &ConstExpr::i32_const(0),
        );
        exports.export("ended", ExportKind::Global, 0);
        let mut module = Module::new();
        module
            .section(&types)
            .section(&funcs)
            .section(&memory)
            .section(&globals)
            .section(&exports)
            .section(&code);
        module.finish()
    }

    /// Envoy calls the end-of-stream callbacks only when a module exports
    /// them; so does this host.
    #[test]
    fn end_of_stream_callbacks_are_called_only_when_exported() {
        let dir = std::env::temp_dir().join(format!("pwh-optional-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for optional in [false, true] {
            let path = dir.join(format!("filter-{optional}.wasm"));
            std::fs::write(&path, minimal_filter(optional)).unwrap();
            let module = FilterModule::load(&path).unwrap();
            let mut plugin = Plugin::with_config(&module, PluginOptions::default(), "{}").unwrap();
            for _ in 0..2 {
                let (_, outcome) = plugin.request(&[(":path", "/")]).unwrap();
                assert!(
                    matches!(outcome, Outcome::Continued(_)),
                    "optional={optional}"
                );
            }
            let ended = plugin
                .instance
                .get_global(&mut plugin.store, "ended")
                .unwrap()
                .get(&mut plugin.store)
                .i32()
                .unwrap();
            // Two streams, three callbacks each when exported.
            assert_eq!(ended, if optional { 6 } else { 0 });
            assert!(
                plugin.store.data().streams.is_empty(),
                "streams end either way"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
