//! The key-value backends behind the component's store `default`.
//!
//! Both Spin's `fermyon:spin/key-value` and `wasi:keyvalue` (store, atomics,
//! batch) reach the same [`KvBackend`], so a counter written through one is
//! seen by the other, as in Spin.
//!
//! * [`SqliteKv`] (default): one file `kv.sqlite3` in `DATA_DIR`, WAL mode,
//!   one rowid table keyed by a unique index (`SQLITE_TABLE`; a store whose
//!   table is still `WITHOUT ROWID` is converted when it opens), a small
//!   pool of connections for reads (with a bounded cache of the
//!   values `get` read, which no write by anyone can leave stale:
//!   [`crate::readcache`]), and one writer thread that
//!   commits the writes waiting for it together (one transaction for every
//!   write that arrived while the previous one was committing; each write in
//!   its own savepoint, so one failing write does not undo the others).
//!   Commits do not sync (`synchronous=NORMAL`): an acknowledged write
//!   survives SIGKILL and power loss because the host answers no request
//!   that touched the store before one sync of the write-ahead log, shared
//!   by every request waiting for it, has covered it
//!   ([`KvBackend::durable`], [`crate::walsync`]). Checkpoints are not a
//!   commit's: a checkpointer thread makes them on its own connection
//!   ([`CHECKPOINT_EVERY`]), and starts the log over, holding the writer
//!   between two commits, once it is [`RESTART_FRAMES`] long.
//! * [`crate::logkv::LogKv`] (`KV_ENGINE=log`): every record in memory,
//!   every write appended to a checksummed log synced at the same barrier;
//!   one host per data directory. [`open_store`] picks the engine.
//! * [`RedisKv`] (`KV_URL=redis://…`): several hosts can share one store.
//!   Keys are used as they are, like Spin's own Redis store.
//!
//! # `KV_EMULATE`: as capable as Spin 4.0.2, no more
//!
//! The local host must not be more capable than the platform we ship for:
//! code that works here only because this host is kinder than Spin would
//! fail in production. So by default ([`KvEmulation::Spin402`],
//! `KV_EMULATE=spin-4.0.2`) both backends copy Spin 4.0.2's stores
//! (`crates/key-value-spin` and `crates/key-value-redis`, and the dispatch in
//! `crates/factor-key-value`), quirks included:
//!
//! * SQLite (Spin's default store): a counter is an 8-byte little-endian
//!   `i64` blob, so `get` on it returns those 8 bytes; `increment` on a value
//!   that is not 8 bytes long is an error (Spin panics); overflow wraps.
//!   `swap` on a handle whose `current` saw no value (or was never called)
//!   writes unconditionally; otherwise it is `UPDATE … WHERE value = old`.
//!   `get-many` answers only the keys that exist, each once, sorted.
//!   Counters an older host stored as SQLite `INTEGER`s are converted to the
//!   8-byte form when the store opens (and `increment` still reads both), so
//!   existing data directories keep working; they are not converted back
//!   for `KV_EMULATE=none`.
//! * Redis: `swap` always ends in `cas-failed` (Spin's `UNWATCH <key>` is
//!   refused by Redis), although its write has happened unless the key
//!   changed since `current` (Spin's `WATCH`; approximated here by comparing
//!   values). `get-many` sends `KEYS k1 k2 …`, which Redis refuses for two
//!   keys or more and treats as one pattern for one key (an odd number of
//!   matches makes Spin panic: here an error). `set-many` is one `MSET`,
//!   `delete-many` one `DEL`. Counters are `INCRBY` strings of digits.
//! * SQLite, two writes that change nothing are reads here: `increment(key,
//!   0)` (how the service reads a counter) answers the committed value and
//!   creates nothing, where Spin writes the counter back (see
//!   `SqliteKv::read_counter`); `delete` of a key that is not there returns
//!   without a transaction.
//! * Both: a `cas` handle reads the store in `current`, not when it is made;
//!   `list-keys` with a cursor is an error; a label other than `default` is
//!   `access-denied`; empty batches never reach the store.
//!
//! `KV_EMULATE=none` ([`KvEmulation::None`]) keeps this host's own, more
//! capable semantics, for comparison:
//! * `increment` is one atomic server-side operation. A missing key counts as
//!   0. The counter is kept as an integer (SQLite `INTEGER`, Redis string of
//!   digits); `get` on a counter returns its decimal digits. Incrementing a
//!   key that holds something else is an error.
//! * `compare_and_swap(key, expected, new)` writes only if the key exists and
//!   currently holds exactly `expected`, in one atomic operation. **On a
//!   missing key it fails** (returns `false`). A `cas` handle reads its value
//!   when it is made.
//! * `get-many` answers every asked key in order (`None` when missing).
//!
//! Every failure is a [`KvError`]; the host hands it to the component as a
//! key-value error (the service answers 503), never a trap.
//!
//! # Files
//!
//! This file holds the interface ([`KvBackend`]), the semantics shared by
//! the stores in `DATA_DIR`, and the choice of store ([`open_store`]);
//! `sqlite.rs` the SQLite store, `writer.rs` its writer thread and
//! checkpointer, `redis.rs` the Redis store, `failing.rs` the test hook
//! [`FailingKv`].

use std::fmt;
use std::path::Path;
use std::sync::Arc;

mod failing;
mod redis;
mod sqlite;
mod writer;

pub use failing::FailingKv;
use redis::redact;
pub use redis::{system_roots_and, RedisKv};
#[cfg(test)]
pub(crate) use sqlite::SQLITE_UPSERT;
pub use sqlite::{SqliteKv, SQLITE_FILE};
pub use writer::{CHECKPOINT_EVERY, RESTART_FRAMES};

/// The answer of [`KvBackend::write_async`] (the counter's new value for an
/// increment, 0 otherwise).
pub type KvFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = KvResult<T>> + Send>>;

/// A write for [`KvBackend::write_async`].
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// `set(key, value)`.
    Set(String, Vec<u8>),
    /// `delete(key)`.
    Delete(String),
    /// `increment(key, delta)`.
    Increment(String, i64),
}

/// A backend failure (detail for logs and for the component's error value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvError(pub String);

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KvError {}

impl From<rusqlite::Error> for KvError {
    fn from(e: rusqlite::Error) -> Self {
        KvError(format!("sqlite: {e}"))
    }
}

impl From<::redis::RedisError> for KvError {
    fn from(e: ::redis::RedisError) -> Self {
        KvError(format!("redis: {e}"))
    }
}

/// Result of a backend call.
pub type KvResult<T> = Result<T, KvError>;

/// Whose key-value semantics the backends follow (`KV_EMULATE`). See the
/// module documentation: the local host must not be more capable than the
/// platform we ship for, so the default copies Spin 4.0.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvEmulation {
    /// `spin-4.0.2` (default): exactly what Spin 4.0.2's SQLite and Redis
    /// stores do, their limits included.
    #[default]
    Spin402,
    /// `none`: this host's own, more capable semantics (for comparison).
    None,
}

impl KvEmulation {
    /// The setting's value for this mode.
    pub fn name(self) -> &'static str {
        match self {
            KvEmulation::Spin402 => "spin-4.0.2",
            KvEmulation::None => "none",
        }
    }

    /// Reads `KV_EMULATE` (unset or blank: the default).
    pub fn parse(value: Option<&str>) -> Result<KvEmulation, String> {
        match value.map(str::trim).unwrap_or("") {
            "" => Ok(KvEmulation::default()),
            "spin-4.0.2" => Ok(KvEmulation::Spin402),
            "none" => Ok(KvEmulation::None),
            other => Err(format!(
                "KV_EMULATE must be `spin-4.0.2` (the default: behave like Spin 4.0.2's \
                 key-value stores) or `none` (this host's own semantics), not `{other}`"
            )),
        }
    }
}

impl fmt::Display for KvEmulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A blocking key-value store shared by all requests. Call it from blocking
/// threads (the host uses `spawn_blocking`).
pub trait KvBackend: Send + Sync {
    /// The value at `key`.
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>>;
    /// Writes `value` at `key`.
    fn set(&self, key: &str, value: &[u8]) -> KvResult<()>;
    /// Removes `key` (missing is fine).
    fn delete(&self, key: &str) -> KvResult<()>;
    /// Whether `key` exists.
    fn exists(&self, key: &str) -> KvResult<bool> {
        Ok(self.get(key)?.is_some())
    }
    /// Every key, sorted.
    fn keys(&self) -> KvResult<Vec<String>>;
    /// The values of `keys`, in order.
    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Writes several values.
    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        pairs.iter().try_for_each(|(k, v)| self.set(k, v))
    }
    /// Removes several keys.
    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        keys.iter().try_for_each(|k| self.delete(k))
    }
    /// Atomically adds `delta` to the counter at `key` (missing = 0) and
    /// returns the new value.
    fn increment(&self, key: &str, delta: i64) -> KvResult<i64>;
    /// Atomically replaces `expected` by `new` at an existing `key`; `false`
    /// when the key is missing or holds something else.
    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool>;
    /// Whose semantics this backend follows.
    fn emulation(&self) -> KvEmulation;
    /// `wasi:keyvalue/batch` `get-many` as the component sees it. This
    /// host's own answer: every asked key, in order.
    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        Ok(keys.iter().cloned().zip(self.get_many(keys)?).collect())
    }
    /// `wasi:keyvalue/atomics` `swap` of a `cas` handle on `key`: `seen` is
    /// what its `current` read (`None`: it never read; `Some(None)`: the key
    /// was missing). `false` is `cas-failed`. This host's own rule: swap
    /// only a value that is still the one seen; a missing key never swaps.
    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        match seen {
            Some(Some(expected)) => self.compare_and_swap(key, expected, new),
            _ => Ok(false),
        }
    }
    /// A short name for logs.
    fn describe(&self) -> String;
    /// Whether `get` is cheap and never waits on anything but memory and
    /// the local disk (SQLite in WAL mode: a reader never waits for the
    /// writer), so the host may call it on its async threads instead of
    /// handing it to a blocking thread.
    fn inline_reads(&self) -> bool {
        false
    }
    /// `set`, `delete` or `increment` (`op`) without a blocking thread, for a
    /// backend that queues its writes itself; `Err(op)`: call the method on
    /// a blocking thread instead.
    fn write_async(&self, op: WriteOp) -> Result<KvFuture<i64>, WriteOp> {
        Err(op)
    }
    /// The barrier before a response: resolves once everything this process
    /// has written to the store so far is durable; `None` when it already
    /// is (or when the backend's writes are durable as they return, as with
    /// Redis, whose durability is its own configuration). The host awaits
    /// it before answering any request that used the store.
    fn durable(&self) -> Option<KvFuture<()>> {
        None
    }
    /// The host has accepted a client connection;
    /// [`KvBackend::connection_closed`] follows once it is closed. A hint
    /// for a backend that groups the requests waiting at
    /// [`KvBackend::durable`] (how many more may ask soon), never a
    /// condition of correctness; the default ignores it.
    fn connection_opened(&self) {}
    /// See [`KvBackend::connection_opened`].
    fn connection_closed(&self) {}
}

/// `get-many` as Spin 4.0.2's SQLite store answers it, for this host's
/// stores in `DATA_DIR` (SQLite and [`crate::logkv::LogKv`]): with
/// `KV_EMULATE=spin-4.0.2`, `SELECT key, value … WHERE key IN
/// rarray(:keys)`, which yields the keys that exist, each once, in key
/// order (one `get_many`, so from one snapshot); with `none`, every asked
/// key in order.
pub(crate) fn sqlite_get_many_pairs<B: KvBackend + ?Sized>(
    store: &B,
    keys: &[String],
) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
    if store.emulation() == KvEmulation::None {
        return Ok(keys.iter().cloned().zip(store.get_many(keys)?).collect());
    }
    let asked: Vec<String> = keys
        .iter()
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let values = store.get_many(&asked)?;
    Ok(asked
        .into_iter()
        .zip(values)
        .filter(|(_, v)| v.is_some())
        .collect())
}

/// `swap` as Spin 4.0.2's SQLite store does it, for this host's stores in
/// `DATA_DIR` (SQLite and [`crate::logkv::LogKv`]): a handle that saw a
/// value swaps only that value; one that saw none (or never read) writes
/// unconditionally (Spin's `None` branch) with `KV_EMULATE=spin-4.0.2`, and
/// never swaps with `none`.
pub(crate) fn sqlite_swap<B: KvBackend + ?Sized>(
    store: &B,
    key: &str,
    seen: Option<Option<&[u8]>>,
    new: &[u8],
) -> KvResult<bool> {
    match (store.emulation(), seen) {
        (_, Some(Some(expected))) => store.compare_and_swap(key, expected, new),
        (KvEmulation::Spin402, _) => store.set(key, new).map(|()| true),
        (KvEmulation::None, _) => Ok(false),
    }
}

/// Which store holds the data in `DATA_DIR` when `KV_URL` is unset
/// (`KV_ENGINE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvEngine {
    /// `sqlite` (default): [`SqliteKv`].
    #[default]
    Sqlite,
    /// `log`: [`crate::logkv::LogKv`], in memory with an append-only log.
    Log,
}

impl KvEngine {
    /// Reads `KV_ENGINE` (unset or blank: the default).
    pub fn parse(value: Option<&str>) -> Result<KvEngine, String> {
        match value.map(str::trim).unwrap_or("") {
            "" | "sqlite" => Ok(KvEngine::Sqlite),
            "log" => Ok(KvEngine::Log),
            other => Err(format!(
                "KV_ENGINE must be `sqlite` (the default: one SQLite file in DATA_DIR) or \
                 `log` (the store in memory, every write in an append-only log in DATA_DIR), \
                 not `{other}`"
            )),
        }
    }
}

/// [`open_backend_tls`] with the engine `KV_ENGINE` names for `DATA_DIR`.
/// A data directory holds one engine's data: opening it with the other
/// fails (it would start empty and hide the data it has).
pub fn open_store(
    kv_url: Option<&str>,
    data_dir: &Path,
    engine: KvEngine,
    emulation: KvEmulation,
    ca_file: Option<&Path>,
) -> KvResult<Arc<dyn KvBackend>> {
    let url = kv_url.map(str::trim).filter(|u| !u.is_empty());
    let sqlite = data_dir.join(SQLITE_FILE);
    let log = data_dir.join(crate::logkv::LOG_DIR);
    match (engine, url) {
        (KvEngine::Log, Some(_)) => Err(KvError(
            "KV_ENGINE=log keeps the store in DATA_DIR: it cannot be combined with KV_URL".into(),
        )),
        (KvEngine::Log, None) if sqlite.exists() => Err(KvError(format!(
            "KV_ENGINE=log, but {} holds a SQLite store (KV_ENGINE=sqlite): use that, or \
             another DATA_DIR",
            data_dir.display()
        ))),
        (KvEngine::Log, None) => Ok(Arc::new(crate::logkv::LogKv::open_dir(
            data_dir, emulation,
        )?)),
        (KvEngine::Sqlite, None) if log.exists() => Err(KvError(format!(
            "{} holds a log store (KV_ENGINE=log): set KV_ENGINE=log, or use another DATA_DIR",
            data_dir.display()
        ))),
        (KvEngine::Sqlite, _) => open_backend_tls(kv_url, data_dir, emulation, ca_file),
    }
}

/// Opens the backend the settings ask for: Redis when `kv_url` is a
/// `redis://`/`rediss://` URL, else SQLite in `data_dir`; with the default
/// semantics (Spin 4.0.2's, see [`KvEmulation`]).
pub fn open_backend(kv_url: Option<&str>, data_dir: &Path) -> KvResult<Arc<dyn KvBackend>> {
    open_backend_with(kv_url, data_dir, KvEmulation::default())
}

/// [`open_backend`] with the semantics `emulation` names (`KV_EMULATE`).
pub fn open_backend_with(
    kv_url: Option<&str>,
    data_dir: &Path,
    emulation: KvEmulation,
) -> KvResult<Arc<dyn KvBackend>> {
    open_backend_tls(kv_url, data_dir, emulation, None)
}

/// [`open_backend_with`] trusting the PEM CA certificates of `ca_file`
/// (`KV_CA_FILE`) besides the system's roots for `rediss://`.
pub fn open_backend_tls(
    kv_url: Option<&str>,
    data_dir: &Path,
    emulation: KvEmulation,
    ca_file: Option<&Path>,
) -> KvResult<Arc<dyn KvBackend>> {
    match kv_url.map(str::trim).filter(|u| !u.is_empty()) {
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
            Ok(Arc::new(RedisKv::open_tls(url, emulation, ca_file)?))
        }
        Some(url) => Err(KvError(format!(
            "KV_URL must be a redis:// or rediss:// URL (got {})",
            redact(url)
        ))),
        None => Ok(Arc::new(SqliteKv::open_dir(data_dir, emulation)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_emulate_parses() {
        assert_eq!(KvEmulation::parse(None), Ok(KvEmulation::Spin402));
        assert_eq!(KvEmulation::parse(Some(" ")), Ok(KvEmulation::Spin402));
        assert_eq!(
            KvEmulation::parse(Some("spin-4.0.2")),
            Ok(KvEmulation::Spin402)
        );
        assert_eq!(KvEmulation::parse(Some("none")), Ok(KvEmulation::None));
        for bad in ["spin", "Spin-4.0.2", "off", "4.0.2"] {
            let e = KvEmulation::parse(Some(bad)).unwrap_err();
            assert!(e.contains("KV_EMULATE") && e.contains(bad), "{e}");
        }
        for m in [KvEmulation::Spin402, KvEmulation::None] {
            assert_eq!(KvEmulation::parse(Some(m.name())), Ok(m));
        }
    }
}
