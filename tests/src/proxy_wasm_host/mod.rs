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

mod imports;
mod plugin;

pub use plugin::{Plugin, PluginOptions};

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
}
