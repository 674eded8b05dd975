//! [`FailingKv`]: a test hook (`TFA_FAIL_STORE_AFTER`) that makes store
//! operations fail, so that the tests can show that a store failing at any
//! point leaves the service's records whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{KvBackend, KvEmulation, KvError, KvFuture, KvResult};

/// Test hook: makes store operations fail from the `after`-th one on (1 =
/// the first), for `count` operations (all of them when `None`).
pub struct FailingKv {
    inner: Arc<dyn KvBackend>,
    after: u64,
    count: Option<u64>,
    seen: AtomicU64,
}

impl FailingKv {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn KvBackend>, after: u64, count: Option<u64>) -> FailingKv {
        FailingKv {
            inner,
            after: after.max(1),
            count,
            seen: AtomicU64::new(0),
        }
    }

    fn check(&self) -> KvResult<()> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        let failing = n >= self.after && self.count.is_none_or(|c| n < self.after + c);
        if failing {
            Err(KvError(format!(
                "injected failure (TFA_FAIL_STORE_AFTER): operation {n}"
            )))
        } else {
            Ok(())
        }
    }
}

impl KvBackend for FailingKv {
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>> {
        self.check()?;
        self.inner.get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> KvResult<()> {
        self.check()?;
        self.inner.set(key, value)
    }
    fn delete(&self, key: &str) -> KvResult<()> {
        self.check()?;
        self.inner.delete(key)
    }
    fn exists(&self, key: &str) -> KvResult<bool> {
        self.check()?;
        self.inner.exists(key)
    }
    fn keys(&self) -> KvResult<Vec<String>> {
        self.check()?;
        self.inner.keys()
    }
    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        self.check()?;
        self.inner.get_many(keys)
    }
    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        self.check()?;
        self.inner.set_many(pairs)
    }
    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        self.check()?;
        self.inner.delete_many(keys)
    }
    fn increment(&self, key: &str, delta: i64) -> KvResult<i64> {
        self.check()?;
        self.inner.increment(key, delta)
    }
    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool> {
        self.check()?;
        self.inner.compare_and_swap(key, expected, new)
    }
    fn emulation(&self) -> KvEmulation {
        self.inner.emulation()
    }
    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        self.check()?;
        self.inner.get_many_pairs(keys)
    }
    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        self.check()?;
        self.inner.swap(key, seen, new)
    }
    fn durable(&self) -> Option<KvFuture<()>> {
        self.inner.durable()
    }
    fn connection_opened(&self) {
        self.inner.connection_opened()
    }
    fn connection_closed(&self) {
        self.inner.connection_closed()
    }
    fn describe(&self) -> String {
        format!(
            "{} (failing from operation {})",
            self.inner.describe(),
            self.after
        )
    }
}
