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

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::readcache::{Header, Lookup, ReadCache};
use crate::walsync::{Waiter, WalSync};

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

impl From<redis::RedisError> for KvError {
    fn from(e: redis::RedisError) -> Self {
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

// ------------------------------------------------------------------ SQLite

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

/// The writer thread's queue: jobs in arrival order, taken by the writer
/// a batch at a time. A job queued while the writer is busy costs its
/// sender a short lock and no system call: the writer is woken only when it
/// sleeps on an empty queue. (The standard library's channel, used until
/// 2026-12-07, put 39 % of the writer's context switches in its internal
/// lock, which every sender takes to wake a sleeping receiver.)
#[derive(Default)]
struct JobQueue {
    state: Mutex<QueueState>,
    ready: std::sync::Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: std::collections::VecDeque<Job>,
    /// No job is taken any more: the store is being dropped.
    closed: bool,
    /// The writer sleeps on `ready`.
    waiting: bool,
}

impl JobQueue {
    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`; `Err` when the queue is closed.
    fn push(&self, job: Job) -> Result<(), Job> {
        let mut st = self.state();
        if st.closed {
            return Err(job);
        }
        st.jobs.push_back(job);
        let wake = st.waiting;
        drop(st);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Moves up to `max` jobs into `into`, sleeping while the queue is
    /// empty; `false` once it is closed and empty.
    fn take(&self, max: usize, into: &mut Vec<Job>) -> bool {
        let mut st = self.state();
        while st.jobs.is_empty() {
            if st.closed {
                return false;
            }
            st.waiting = true;
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting = false;
        }
        let n = st.jobs.len().min(max);
        into.extend(st.jobs.drain(..n));
        true
    }

    /// Refuses further jobs; the writer takes those queued and ends.
    fn close(&self) {
        self.state().closed = true;
        self.ready.notify_one();
    }
}

/// Held by the writer thread: when it ends, however it ends, the queue is
/// closed and what is left in it dropped, so a writer that panicked leaves
/// no job waiting for an answer that cannot come and refuses the next ones
/// (as the standard library's channel did once its receiver had gone).
struct ClosedAtExit<'a>(&'a JobQueue);

impl Drop for ClosedAtExit<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.closed = true;
        let left = std::mem::take(&mut st.jobs);
        drop(st);
        drop(left);
    }
}

/// What the writer thread is asked to do.
enum Job {
    /// A write, committed with the others waiting, and the keys it may
    /// change.
    Write(WriteJob, Vec<String>),
    /// A barrier: handed to the sync thread once the commits before it have
    /// ended (step 3 of [`crate::walsync`]).
    Durable(Waiter),
}

/// What a write job hands back after running: called with the outcome of
/// the commit that holds it.
type Finish = Box<dyn FnOnce(KvResult<()>) + Send>;
/// One write: run inside the batch transaction (`Some`), or told that it
/// could not run (`None`: the batch could not begin).
type WriteJob = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

/// Writes committed together at most.
const MAX_BATCH: usize = 256;

/// The writer thread: takes every job that is waiting (up to
/// [`MAX_BATCH`]; it sleeps while there is none), runs the writes among
/// them in one `BEGIN IMMEDIATE` transaction (each in a savepoint), commits (no sync:
/// `synchronous=NORMAL`), answers each write, and then hands the barriers
/// among them to the sync thread. Ends when the store is dropped.
fn writer_loop(
    conn: Connection,
    jobs: Arc<JobQueue>,
    sync: Arc<WalSync>,
    checkpoints: std::sync::mpsc::SyncSender<()>,
    gate: WriterGate,
    cache: Option<Arc<ReadCache>>,
) {
    conn.wal_hook(Some(count_frames));
    let _closed = ClosedAtExit(&jobs);
    let mut taken = Vec::with_capacity(MAX_BATCH);
    while jobs.take(MAX_BATCH, &mut taken) {
        let (mut batch, mut keys, mut barriers) = (Vec::new(), Vec::new(), Vec::new());
        for job in taken.drain(..) {
            match job {
                Job::Write(w, k) => {
                    batch.push(w);
                    keys.extend(k);
                }
                Job::Durable(w) => barriers.push(w),
            }
        }
        if !batch.is_empty() {
            {
                let _committing = gate.lock().unwrap_or_else(|p| p.into_inner());
                commit_batch(&conn, batch, &keys, &sync, cache.as_deref());
            }
            // Full means a nudge is waiting already.
            let _ = checkpoints.try_send(());
        }
        if !barriers.is_empty() {
            sync.wait(barriers);
        }
    }
}

/// The checkpointer's pace: at most one checkpoint per this long while
/// writes go on. SQLite's own (`wal_autocheckpoint`, 1,000 pages) ran in the
/// committing connection, so on a busy store the writer thread spent a
/// checkpoint's copying and its two fsyncs (about 20 times a second under
/// `/2fa/verify` at concurrency 32) with every write waiting behind it.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// Frames of write-ahead log after which the checkpointer starts the log
/// over (64 MiB at SQLite's 4 KiB pages). Passive checkpoints alone never
/// do under sustained writes: the writer appends while they copy, so the
/// log is never wholly copied when the writer begins its next transaction,
/// which is the only moment SQLite starts it over. Measured on 2026-11-28
/// under `/2fa/verify` at concurrency 32 on disk: 1 GB of log in 40 s,
/// every append a newly allocated block for the file system.
///
/// Each restart holds the writer for a sync of the database file, which
/// takes every page the checkpoints copied since the last one: 44 to 70 ms
/// on this machine's disk (2026-11-29, same load, about 1.5 restarts a
/// second at 4,096 frames). At 16,384 frames the disk gave 9 % more
/// verifications a second (two hosts on the same disk, five alternating
/// runs; 8 % at 65,536); on tmpfs, where the sync costs nothing, no change
/// beyond the machine's noise. The price is the log's file: up to twice
/// this on disk (`wal_size_limit`).
pub const RESTART_FRAMES: i64 = 16384;

/// What the log file is cut back to when it starts over
/// (`journal_size_limit`), for a store that starts it over at
/// `restart_frames`: twice that many pages of SQLite's default 4 KiB
/// (128 MiB at [`RESTART_FRAMES`]), so the file is reused rather than cut
/// and regrown each time.
const fn wal_size_limit(restart_frames: i64) -> i64 {
    2 * restart_frames * 4096
}

/// How long after a restart that failed (a reader held an old snapshot for
/// longer than [`restart_busy`] waits) the checkpointer tries again.
const RESTART_RETRY: Duration = Duration::from_secs(1);

/// Held by the writer thread while it commits, and by the checkpointer while
/// it starts the log over, which needs the writer idle.
type WriterGate = Arc<Mutex<()>>;

/// The checkpointer thread: after a commit (a nudge from the writer), and no
/// sooner than [`CHECKPOINT_EVERY`] after its last checkpoint, copies what
/// the write-ahead log holds into the database file (`PASSIVE`: it never
/// waits for, nor blocks, the writer or a reader; SQLite syncs the log
/// before copying, and the database after copying the whole log). Once the
/// log holds `restart_frames` ([`RESTART_FRAMES`]), it closes the writer's
/// gate for a `RESTART` checkpoint: the few frames appended since the
/// passive one are copied, readers of old snapshots are waited for
/// ([`restart_busy`]), and the writer's next transaction writes from the
/// start of the log. Ends when the writer does.
fn checkpoint_loop(
    conn: Connection,
    nudges: std::sync::mpsc::Receiver<()>,
    gate: WriterGate,
    restart_frames: i64,
) {
    use std::sync::mpsc::TryRecvError;
    let mut last: Option<std::time::Instant> = None;
    let mut retry_at: Option<std::time::Instant> = None;
    while nudges.recv().is_ok() {
        if let Some(due) = last.map(|l| l + CHECKPOINT_EVERY) {
            // Parked, not waiting on the queue: a commit meanwhile leaves
            // its nudge queued instead of waking this thread (one wake-up
            // per commit was 16 context switches per login). The store's
            // drop unparks it once the writer has gone.
            while let Some(left) = due.checked_duration_since(crate::now()) {
                std::thread::park_timeout(left);
                if let Err(TryRecvError::Disconnected) = nudges.try_recv() {
                    return;
                }
            }
        }
        let log = checkpoint(&conn, "PASSIVE").map_or(0, |(_, log)| log);
        if log >= restart_frames && retry_at.is_none_or(|t| crate::now() >= t) {
            let restarted = {
                let _writer_idle = gate.lock().unwrap_or_else(|p| p.into_inner());
                checkpoint(&conn, "RESTART")
            };
            retry_at = match restarted {
                Some((false, _)) => None,
                Some((true, _)) | None => Some(crate::now() + RESTART_RETRY),
            };
        }
        last = Some(crate::now());
    }
}

/// One `PRAGMA wal_checkpoint(mode)`: whether it was stopped short (busy),
/// and the frames in the log; `None`, reported, when it failed. The log
/// keeps what a failed checkpoint did not copy; the next one (or the last
/// connection's close) copies it.
fn checkpoint(conn: &Connection, mode: &str) -> Option<(bool, i64)> {
    let done = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get::<_, i64>(1)?))
    });
    done.map_err(|e| eprintln!("tfa-host: sqlite: checkpoint failed: {e}"))
        .ok()
}

/// The checkpointer's busy handler: a restart waits for readers that still
/// use the log (a read takes microseconds) for about 10 ms, while the
/// writer is held at the gate, and then gives up until [`RESTART_RETRY`].
fn restart_busy(tries: i32) -> bool {
    std::thread::sleep(Duration::from_micros(100));
    tries < 100
}

std::thread_local! {
    /// The log's frame count after the writer thread's last commit, as
    /// SQLite's WAL hook reports it (`None`: no commit wrote a frame since
    /// it was taken).
    static COMMITTED_FRAMES: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// The writer connection's WAL hook: SQLite calls it in `COMMIT`, on the
/// committing thread, with the frames in the log after the commit.
fn count_frames(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    COMMITTED_FRAMES.set(u32::try_from(frames).ok());
    Ok(())
}

/// Runs `batch` in one transaction (between [`WalSync::begin_commit`] and
/// [`WalSync::end_commit`], and [`ReadCache::begin`] and
/// [`ReadCache::end`] with `keys`, the keys the batch may change) and then
/// answers each write with the commit's outcome.
fn commit_batch(
    conn: &Connection,
    batch: Vec<WriteJob>,
    keys: &[String],
    sync: &WalSync,
    cache: Option<&ReadCache>,
) {
    let cache_end = |locked: Option<Header>| {
        if let Some(c) = cache {
            c.end(
                keys.iter().map(String::as_str),
                locked,
                COMMITTED_FRAMES.take(),
            );
        }
    };
    if let Some(c) = cache {
        c.begin();
    }
    COMMITTED_FRAMES.set(None);
    sync.begin_commit();
    if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
        sync.end_commit();
        cache_end(None);
        for job in batch {
            job(None)(Err(e.clone()));
        }
        return;
    }
    // The write lock is held: nobody else commits until our COMMIT.
    let locked = cache.and_then(ReadCache::header);
    let finishers: Vec<Finish> = batch.into_iter().map(|job| job(Some(conn))).collect();
    let committed = control(conn, "COMMIT");
    if committed.is_err() {
        let _ = control(conn, "ROLLBACK");
    }
    sync.end_commit();
    cache_end(locked);
    for finish in finishers {
        finish(committed.clone());
    }
}

/// Runs `f` in a savepoint of the open transaction: its changes stay only
/// if it succeeds. A panic is an error, not a dead writer.
fn in_savepoint<T>(c: &Connection, f: impl FnOnce(&Connection) -> KvResult<T>) -> KvResult<T> {
    control(c, "SAVEPOINT op")?;
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)))
        .unwrap_or_else(|_| Err(KvError("sqlite: write panicked".into())));
    if out.is_err() {
        control(c, "ROLLBACK TO op")?;
    }
    control(c, "RELEASE op")?;
    out
}

/// Runs the transaction-control statement `sql` (`BEGIN IMMEDIATE`,
/// `SAVEPOINT op`, …) from the connection's statement cache. The writer
/// runs two of them around every write and two around every batch; until
/// 2026-12-07 `execute_batch` compiled each one anew: SQLite's parser and
/// code generator were about 3.5 % of the writer thread's samples under
/// `/2fa/verify` at concurrency 32 (`perf record` of the thread), and
/// caching them saves about 50,000 of the 1.43 million instructions of a
/// verification handled alone (callgrind, docs/decisions.md, "Transaction
/// statements from the statement cache").
fn control(c: &Connection, sql: &str) -> KvResult<()> {
    c.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// The store's table: a rowid table, with `key` in its own unique index.
/// Until 2026-12-06 it was `WITHOUT ROWID` (one b-tree ordered by `key`),
/// which SQLite recommends only for rows much smaller than a page: its
/// interior pages hold whole rows, and a row above about 1,000 bytes (a
/// user record is 1.5 KiB) spills into an overflow page. Here the index holds
/// only the keys and the table's pages up to about 4,000 bytes of a row, so a
/// lookup and a write touch fewer pages (docs/decisions.md, "A rowid table").
const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS kv (
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

/// Upsert of one value, inside the writer's transaction.
fn upsert(c: &Connection, key: &str, value: &[u8]) -> KvResult<()> {
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

// ------------------------------------------------------------------- Redis

/// Key-value store in a Redis server.
pub struct RedisKv {
    client: redis::Client,
    url_for_logs: String,
    pool: Mutex<Vec<redis::Connection>>,
    cas: redis::Script,
    emulation: KvEmulation,
}

/// Connections kept open for reuse.
const REDIS_POOL: usize = 16;

/// One PEM bundle of the system's roots (found as the `redis` crate finds
/// them without a CA file: `rustls-native-certs`, which honours
/// `SSL_CERT_FILE` / `SSL_CERT_DIR`) followed by `extra_pem`, for the
/// `redis` crate, which takes either its own roots or one bundle. A system
/// certificate rustls cannot use as a trust anchor is left out (the crate
/// would refuse the whole bundle); problems are logged, not fatal.
pub fn system_roots_and(extra_pem: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        crate::log::warn(&format!("KV_CA_FILE: reading the system's roots: {e}"));
    }
    let mut out = Vec::new();
    let mut usable = rustls::RootCertStore::empty();
    for cert in found.certs {
        if usable.add(cert.clone()).is_err() {
            continue;
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        out.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    out.extend_from_slice(extra_pem);
    out
}

impl RedisKv {
    /// Connects to `url` (`redis://…`), checking the server answers.
    pub fn open(url: &str, emulation: KvEmulation) -> KvResult<RedisKv> {
        RedisKv::open_tls(url, emulation, None)
    }

    /// Connects to `url` (`redis://…`, or `rediss://…` over TLS: the
    /// server's certificate is checked against the system's roots, and
    /// also against the PEM certificates of `ca_file` when it is given),
    /// checking the server answers.
    pub fn open_tls(
        url: &str,
        emulation: KvEmulation,
        ca_file: Option<&Path>,
    ) -> KvResult<RedisKv> {
        let client = match ca_file {
            Some(path) if url.starts_with("rediss://") => {
                let pem = std::fs::read(path).map_err(|e| {
                    KvError(format!("cannot read KV_CA_FILE {}: {e}", path.display()))
                })?;
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(system_roots_and(&pem)),
                    },
                )?
            }
            Some(_) => {
                return Err(KvError(
                    "KV_CA_FILE is set but KV_URL is not a rediss:// URL".into(),
                ))
            }
            None => redis::Client::open(url)?,
        };
        let kv = RedisKv {
            client,
            url_for_logs: redact(url),
            pool: Mutex::new(Vec::new()),
            // GET, compare, SET in one script: Redis runs it atomically. A
            // missing key reads as false, which never equals ARGV[1].
            cas: redis::Script::new(
                "local v = redis.call('GET', KEYS[1])
                 if v == ARGV[1] then
                   redis.call('SET', KEYS[1], ARGV[2])
                   return 1
                 end
                 return 0",
            ),
            emulation,
        };
        kv.with(|c| redis::cmd("PING").query::<String>(c).map(|_| ()))?;
        Ok(kv)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> KvResult<T> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        let mut conn = match pooled {
            Some(c) => c,
            None => self
                .client
                .get_connection_with_timeout(Duration::from_secs(5))?,
        };
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        conn.set_write_timeout(Some(Duration::from_secs(10)))?;
        let out = match f(&mut conn) {
            Ok(out) => out,
            Err(e) => {
                // The server went away (restart, network): every pooled
                // connection is as dead as this one; the next operations
                // connect afresh instead of failing once per pooled one.
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                    if let Ok(mut p) = self.pool.lock() {
                        p.clear();
                    }
                }
                return Err(e.into());
            }
        };
        if let Ok(mut p) = self.pool.lock() {
            if p.len() < REDIS_POOL {
                p.push(conn);
            }
        }
        Ok(out)
    }
}

/// `url` without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl KvBackend for RedisKv {
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>> {
        self.with(|c| redis::cmd("GET").arg(key).query(c))
    }

    fn set(&self, key: &str, value: &[u8]) -> KvResult<()> {
        self.with(|c| redis::cmd("SET").arg(key).arg(value).query(c))
    }

    fn delete(&self, key: &str) -> KvResult<()> {
        self.with(|c| redis::cmd("DEL").arg(key).query::<i64>(c).map(|_| ()))
    }

    fn exists(&self, key: &str) -> KvResult<bool> {
        self.with(|c| redis::cmd("EXISTS").arg(key).query(c))
    }

    fn keys(&self) -> KvResult<Vec<String>> {
        let mut keys: Vec<String> = self.with(|c| {
            let mut all = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000)
                    .query(c)?;
                all.extend(batch);
                if next == 0 {
                    break Ok(all);
                }
                cursor = next;
            }
        })?;
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.with(|c| redis::cmd("MGET").arg(keys).query(c))
    }

    fn increment(&self, key: &str, delta: i64) -> KvResult<i64> {
        self.with(|c| redis::cmd("INCRBY").arg(key).arg(delta).query(c))
    }

    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool> {
        let n: i64 = self.with(|c| self.cas.key(key).arg(expected).arg(new).invoke(c))?;
        Ok(n == 1)
    }

    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        if self.emulation == KvEmulation::None {
            return pairs.iter().try_for_each(|(k, v)| self.set(k, v));
        }
        // Spin: one `MSET k1 v1 k2 v2 …` (atomic); an empty batch never
        // reaches the store.
        if pairs.is_empty() {
            return Ok(());
        }
        self.with(|c| redis::cmd("MSET").arg(pairs).query(c))
    }

    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        if self.emulation == KvEmulation::None {
            return keys.iter().try_for_each(|k| self.delete(k));
        }
        // Spin: one `DEL k1 k2 …`.
        if keys.is_empty() {
            return Ok(());
        }
        self.with(|c| redis::cmd("DEL").arg(keys).query::<i64>(c).map(|_| ()))
    }

    fn emulation(&self) -> KvEmulation {
        self.emulation
    }

    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        if self.emulation == KvEmulation::None {
            return Ok(keys.iter().cloned().zip(self.get_many(keys)?).collect());
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Spin sends `KEYS k1 k2 …` and reads the reply as (key, value)
        // pairs. Redis refuses KEYS with two arguments or more; with one,
        // the key is a pattern and the matching names are paired up two by
        // two, and an odd number of them hits an `unreachable!` in the
        // `redis` crate (Spin's request panics: here an error).
        let names: Vec<Vec<u8>> = self.with(|c| redis::cmd("KEYS").arg(keys).query(c))?;
        if names.len() % 2 == 1 {
            return Err(KvError(format!(
                "redis: KEYS {:?} matched {} keys, an odd number (Spin 4.0.2 would panic here)",
                keys[0],
                names.len()
            )));
        }
        names
            .chunks(2)
            .map(|pair| {
                let key = String::from_utf8(pair[0].clone())
                    .map_err(|_| KvError("redis: KEYS answered a name that is not UTF-8".into()))?;
                Ok((key, Some(pair[1].clone())))
            })
            .collect()
    }

    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        if self.emulation == KvEmulation::None {
            return match seen {
                Some(Some(expected)) => self.compare_and_swap(key, expected, new),
                _ => Ok(false),
            };
        }
        // Spin: `MULTI; SET key new; EXEC` on the handle's connection, which
        // `current` made `WATCH` the key, then `UNWATCH key`, which Redis
        // refuses (UNWATCH takes no argument), so the answer is always
        // `cas-failed`. The write itself has happened unless the key changed
        // after `current` (WATCH; here: unless it holds another value now).
        // Its outcome is not reported, as in Spin, where the refused
        // UNWATCH is what decides the answer.
        let _written = match seen {
            None => self.set(key, new).map(|()| true),
            Some(None) => self.with(|c| {
                redis::cmd("SET")
                    .arg(key)
                    .arg(new)
                    .arg("NX")
                    .query::<Option<String>>(c)
                    .map(|ok| ok.is_some())
            }),
            Some(Some(expected)) => self.compare_and_swap(key, expected, new),
        };
        Ok(false)
    }

    fn describe(&self) -> String {
        format!("redis {}", self.url_for_logs)
    }
}

// ---------------------------------------------------------- fault injection

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

    /// A writer that ends by panicking closes its queue: the job it left
    /// queued is dropped (its sender learns that no answer will come) and
    /// the next push is refused instead of waiting forever.
    #[test]
    fn a_writer_that_panics_closes_its_queue() {
        use std::sync::mpsc::RecvTimeoutError;
        let queue = Arc::new(JobQueue::default());
        let noop = || Job::Write(Box::new(|_| Box::new(|_| {})), Vec::new());
        let (reply, answer) = std::sync::mpsc::channel::<()>();
        let waiting: WriteJob = Box::new(move |_| {
            let _keep = reply;
            Box::new(|_| {})
        });
        assert!(queue.push(noop()).is_ok());
        assert!(queue.push(Job::Write(waiting, Vec::new())).is_ok());
        let writer = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let _closed = ClosedAtExit(&queue);
                let mut taken = Vec::new();
                assert!(queue.take(1, &mut taken));
                panic!("a write job failed");
            })
        };
        assert!(writer.join().is_err());
        assert_eq!(
            answer.recv_timeout(Duration::from_secs(10)),
            Err(RecvTimeoutError::Disconnected),
            "the job left in the queue was dropped"
        );
        assert!(queue.push(noop()).is_err(), "the next job is refused");
    }

    /// A write that fails or panics in the batch's transaction leaves
    /// nothing behind, and the writes around it in the same transaction
    /// stay (the savepoint statements come from the connection's cache, so
    /// each is run many times on one connection here).
    #[test]
    fn a_failed_write_is_rolled_back_alone() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_TABLE).unwrap();
        control(&conn, "BEGIN IMMEDIATE").unwrap();
        for round in 0..3 {
            let kept = format!("kept:{round}");
            assert!(in_savepoint(&conn, |c| upsert(c, &kept, b"1")).is_ok());
            let failed = in_savepoint(&conn, |c| -> KvResult<()> {
                upsert(c, &format!("failed:{round}"), b"1")?;
                Err(KvError("refused".into()))
            });
            assert!(failed.is_err());
            let panicked = in_savepoint(&conn, |c| -> KvResult<()> {
                upsert(c, &format!("panicked:{round}"), b"1")?;
                panic!("a write panicked");
            });
            assert!(panicked.is_err());
        }
        control(&conn, "COMMIT").unwrap();
        let keys: Vec<String> = conn
            .prepare("SELECT key FROM kv ORDER BY key")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(keys, ["kept:0", "kept:1", "kept:2"]);
    }

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

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://***@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }
}
