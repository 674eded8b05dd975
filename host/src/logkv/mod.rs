//! `KV_ENGINE=log`: the store in memory, every write appended to a log.
//!
//! An opt-in alternative to [`crate::kv::SqliteKv`] for one host that owns
//! its data directory (docs/decisions.md, "A store in memory with an
//! append-only log").
//!
//! * **Reads** answer from a hash map under one mutex: no thread hand-off,
//!   no file access, no fiber suspended.
//! * **Writes** change the map and append one checksummed frame to an
//!   in-memory buffer under that same mutex, and return. A batch
//!   (`set-many`, `delete-many`) is one frame, so it is replayed all or
//!   nothing. `increment` and `compare-and-swap` are atomic because the
//!   read and the write happen under the mutex; the log records the value
//!   they left, so replaying it is idempotent.
//! * **Durability** is the host's barrier before a response
//!   ([`KvBackend::durable`]), as with SQLite: the sync thread takes every
//!   frame buffered so far, writes them with one `write(2)` and syncs the
//!   file once (`fdatasync`) for every request waiting at that moment
//!   (group commit). A request that only read waits too when something it
//!   may have read is not yet synced. So an acknowledged response never
//!   rests on a write that SIGKILL or power loss could take back. Under
//!   load (a sync answered two waiters or more, and many client
//!   connections are open) the sync thread gathers the next waiters for up
//!   to 500 µs instead of being woken by each (`Syncer::gather`).
//! * **Frames nobody waits for** (the work after a response: audit
//!   records, webhook fan-out) are written and synced within
//!   [`IDLE_FLUSH`] (20 ms) all the same, so SIGKILL loses at most that much of
//!   them (SQLite loses none of its commits to SIGKILL, only to power loss).
//! * **A failed write or sync** stops the store: every later call fails
//!   (the service answers 503) until the host is restarted, which replays
//!   what reached the disk. The pages a failed `fsync` left behind are
//!   never trusted (what PostgreSQL learned in 2018).
//! * **Compaction.** Once the log is [`Options::compact_at`] bytes long and
//!   longer than twice the last snapshot, the sync thread freezes the map
//!   ([`crate::layered`]: constant time, later writes go to an overlay),
//!   starts the next generation's log and hands the frozen map to a thread
//!   of its own, which writes it as that generation's snapshot (streamed,
//!   in 1 MiB writes) and then folds the overlay back into the map a few
//!   thousand entries at a time. Writes and syncs go on meanwhile in the
//!   new log, so no response waits for a snapshot; one compaction runs at
//!   a time. The old files go only after the snapshot was synced and
//!   renamed into place.
//! * **Opening** loads the newest complete snapshot and replays the logs
//!   from its generation on. A frame that is cut short or fails its
//!   checksum at the end of the newest log is the write a crash
//!   interrupted: it was never acknowledged, and the log is truncated
//!   there. The same in an older log, or in a snapshot, is damage: the
//!   store refuses to open rather than lose acknowledged data silently.
//! * **One process.** The directory is locked (`flock` on `kv.lock`) while
//!   the store is open: a second host on the same `DATA_DIR` refuses to
//!   start, as does an external tool that honours the lock.
//!
//! What it gives up against SQLite: memory that grows with the data (every
//! key and value is resident), no second process reading the store while
//! the host runs (no `sqlite3` shell), and, while a snapshot is written,
//! the memory of the values overwritten meanwhile (kept for the snapshot)
//! and one more lookup per read (the overlay first).
//!
//! Semantics follow [`KvEmulation`] exactly as [`crate::kv::SqliteKv`]
//! does: with `spin-4.0.2`, counters are 8-byte little-endian values,
//! `get-many` answers the keys that exist, sorted, and a `swap` whose
//! handle saw no value writes unconditionally; with `none`, counters are
//! decimal digits and a missing key never swaps (and, as with Redis, a
//! value of decimal digits written by `set` counts as a counter, where
//! SQLite refuses anything but its own `INTEGER`).
//!
//! # Files (in `DATA_DIR/kv-log/`)
//!
//! `kv-<gen>.snap`: a magic line, then one frame per key (a `set`), then an
//! end frame holding the number of keys. `kv-<gen>.log`: frames. A frame is
//! `len: u32 LE`, `crc32(payload): u32 LE`, `payload`; a payload is one or
//! more operations, `s` + key + value or `d` + key, each string as
//! `u32 LE length` + bytes.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use crate::kv::{KvBackend, KvEmulation, KvError, KvFuture, KvResult, WriteOp};
use crate::layered::Layered;

mod disk;
mod syncer;

use disk::{begin_frame, end_frame, lock_exclusive, log_file, put_bytes, recover, sync_dir};
use syncer::Syncer;

/// The folder of the log store inside `DATA_DIR`.
pub const LOG_DIR: &str = "kv-log";

/// How long frames nobody waits for stay in memory at most.
pub const IDLE_FLUSH: std::time::Duration = std::time::Duration::from_millis(20);
/// A frame longer than this is never written, so reading one is damage.
const MAX_FRAME: usize = 64 << 20;

/// Tuning of [`LogKv`].
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Compact once the current log is this long (and longer than twice
    /// the last snapshot). Default 64 MiB.
    pub compact_at: u64,
    /// Frames nobody waits for are flushed after this long at most.
    /// Default [`IDLE_FLUSH`].
    pub idle_flush: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            compact_at: 64 << 20,
            idle_flush: IDLE_FLUSH,
        }
    }
}

struct State {
    map: Layered,
    /// Frames not yet handed to the sync thread.
    pending: Vec<u8>,
    /// Frames appended so far (a sequence number).
    appended: u64,
    /// Why the store stopped, once a write or sync failed.
    failed: Option<String>,
}

/// A waiter for the sync thread: resolved once every frame appended before
/// it asked is synced.
type Waiter = tokio::sync::oneshot::Sender<KvResult<()>>;

/// The store. See the module documentation.
pub struct LogKv {
    dir: PathBuf,
    emulation: KvEmulation,
    state: Arc<Mutex<State>>,
    /// Frames synced so far (`State::appended` at the last sync).
    synced: Arc<AtomicU64>,
    /// Client connections the host has open
    /// ([`KvBackend::connection_opened`]).
    connections: Arc<AtomicUsize>,
    waiters: mpsc::Sender<Waiter>,
    /// The sync thread, joined on drop after its last flush.
    syncer: Option<std::thread::JoinHandle<()>>,
    /// Held for the store's lifetime: the directory's `flock`.
    _lock: File,
}

impl Drop for LogKv {
    fn drop(&mut self) {
        // Closing the channel makes the sync thread flush what is left and
        // end; the lock is released only after that.
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.waiters, closed));
        if let Some(t) = self.syncer.take() {
            let _ = t.join();
        }
    }
}

fn err(what: impl std::fmt::Display) -> KvError {
    KvError(format!("log store: {what}"))
}

fn io<'a>(what: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> KvError + 'a {
    move |e| err(format!("{what} {}: {e}", path.display()))
}

impl LogKv {
    /// Opens (or creates) the store in `data_dir`'s [`LOG_DIR`].
    pub fn open_dir(data_dir: &Path, emulation: KvEmulation) -> KvResult<LogKv> {
        LogKv::open_with(data_dir, emulation, Options::default())
    }

    /// [`LogKv::open_dir`] with `options`.
    pub fn open_with(data_dir: &Path, emulation: KvEmulation, options: Options) -> KvResult<LogKv> {
        let dir = data_dir.join(LOG_DIR);
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
            sync_dir(data_dir)?;
        }
        let lock_path = dir.join("kv.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("cannot open", &lock_path))?;
        lock_exclusive(&lock).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => err(format!(
                "{} is in use by another process (only one host may open a log store)",
                dir.display()
            )),
            _ => io("cannot lock", &lock_path)(e),
        })?;
        let recovered = recover(&dir)?;
        let log_path = log_file(&dir, recovered.generation);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("cannot open", &log_path))?;
        sync_dir(&dir)?;
        let state = Arc::new(Mutex::new(State {
            map: Layered::new(recovered.map),
            pending: Vec::new(),
            appended: 0,
            failed: None,
        }));
        let synced = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let mut syncer = Syncer {
            dir: dir.clone(),
            state: state.clone(),
            synced: synced.clone(),
            connections: connections.clone(),
            log,
            generation: recovered.generation,
            log_bytes: recovered.log_bytes,
            snap_bytes: recovered.snap_bytes,
            compact_at: options.compact_at,
            idle_flush: options.idle_flush,
            spare: Vec::new(),
            compacting: None,
        };
        let syncer = std::thread::Builder::new()
            .name("kv-log-sync".into())
            .spawn(move || syncer.run(rx))
            .map_err(|e| err(format!("cannot start the sync thread: {e}")))?;
        Ok(LogKv {
            dir,
            emulation,
            state,
            synced,
            connections,
            waiters: tx,
            syncer: Some(syncer),
            _lock: lock,
        })
    }

    /// How many keys the store holds.
    pub fn len(&self) -> usize {
        self.lock().map(|s| s.map.len()).unwrap_or(0)
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state, or the reason the store stopped.
    fn lock(&self) -> KvResult<MutexGuard<'_, State>> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &s.failed {
            Some(why) => Err(err(format!("stopped after a failed write: {why}"))),
            None => Ok(s),
        }
    }

    /// Applies `ops` to the map and appends them as one frame (written in
    /// place: its header is filled in once the payload is there).
    fn apply(s: &mut State, ops: &[Op<'_>]) -> KvResult<()> {
        let size: usize = ops
            .iter()
            .map(|op| match op {
                Op::Set(k, v) => 9 + k.len() + v.len(),
                Op::Delete(k) => 5 + k.len(),
            })
            .sum();
        if size > MAX_FRAME {
            return Err(err(format!(
                "a write of {size} bytes is larger than a frame may be ({MAX_FRAME} bytes)"
            )));
        }
        let start = begin_frame(&mut s.pending);
        for op in ops {
            match op {
                Op::Set(k, v) => {
                    s.pending.push(b's');
                    put_bytes(&mut s.pending, k.as_bytes());
                    put_bytes(&mut s.pending, v);
                    s.map.insert(Arc::from(*k), Arc::from(*v));
                }
                Op::Delete(k) => {
                    s.pending.push(b'd');
                    put_bytes(&mut s.pending, k.as_bytes());
                    s.map.remove(k);
                }
            }
        }
        end_frame(&mut s.pending, start);
        s.appended += 1;
        Ok(())
    }

    fn increment_in(&self, key: &str, delta: i64) -> KvResult<i64> {
        let mut s = self.lock()?;
        let old = match s.map.get(key) {
            None => 0,
            Some(v) => self.counter(key, v)?,
        };
        if delta == 0 {
            // How the service reads a counter: nothing is created or
            // written, as with the SQLite store (`SqliteKv::read_counter`).
            return Ok(old);
        }
        let new = old.wrapping_add(delta);
        let bytes = self.counter_bytes(new);
        LogKv::apply(&mut s, &[Op::Set(key, &bytes)])?;
        Ok(new)
    }

    fn counter(&self, key: &str, v: &[u8]) -> KvResult<i64> {
        match self.emulation {
            KvEmulation::Spin402 => <[u8; 8]>::try_from(v).map(i64::from_le_bytes).map_err(|_| {
                err(format!(
                    "value at {key:?} is not an 8-byte counter (Spin 4.0.2 would panic here)"
                ))
            }),
            KvEmulation::None => std::str::from_utf8(v)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| err(format!("value at {key:?} is not a counter"))),
        }
    }

    fn counter_bytes(&self, n: i64) -> Vec<u8> {
        match self.emulation {
            KvEmulation::Spin402 => n.to_le_bytes().to_vec(),
            KvEmulation::None => n.to_string().into_bytes(),
        }
    }
}

enum Op<'a> {
    Set(&'a str, &'a [u8]),
    Delete(&'a str),
}

impl KvBackend for LogKv {
    fn get(&self, key: &str) -> KvResult<Option<Vec<u8>>> {
        Ok(self.lock()?.map.get(key).map(|v| v.to_vec()))
    }

    fn set(&self, key: &str, value: &[u8]) -> KvResult<()> {
        LogKv::apply(&mut *self.lock()?, &[Op::Set(key, value)])
    }

    fn delete(&self, key: &str) -> KvResult<()> {
        let mut s = self.lock()?;
        if s.map.contains(key) {
            LogKv::apply(&mut s, &[Op::Delete(key)])?;
        }
        Ok(())
    }

    fn exists(&self, key: &str) -> KvResult<bool> {
        Ok(self.lock()?.map.contains(key))
    }

    fn keys(&self) -> KvResult<Vec<String>> {
        let mut keys: Vec<String> = self.lock()?.map.keys().map(|k| k.to_string()).collect();
        keys.sort();
        Ok(keys)
    }

    fn get_many(&self, keys: &[String]) -> KvResult<Vec<Option<Vec<u8>>>> {
        // One lock: the values are from one moment.
        let s = self.lock()?;
        Ok(keys
            .iter()
            .map(|k| s.map.get(k.as_str()).map(|v| v.to_vec()))
            .collect())
    }

    fn set_many(&self, pairs: &[(String, Vec<u8>)]) -> KvResult<()> {
        let ops: Vec<Op<'_>> = pairs.iter().map(|(k, v)| Op::Set(k, v)).collect();
        LogKv::apply(&mut *self.lock()?, &ops)
    }

    fn delete_many(&self, keys: &[String]) -> KvResult<()> {
        let mut s = self.lock()?;
        let ops: Vec<Op<'_>> = keys
            .iter()
            .filter(|k| s.map.contains(k.as_str()))
            .map(|k| Op::Delete(k))
            .collect();
        if !ops.is_empty() {
            LogKv::apply(&mut s, &ops)?;
        }
        Ok(())
    }

    fn increment(&self, key: &str, delta: i64) -> KvResult<i64> {
        self.increment_in(key, delta)
    }

    fn compare_and_swap(&self, key: &str, expected: &[u8], new: &[u8]) -> KvResult<bool> {
        let mut s = self.lock()?;
        match s.map.get(key) {
            Some(v) if **v == *expected => {
                LogKv::apply(&mut s, &[Op::Set(key, new)])?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn emulation(&self) -> KvEmulation {
        self.emulation
    }

    fn get_many_pairs(&self, keys: &[String]) -> KvResult<Vec<(String, Option<Vec<u8>>)>> {
        crate::kv::sqlite_get_many_pairs(self, keys)
    }

    fn swap(&self, key: &str, seen: Option<Option<&[u8]>>, new: &[u8]) -> KvResult<bool> {
        crate::kv::sqlite_swap(self, key, seen, new)
    }

    fn describe(&self) -> String {
        format!("log {} (in memory, append-only log)", self.dir.display())
    }

    fn inline_reads(&self) -> bool {
        true
    }

    fn write_async(&self, op: WriteOp) -> Result<KvFuture<i64>, WriteOp> {
        let out = match op {
            WriteOp::Set(k, v) => self.set(&k, &v).map(|()| 0),
            WriteOp::Delete(k) => self.delete(&k).map(|()| 0),
            WriteOp::Increment(k, d) => self.increment_in(&k, d),
        };
        Ok(Box::pin(std::future::ready(out)))
    }

    fn durable(&self) -> Option<KvFuture<()>> {
        let target = match self.lock() {
            Ok(s) => s.appended,
            Err(e) => return Some(Box::pin(std::future::ready(Err(e)))),
        };
        if self.synced.load(Ordering::Acquire) >= target {
            return None;
        }
        let (waiter, answer) = tokio::sync::oneshot::channel();
        let sent = self.waiters.send(waiter).is_ok();
        Some(Box::pin(async move {
            let stopped = || err("the sync thread has stopped");
            if !sent {
                return Err(stopped());
            }
            answer.await.unwrap_or_else(|_| Err(stopped()))
        }))
    }

    fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    fn connection_closed(&self) {
        // Never below zero, whatever a caller does.
        let _ = self
            .connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}
