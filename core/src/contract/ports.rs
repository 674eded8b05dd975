//! The ports through which a host lends `core` its I/O: a key-value store and
//! a source of random bytes. Time is not a port: it is the `now_ms` argument
//! of every call.
//!
//! The store contract is what every key-value backend of Spin implements
//! correctly (SQLite and Redis, Spin 3.x and 4.x), so that a Spin component
//! can implement it directly with Spin's key-value API and
//! `wasi:keyvalue/atomics` `increment`:
//!
//! * `get` / `set` / `delete` on byte values, one key at a time;
//! * `increment` is atomic and is the **only** way a counter's value is ever
//!   read (increment by 0 reads it); `get` on a counter only tells whether it
//!   exists (backends encode counters differently: digits on Redis, 8 bytes
//!   on Spin's SQLite). Counters and plain values never share a key.
//! * No compare-and-swap and no batch: Spin 4.0's Redis backend fails every
//!   compare-and-swap, runs it unisolated on a shared connection, and answers
//!   `get-many` with a pattern scan; its SQLite backend turns a swap of a
//!   missing key into an unconditional write. What must happen once is built
//!   on `increment` instead: unique names are claimed by the caller that gets
//!   1, and records change under [`crate::plumbing::lock`].
//! * `pause` lets a caller that waits for a lock back off; it does no I/O on
//!   the store.
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

/// A key-value store with atomic counters.
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
    /// Atomically adds `delta` to the counter at `key` (a missing counter is
    /// 0) and returns the new value.
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Called between two attempts to take a lock that another request
    /// holds (`attempt` counts from 1). A host may sleep a little, growing
    /// with `attempt`; the default returns at once.
    fn pause(&self, attempt: u32) {
        let _ = attempt;
    }
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
    fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        (**self).increment(key, delta)
    }
    fn pause(&self, attempt: u32) {
        (**self).pause(attempt)
    }
}
