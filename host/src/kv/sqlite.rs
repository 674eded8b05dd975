//! [`SqliteKv`]: the key-value store in one SQLite file, read on pooled
//! connections through [`crate::readcache`], written by the thread of
//! [`super::writer`]; its guarantees are in [`super`]'s documentation.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::writer::{
    checkpoint_loop, in_savepoint, restart_busy, wal_size_limit, writer_loop, Job, JobQueue,
    WriteJob, WriterGate, RESTART_FRAMES,
};
use super::{
    sqlite_get_many_pairs, sqlite_swap, KvBackend, KvEmulation, KvError, KvFuture, KvResult,
    WriteOp,
};
use crate::readcache::{Lookup, ReadCache};
use crate::walsync::WalSync;

/// Key-value store in one SQLite file.
pub struct SqliteKv {
    path: std::path::PathBuf,
    pool: Mutex<Vec<Connection>>,
    /// The writer thread's queue (see [`writer_loop`]).
    jobs: Arc<JobQueue>,
    /// Commits and syncs of the write-ahead log.
    pub(crate) sync: Arc<WalSync>,
    emulation: KvEmulation,
    /// `journal_size_limit` of the connections it opens.
    wal_limit: i64,
    /// Values read, kept while nobody changes them ([`crate::readcache`]);
    /// `None` when the log's index could not be mapped.
    cache: Option<Arc<ReadCache>>,
    /// The writer thread, then the checkpointer: joined in that order when
    /// the store is dropped.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for SqliteKv {
    /// Closes the store before it returns: the readers' connections, then
    /// the writer's once it has committed every write queued before, then
    /// the checkpointer's, and last the read cache's (with the fields).
    /// SQLite's last close copies the log into the database file and
    /// removes it, so the file is whole on its own and the same path opens
    /// again at once. (Until 2026-12-06 the two threads went on alone: a
    /// store opened on the same path moments later could meet their
    /// connections still open, and failed its open about once in a hundred
    /// times with `disk I/O error`.) A caller that needs the writes durable
    /// waits for [`KvBackend::durable`] first, as the host does when it
    /// stops.
    fn drop(&mut self) {
        if let Ok(pool) = self.pool.get_mut() {
            pool.clear();
        }
        // The writer ends once its queue is closed and empty; the
        // checkpointer once the writer has gone with its nudges.
        self.jobs.close();
        for thread in self.threads.drain(..) {
            // The checkpointer may be parked until its next checkpoint is
            // due (`checkpoint_loop`): woken, it finds the writer gone.
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// The store's table: a rowid table, with `key` in its own unique index.
/// Until 2026-12-06 it was `WITHOUT ROWID` (one b-tree ordered by `key`),
/// which SQLite recommends only for rows much smaller than a page: its
/// interior pages hold whole rows, and a row above about 1,000 bytes (a
/// user record is 1.5 KiB) spills into an overflow page. Here the index holds
/// only the keys and the table's pages up to about 4,000 bytes of a row, so a
/// lookup and a write touch fewer pages (docs/decisions.md, "A rowid table").
pub(super) const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS kv (
     key   TEXT PRIMARY KEY NOT NULL,
     value BLOB NOT NULL
 );";

/// Moves the records of a store whose table is still `WITHOUT ROWID` into
/// [`SQLITE_TABLE`]'s form, all in one transaction (so a crash leaves the
/// old table whole, and a second host opening the file at the same moment
/// waits and finds the work done); how many it moved, `None` when the table
/// has the current form. The old table's pages go to SQLite's free list and
/// are reused by later writes (`VACUUM` with the host stopped gives them
/// back to the file system).
fn from_without_rowid(conn: &Connection) -> KvResult<Option<usize>> {
    let without_rowid = |c: &Connection| {
        c.query_row(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = 'kv'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map(|wr| wr == Some(1))
    };
    if !without_rowid(conn)? {
        return Ok(None);
    }
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    if !without_rowid(&tx)? {
        return Ok(None);
    }
    tx.execute_batch("ALTER TABLE kv RENAME TO kv_without_rowid;")?;
    tx.execute_batch(SQLITE_TABLE)?;
    tx.execute_batch(
        "INSERT INTO kv (key, value) SELECT key, value FROM kv_without_rowid ORDER BY key;
         DROP TABLE kv_without_rowid;",
    )?;
    let moved = tx.query_row("SELECT count(*) FROM kv", [], |r| r.get::<_, i64>(0))?;
    tx.commit()?;
    Ok(Some(usize::try_from(moved).unwrap_or(0)))
}

/// The SQLite store's file in `DATA_DIR` (beside the log store's folder,
/// [`crate::logkv::LOG_DIR`]).
pub const SQLITE_FILE: &str = "kv.sqlite3";

/// Connections kept open for reuse.
const SQLITE_POOL: usize = 8;

/// Upsert of one value (shared by `set`, `set_many` and the counters, and
/// the read cache's tests).
pub(crate) const SQLITE_UPSERT: &str = "INSERT INTO kv(key, value) VALUES (?1, ?2)
     ON CONFLICT(key) DO UPDATE SET value = excluded.value";

impl SqliteKv {
    /// Opens (creating if needed) `dir/kv.sqlite3`.
    pub fn open_dir(dir: &Path, emulation: KvEmulation) -> KvResult<SqliteKv> {
        std::fs::create_dir_all(dir)
            .map_err(|e| KvError(format!("cannot create {}: {e}", dir.display())))?;
        Self::open(&dir.join(SQLITE_FILE), emulation)
    }

    /// Opens (creating if needed) the database file `path`. With
    /// [`KvEmulation::Spin402`], counters stored as `INTEGER`s (by
    /// `KV_EMULATE=none` or an older host) become Spin's 8-byte blobs.
    pub fn open(path: &Path, emulation: KvEmulation) -> KvResult<SqliteKv> {
        Self::open_with(path, emulation, RESTART_FRAMES)
    }

    /// [`SqliteKv::open`], starting the log over at `restart_frames`
    /// (the tests' smaller logs).
    fn open_with(path: &Path, emulation: KvEmulation, restart_frames: i64) -> KvResult<SqliteKv> {
        let jobs = Arc::new(JobQueue::default());
        let queue = jobs.clone();
        let wal_limit = wal_size_limit(restart_frames);
        let conn = connect(path, wal_limit)?;
        conn.execute_batch(SQLITE_TABLE)?;
        if let Some(n) = from_without_rowid(&conn)? {
            eprintln!(
                "tfa-host: {}: moved {n} records into a rowid table (the table was WITHOUT ROWID)",
                path.display()
            );
        }
        if emulation == KvEmulation::Spin402 {
            let n = le_counters(&conn)?;
            if n > 0 {
                eprintln!(
                    "tfa-host: {}: converted {n} counters to Spin's 8-byte form",
                    path.display()
                );
            }
        }
        let writer = connect(path, wal_limit)?;
        // The write-ahead log exists while a connection is open, and the
        // writer's stays open as long as the store: this handle of it is
        // the sync thread's. What the open wrote, and the log's directory
        // entry, are made durable now.
        let wal_path = wal_path(path);
        let wal = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&wal_path)
            .map_err(|e| KvError(format!("sqlite: cannot open {}: {e}", wal_path.display())))?;
        let synced = wal.sync_data().and_then(|()| match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
            _ => Ok(()),
        });
        synced.map_err(|e| KvError(format!("sqlite: cannot sync {}: {e}", wal_path.display())))?;
        let sync = WalSync::start(wal)?;
        // The log's index exists now: the connections above have read the
        // database in WAL mode.
        let cache = ReadCache::open(connect(path, wal_limit)?).map(Arc::new);
        if cache.is_none() {
            eprintln!(
                "tfa-host: {}: the log's index cannot be mapped; reads are not cached",
                path.display()
            );
        }
        let writer_cache = cache.clone();
        let checkpointer = connect(path, wal_limit)?;
        checkpointer.busy_handler(Some(restart_busy))?;
        let (nudge, nudges) = std::sync::mpsc::sync_channel(1);
        let gate = WriterGate::default();
        let writer_gate = gate.clone();
        let checkpointing = std::thread::Builder::new()
            .name("tfa-kv-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpointer, nudges, gate, restart_frames))
            .map_err(|e| KvError(format!("sqlite: cannot start the checkpointer: {e}")))?;
        let writing = std::thread::Builder::new()
            .name("tfa-kv-writer".into())
            .spawn({
                let sync = sync.clone();
                move || writer_loop(writer, queue, sync, nudge, writer_gate, writer_cache)
            })
            .map_err(|e| KvError(format!("sqlite: cannot start the writer thread: {e}")))?;
        Ok(SqliteKv {
            path: path.to_path_buf(),
            pool: Mutex::new(vec![conn]),
            jobs,
            sync,
            emulation,
            wal_limit,
            cache,
            threads: vec![writing, checkpointing],
        })
    }

    /// Reads answered from the read cache so far ([`crate::readcache`]);
    /// 0 when reads are not cached.
    pub fn cache_hits(&self) -> u64 {
        self.cache.as_deref().map_or(0, ReadCache::hits)
    }

    fn take(&self) -> KvResult<Connection> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        match pooled {
            Some(c) => Ok(c),
            None => connect(&self.path, self.wal_limit),
        }
    }

    fn put_back(&self, conn: Connection) {
        if let Ok(mut p) = self.pool.lock() {
            if p.len() < SQLITE_POOL {
                p.push(conn);
            }
        }
    }

    /// Runs the write `f`, which may change `keys`, in the writer thread's
    /// next batch and waits until
    /// the batch is committed (not yet durable: see [`KvBackend::durable`])
    /// or has failed.
    fn write<T: Send + 'static>(
        &self,
        keys: Vec<String>,
        f: impl FnOnce(&Connection) -> KvResult<T> + Send + 'static,
    ) -> KvResult<T> {
        let (reply, answer) = std::sync::mpsc::sync_channel::<KvResult<T>>(1);
        let job: WriteJob = Box::new(move |conn| {
            let out = match conn {
                Some(c) => in_savepoint(c, f),
                None => Err(KvError("sqlite: the write did not run".into())),
            };
            Box::new(move |committed: KvResult<()>| {
                let _ = reply.send(committed.and(out));
            })
        });
        self.jobs
            .push(Job::Write(job, keys))
            .map_err(|_| KvError("sqlite: the writer thread has stopped".into()))?;
        answer
            .recv()
            .unwrap_or_else(|_| Err(KvError("sqlite: the writer thread has stopped".into())))
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> KvResult<T>) -> KvResult<T> {
        let conn = self.take()?;
        let out = f(&conn);
        // A connection that failed is dropped rather than reused.
        if out.is_ok() {
            self.put_back(conn);
        }
        out
    }
}

/// A connection to the database `path`: WAL mode (readers never block the
/// writer), `synchronous=NORMAL` (commits do not sync; the sync thread
/// does, see [`crate::walsync`]), the log cut back to `wal_limit` bytes
/// when it starts over.
fn connect(path: &Path, wal_limit: i64) -> KvResult<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(KvError(format!("sqlite: journal_mode is {mode}, not wal")));
    }
    // Checkpoints are the checkpointer thread's, never a commit's.
    conn.execute_batch(&format!(
        "PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0; PRAGMA journal_size_limit={wal_limit};"
    ))?;
    Ok(conn)
}

/// SQLite's write-ahead log beside the database `path`.
fn wal_path(path: &Path) -> std::path::PathBuf {
    sibling(path, "-wal")
}

/// The file beside the database `path` whose name adds `suffix`.
fn sibling(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Rewrites every `INTEGER` counter as an 8-byte little-endian blob, in one
/// write transaction; returns how many there were.
fn le_counters(conn: &Connection) -> KvResult<usize> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let counters: Vec<(String, i64)> = tx
        .prepare("SELECT key, value FROM kv WHERE typeof(value) = 'integer'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    {
        let mut st = tx.prepare_cached(SQLITE_UPSERT)?;
        for (k, n) in &counters {
            st.execute(params![k, &n.to_le_bytes()[..]])?;
        }
    }
    tx.commit()?;
    Ok(counters.len())
}

/// A stored value as bytes: blobs as they are, `INTEGER` counters as
/// decimal digits (this host's own form) or, emulating Spin 4.0.2, as the
/// 8 little-endian bytes Spin stores.
fn value_bytes(v: ValueRef<'_>, emulation: KvEmulation) -> KvResult<Vec<u8>> {
    match v {
        ValueRef::Blob(b) => Ok(b.to_vec()),
        ValueRef::Text(t) => Ok(t.to_vec()),
        ValueRef::Integer(i) if emulation == KvEmulation::Spin402 => Ok(i.to_le_bytes().to_vec()),
        ValueRef::Integer(i) => Ok(i.to_string().into_bytes()),
        ValueRef::Real(r) => Ok(r.to_string().into_bytes()),
        ValueRef::Null => Err(KvError("sqlite: NULL value".into())),
    }
}

impl KvBackend for SqliteKv {
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>> {
        let ticket = match self.cache.as_deref().map(|c| c.lookup(key)) {
            Some(Lookup::Hit(value)) => return Ok(Some(value)),
            Some(Lookup::Miss(ticket)) => Some(ticket),
            Some(Lookup::Bypass) | None => None,
        };
        let value = self.read(key, |v| value_bytes(v, self.emulation))?;
        if let (Some(ticket), Some(v), Some(c)) = (ticket, &value, self.cache.as_deref()) {
            c.fill(key, v, ticket);
        }
        Ok(value)
    }

    fn set(&self, key: &str, value: &[u8]) -> KvResult<()> {
        let (key, value) = (key.to_string(), value.to_vec());
        self.write(vec![key.clone()], move |c| upsert(c, &key, &value))
    }

    fn delete(&self, key: &str) -> KvResult<()> {
        if !self.exists(key)? {
            return Ok(());
        }
        let key = key.to_string();
        self.write(vec![key.clone()], move |c| remove(c, &key))
    }

    fn exists(&self, key: &str) -> KvResult<bool> {
        self.with(|c| {
            Ok(c.prepare_cached("SELECT 1 FROM kv WHERE key = ?1")?
                .query_row(params![key], |_| Ok(()))
                .optional()?
                .is_some())
        })
    }

    fn keys(&self) -> KvResult<Vec<String>> {
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT key FROM kv ORDER BY key")?;
            let keys = st.query_map([], |r| r.get::<_, String>(0))?;
            Ok(keys.collect::<Result<Vec<_>, _>>()?)
        })
    }

    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        // One read transaction, so the values are from one snapshot.
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let mut out = Vec::with_capacity(keys.len());
            {
                let mut st = tx.prepare_cached("SELECT value FROM kv WHERE key = ?1")?;
                for k in keys {
                    let mut rows = st.query(params![k])?;
                    out.push(match rows.next()? {
                        Some(row) => Some(value_bytes(row.get_ref(0)?, self.emulation)?),
                        None => None,
                    });
                }
            }
            tx.commit()?;
            Ok(out)
        })
    }

    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        // One savepoint of the batch: all or nothing.
        let pairs = pairs.to_vec();
        let keys = pairs.iter().map(|(k, _)| k.clone()).collect();
        self.write(keys, move |c| {
            let mut st = c.prepare_cached(SQLITE_UPSERT)?;
            for (k, v) in &pairs {
                st.execute(params![k, v])?;
            }
            Ok(())
        })
    }

    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        let keys = keys.to_vec();
        self.write(keys.clone(), move |c| {
            let mut st = c.prepare_cached("DELETE FROM kv WHERE key = ?1")?;
            for k in &keys {
                st.execute(params![k])?;
            }
            Ok(())
        })
    }

    fn increment(&self, key: &str, delta: i64) -> KvResult<i64> {
        if delta == 0 {
            return self.read_counter(key);
        }
        if self.emulation == KvEmulation::Spin402 {
            return self.increment_le(key, delta);
        }
        let key = key.to_string();
        self.write(vec![key.clone()], move |c| increment_int_in(c, &key, delta))
    }

    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool> {
        // One conditional UPDATE: a missing key matches no row, so it fails.
        let (key, expected, new) = (key.to_string(), expected.to_vec(), new.to_vec());
        self.write(vec![key.clone()], move |c| {
            let n = c
                .prepare_cached("UPDATE kv SET value = ?3 WHERE key = ?1 AND value = ?2")?
                .execute(params![key, expected, new])?;
            Ok(n == 1)
        })
    }

    fn emulation(&self) -> KvEmulation {
        self.emulation
    }

    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        sqlite_get_many_pairs(self, keys)
    }

    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        sqlite_swap(self, key, seen, new)
    }

    fn describe(&self) -> String {
        format!("sqlite {}", self.path.display())
    }

    fn inline_reads(&self) -> bool {
        true
    }

    fn durable(&self) -> Option<KvFuture<()>> {
        match self.sync.pending() {
            Ok(false) => return None,
            Ok(true) => {}
            Err(e) => return Some(Box::pin(std::future::ready(Err(e)))),
        }
        let (waiter, answer) = tokio::sync::oneshot::channel();
        Some(self.enqueue(Job::Durable(waiter), answer))
    }

    fn write_async(&self, op: WriteOp) -> Result<KvFuture<i64>, WriteOp> {
        match &op {
            WriteOp::Increment(key, 0) => {
                let read = self.read_counter(key);
                return Ok(Box::pin(std::future::ready(read)));
            }
            // Deleting a key that is not there changes nothing: no write,
            // no wait for a commit (see `SqliteKv::read_counter` for why a
            // read of the committed state is linearisable).
            WriteOp::Delete(key) => match self.exists(key) {
                Ok(true) => {}
                done => return Ok(Box::pin(std::future::ready(done.map(|_| 0)))),
            },
            _ => {}
        }
        let emulation = self.emulation;
        let keys = match &op {
            WriteOp::Set(k, _) | WriteOp::Delete(k) | WriteOp::Increment(k, _) => vec![k.clone()],
        };
        let (reply, answer) = tokio::sync::oneshot::channel::<KvResult<i64>>();
        let job: WriteJob = Box::new(move |conn| {
            let out = match conn {
                Some(c) => in_savepoint(c, |c| match op {
                    WriteOp::Set(k, v) => upsert(c, &k, &v).map(|()| 0),
                    WriteOp::Delete(k) => remove(c, &k).map(|()| 0),
                    WriteOp::Increment(k, d) => match emulation {
                        KvEmulation::Spin402 => increment_le_in(c, &k, d),
                        KvEmulation::None => increment_int_in(c, &k, d),
                    },
                }),
                None => Err(KvError("sqlite: the write did not run".into())),
            };
            Box::new(move |committed: KvResult<()>| {
                let _ = reply.send(committed.and(out));
            })
        });
        Ok(self.enqueue(Job::Write(job, keys), answer))
    }
}

impl SqliteKv {
    /// Queues `job` for the writer thread; the future resolves to what
    /// `answer` receives.
    fn enqueue<T: Send + 'static>(
        &self,
        job: Job,
        answer: tokio::sync::oneshot::Receiver<KvResult<T>>,
    ) -> KvFuture<T> {
        let stopped = || KvError("sqlite: the store's writer or sync thread has stopped".into());
        let sent = self.jobs.push(job).map_err(|_| stopped());
        Box::pin(async move {
            sent?;
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }
}

impl SqliteKv {
    /// `increment(key, 0)`, which is how the service reads a counter: a
    /// read of the committed value on a reader connection (0 when missing,
    /// and the key is not created), so it neither queues behind the writer
    /// nor waits for a commit. Spin writes the unchanged counter
    /// back (creating a zero counter for a missing key); only a `get` of
    /// that key could tell, and the service reads counters only through
    /// `increment`. Values that are not counters are refused exactly as
    /// the increment would refuse them. Linearisable: a concurrent
    /// increment not yet committed has not returned to its caller either.
    fn read_counter(&self, key: &str) -> KvResult<i64> {
        let counter = self.read(key, |v| match (self.emulation, v) {
            (KvEmulation::Spin402, v) => le_counter(v).ok_or_else(|| not_le_counter(key)),
            (KvEmulation::None, ValueRef::Integer(n)) => Ok(n),
            (KvEmulation::None, _) => Err(not_int_counter(key)),
        })?;
        Ok(counter.unwrap_or(0))
    }

    /// The committed value at `key` on a reader connection, handed to
    /// `f`; `None` when the key is missing.
    fn read<T>(
        &self,
        key: &str,
        f: impl FnOnce(ValueRef<'_>) -> KvResult<T>,
    ) -> KvResult<Option<T>> {
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT value FROM kv WHERE key = ?1")?;
            let mut rows = st.query(params![key])?;
            match rows.next()? {
                Some(row) => f(row.get_ref(0)?).map(Some),
                None => Ok(None),
            }
        })
    }

    /// Spin 4.0.2's counter: read the 8-byte little-endian blob (0 when
    /// missing), add with wrap-around (Spin's release build), write it back.
    /// An `INTEGER` (this host's own form) is read too and rewritten.
    fn increment_le(&self, key: &str, delta: i64) -> KvResult<i64> {
        let key = key.to_string();
        self.write(vec![key.clone()], move |c| increment_le_in(c, &key, delta))
    }
}

/// Upsert of one value, inside the writer's transaction.
pub(super) fn upsert(c: &Connection, key: &str, value: &[u8]) -> KvResult<()> {
    c.prepare_cached(SQLITE_UPSERT)?
        .execute(params![key, value])?;
    Ok(())
}

/// Removal of one key, inside the writer's transaction.
fn remove(c: &Connection, key: &str) -> KvResult<()> {
    c.prepare_cached("DELETE FROM kv WHERE key = ?1")?
        .execute(params![key])?;
    Ok(())
}

/// This host's own counter (`INTEGER`): one statement, which SQLite runs
/// atomically under its write lock, so concurrent increments (threads or
/// processes) never lose an update.
fn increment_int_in(c: &Connection, key: &str, delta: i64) -> KvResult<i64> {
    let v: Option<i64> = c
        .prepare_cached(
            "INSERT INTO kv(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = value + ?2
                 WHERE typeof(value) = 'integer'
             RETURNING value",
        )?
        .query_row(params![key, delta], |r| r.get(0))
        .optional()?;
    v.ok_or_else(|| not_int_counter(key))
}

/// A stored value as Spin 4.0.2's counter: an 8-byte little-endian blob, or
/// an `INTEGER` (this host's own form, from older data directories).
fn le_counter(v: ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Blob(b) => <[u8; 8]>::try_from(b).ok().map(i64::from_le_bytes),
        ValueRef::Integer(i) => Some(i),
        _ => None,
    }
}

fn not_int_counter(key: &str) -> KvError {
    KvError(format!("sqlite: value at {key:?} is not a counter"))
}

fn not_le_counter(key: &str) -> KvError {
    KvError(format!(
        "sqlite: value at {key:?} is not an 8-byte counter (Spin 4.0.2 would panic here)"
    ))
}

/// Spin 4.0.2's counter: read the 8-byte little-endian blob (0 when
/// missing), add with wrap-around (Spin's release build), write it back.
/// An `INTEGER` (this host's own form) is read too and rewritten. The
/// writer's batch began IMMEDIATE: the write lock is held, so the read and
/// the write are one atomic step, across processes too.
fn increment_le_in(tx: &Connection, key: &str, delta: i64) -> KvResult<i64> {
    let old: Option<Option<i64>> = tx
        .prepare_cached("SELECT value FROM kv WHERE key = ?1")?
        .query_row(params![key], |r| Ok(le_counter(r.get_ref(0)?)))
        .optional()?;
    let new = match old {
        None => delta,
        Some(Some(n)) => n.wrapping_add(delta),
        Some(None) => return Err(not_le_counter(key)),
    };
    tx.prepare_cached(SQLITE_UPSERT)?
        .execute(params![key, &new.to_le_bytes()[..]])?;
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::CHECKPOINT_EVERY;
    use std::sync::atomic::Ordering;

    /// The `journal_size_limit` of a connection the store opens.
    fn journal_size_limit(kv: &SqliteKv) -> i64 {
        let conn = kv.take().unwrap();
        conn.query_row("PRAGMA journal_size_limit", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn the_checkpointer_keeps_the_write_ahead_log_small() {
        let dir = std::env::temp_dir().join(format!("tfa-kv-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let kv = SqliteKv::open_dir(&dir, KvEmulation::Spin402).unwrap();
        let wal = dir.join("kv.sqlite3-wal");
        // 10 rounds of 40 commits, each rewriting a 3,000-byte value: at
        // least 1.6 MB of log frames, all of it in the log if nothing
        // checkpointed (no connection checkpoints on commit).
        for round in 0..10u8 {
            for i in 0..40 {
                kv.set(&format!("k{}", i % 20), &[round; 3000]).unwrap();
            }
            std::thread::sleep(CHECKPOINT_EVERY * 4);
        }
        // The checkpointer copied each round into the database file, so
        // the writer started the log over: it holds one or two rounds
        // (about 0.3 MB here; 1.8 MB without the checkpointer). The bound
        // leaves room for a checkpointer a few rounds late on a busy machine.
        let size = std::fs::metadata(&wal).unwrap().len();
        assert!(size < 1_200_000, "the write-ahead log grew to {size} bytes");
        assert_eq!(kv.get("k7").unwrap().as_deref(), Some(&[9u8; 3000][..]));
        let db = std::fs::metadata(dir.join("kv.sqlite3")).unwrap().len();
        assert!(db > 20 * 3000, "the database file holds {db} bytes");
        assert_eq!(journal_size_limit(&kv), wal_size_limit(RESTART_FRAMES));
        drop(kv);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_starts_over_under_sustained_writes() {
        let dir = std::env::temp_dir().join(format!("tfa-kv-restart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A quarter of RESTART_FRAMES, so that a few restarts fit in a
        // test's worth of writes.
        const RESTART: i64 = 4096;
        let kv = SqliteKv::open_with(&dir.join("kv.sqlite3"), KvEmulation::Spin402, RESTART);
        let kv = Arc::new(kv.unwrap());
        let wal = dir.join("kv.sqlite3-wal");
        // Readers as a busy server has them: at every moment one of two
        // holds a snapshot, each for about a millisecond. A passive
        // checkpoint copies no frame past the older one's, so the log is
        // never wholly copied while writes go on, and SQLite never starts
        // it over by itself.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relay = {
            let (db, stop) = (dir.join("kv.sqlite3"), stop.clone());
            std::thread::spawn(move || {
                let limit = wal_size_limit(RESTART);
                let conns = [connect(&db, limit).unwrap(), connect(&db, limit).unwrap()];
                let begin = |c: &Connection| {
                    c.execute_batch("BEGIN").unwrap();
                    c.query_row("SELECT count(*) FROM kv WHERE key = 'k7'", [], |_| Ok(()))
                        .unwrap();
                };
                begin(&conns[0]);
                let mut i = 1;
                while !stop.load(Ordering::Relaxed) {
                    begin(&conns[i]);
                    conns[1 - i].execute_batch("COMMIT").unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                    i = 1 - i;
                }
                conns[1 - i].execute_batch("COMMIT").unwrap();
            })
        };
        // Writes without a pause (256 in flight), so the writer thread is
        // never idle: 30,000 writes of 4,000-byte values (a leaf cell and an
        // overflow page each) left 154 MB of log in the file when tried
        // without the restart; starting over at RESTART (4,096 frames), the file
        // stays near its wal_size_limit (27 to 30 MB in three runs).
        let mut in_flight = std::collections::VecDeque::new();
        for i in 0..30_000u32 {
            if in_flight.len() == 256 {
                let done: KvFuture<i64> = in_flight.pop_front().unwrap();
                done.await.unwrap();
            }
            let op = WriteOp::Set(format!("k{}", i % 2_000), vec![i as u8; 4_000]);
            match kv.write_async(op) {
                Ok(f) => in_flight.push_back(f),
                Err(_) => panic!("the SQLite store queues its writes itself"),
            }
        }
        for done in in_flight {
            done.await.unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        relay.join().unwrap();
        let size = std::fs::metadata(&wal).unwrap().len();
        assert_eq!(journal_size_limit(&kv), wal_size_limit(RESTART));
        assert!(
            size <= 2 * wal_size_limit(RESTART) as u64,
            "the write-ahead log grew to {size} bytes"
        );
        assert_eq!(
            kv.get("k1999").unwrap().as_deref(),
            Some(&[(29_999u32 as u8); 4_000][..])
        );
        drop(kv);
        let _ = std::fs::remove_dir_all(dir);
    }
}
