//! The ports through which a host lends `core` its I/O: a key-value store and
//! a source of random bytes. Time is not a port: it is the `now_ms` argument
//! of every call.
//!
//! The store contract is the intersection of Spin's key-value API and
//! `wasi:keyvalue` (store, atomics, batch), so that a Spin component can
//! implement it directly:
//!
//! * `get` / `set` / `delete` / `get_many` on byte values;
//! * `increment` is atomic and is the **only** way a counter is ever read
//!   (increment by 0 reads it). Counters and plain values never share a key.
//! * `compare_and_swap` replaces an **existing** value atomically. Core never
//!   relies on it for a missing key: Spin's SQLite store turns that into an
//!   unconditional write. Unique names are claimed with `increment` instead
//!   (the caller that gets 1 owns the name).
//! * Core never lists keys.

use std::fmt;

/// The store could not be reached or failed. Surfaces as
/// 503 `Service unavailable`; the detail goes to the log only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store error: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// A key-value store with atomic counters and compare-and-swap.
///
/// Methods take `&self`: one store is shared by concurrent requests, and
/// implementations synchronise internally (or are backed by a server that
/// does).
pub trait Store {
    /// The value at `key`, if any.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes `value` at `key` unconditionally.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Removes `key`; removing a missing key is not an error.
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// The values of several keys, in the order asked.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// Atomically adds `delta` to the counter at `key` (a missing counter is
    /// 0) and returns the new value.
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Atomically replaces the value at `key` with `new` if it currently
    /// equals `old`. Returns `Ok(false)` when the value differs or the key is
    /// missing. Callers only use it on keys they know to exist.
    fn compare_and_swap(&self, key: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError>;
}

/// A cryptographically secure source of random bytes, provided by the host
/// (`wasi:random` in a component, the OS elsewhere, a seeded generator in
/// tests).
pub trait Rng {
    /// Fills `dest` with random bytes.
    fn fill(&mut self, dest: &mut [u8]);
}

/// Everything a call into the service borrows from its host for the length
/// of that call.
pub struct Env<'a> {
    /// The key-value store.
    pub store: &'a dyn Store,
    /// Random bytes.
    pub rng: &'a mut dyn Rng,
    /// Current Unix time in milliseconds, read by the host once per call.
    pub now_ms: u64,
}

impl Env<'_> {
    /// Current Unix time in whole seconds.
    pub fn now_secs(&self) -> u64 {
        self.now_ms / 1000
    }

    /// `N` random bytes.
    pub fn random<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.rng.fill(&mut b);
        b
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        (**self).set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key)
    }
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        (**self).get_many(keys)
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        (**self).increment(key, delta)
    }
    fn compare_and_swap(&self, key: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError> {
        (**self).compare_and_swap(key, old, new)
    }
}
