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
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use crate::kv::{KvBackend, KvEmulation, KvError, KvFuture, KvResult, WriteOp};
use crate::layered::{Frozen, Layered, Map};

/// The folder of the log store inside `DATA_DIR`.
pub const LOG_DIR: &str = "kv-log";

const SNAP_MAGIC: &[u8] = b"tfa-kv-snapshot 1\n";
/// How long frames nobody waits for stay in memory at most.
pub const IDLE_FLUSH: std::time::Duration = std::time::Duration::from_millis(20);
/// A frame longer than this is never written, so reading one is damage.
const MAX_FRAME: usize = 64 << 20;
/// The largest buffer the sync thread keeps for the next flush's frames.
const SPARE_MAX: usize = 4 << 20;
/// Group commit under load ([`Syncer::gather`]): while at least this many
/// open client connections have no request waiting for a sync, the sync
/// thread waits for their requests in steps of [`GATHER_STEP`],
/// [`GATHER_MAX`] at most.
const GATHER_RUNNING: usize = 8;
/// See [`GATHER_RUNNING`].
const GATHER_STEP: std::time::Duration = std::time::Duration::from_micros(100);
/// See [`GATHER_RUNNING`].
const GATHER_MAX: std::time::Duration = std::time::Duration::from_micros(500);

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
        let start = s.pending.len();
        s.pending.extend_from_slice(&[0; 8]);
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
        let payload = &s.pending[start + 8..];
        let (len, crc) = (payload.len() as u32, crc32fast::hash(payload));
        s.pending[start..start + 4].copy_from_slice(&len.to_le_bytes());
        s.pending[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
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

// ------------------------------------------------------------ sync thread

struct Syncer {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    synced: Arc<AtomicU64>,
    connections: Arc<AtomicUsize>,
    log: File,
    generation: u64,
    log_bytes: u64,
    snap_bytes: u64,
    compact_at: u64,
    idle_flush: std::time::Duration,
    /// An empty buffer with room, swapped in for `State::pending` at each
    /// flush ([`Syncer::keep_spare`]).
    spare: Vec<u8>,
    /// The compaction being written, if one is: its snapshot's length.
    compacting: Option<std::thread::JoinHandle<KvResult<u64>>>,
}

impl Syncer {
    /// Step by step: wait for a waiter; take every waiter queued meanwhile;
    /// take every frame buffered so far (a waiter asked after its frames
    /// were buffered, so they are among them); write and sync them once;
    /// answer the waiters; compact when the log has grown enough. With no
    /// waiter for [`Options::idle_flush`], frames nobody waits for (the work after
    /// a response: audit records, webhook fan-out) are flushed all the
    /// same, so a crash loses at most that much of them. Ends, after a
    /// last flush, when the store is dropped.
    ///
    /// Under load a sync answered two waiters or more: the next waiters are
    /// then gathered ([`Syncer::gather`]) instead of each waking this thread.
    fn run(&mut self, rx: mpsc::Receiver<Waiter>) {
        let mut gather = false;
        loop {
            let mut waiters = Vec::new();
            let mut closed = false;
            if gather {
                closed = self.gather(&rx, &mut waiters);
                if waiters.is_empty() && !closed {
                    gather = false;
                    continue;
                }
            } else {
                match rx.recv_timeout(self.idle_flush) {
                    Ok(w) => {
                        waiters.push(w);
                        waiters.extend(rx.try_iter());
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !self.state().pending.is_empty() {
                            let _ = self.flush();
                        }
                        self.reap(false);
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => closed = true,
                }
            }
            gather = waiters.len() >= 2;
            let answer = self.flush();
            for w in waiters {
                let _ = w.send(answer.clone());
            }
            if closed {
                self.reap(true);
                return;
            }
            self.reap(false);
            if answer.is_ok()
                && self.compacting.is_none()
                && self.log_bytes >= self.compact_at.max(2 * self.snap_bytes)
            {
                if let Err(e) = self.compact() {
                    self.stop(&e);
                }
            }
        }
    }

    /// Group commit under load (PostgreSQL's `commit_delay` with
    /// `commit_siblings`, made adaptive). Each waiter that finds this
    /// thread asleep wakes it (a `futex` call, an interrupt to the other
    /// core, two context switches), and on a fast disk or tmpfs a sync is
    /// over long before the next request asks: at 13,500 verifications a
    /// second this thread synced 7,755 times a second, 1.75 waiters each.
    /// So after a sync that answered two waiters or more, this thread does
    /// not block on the queue (where a sender must wake it) but sleeps in
    /// steps of [`GATHER_STEP`] and takes what was queued, for as long as
    /// at least [`GATHER_RUNNING`] of the host's open client connections
    /// ([`KvBackend::connection_opened`]) have no request among the
    /// waiters (they may ask soon), and [`GATHER_MAX`] at most. With fewer
    /// clients nothing is gathered: with few clients, each waiting for its
    /// answer before it sends again, a waiter would only wait for the
    /// others while the cores idle. Fills `waiters`; `true` once the store
    /// was dropped.
    fn gather(&self, rx: &mpsc::Receiver<Waiter>, waiters: &mut Vec<Waiter>) -> bool {
        let began = crate::now();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(w) => waiters.push(w),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return true,
                }
            }
            let running = self
                .connections
                .load(Ordering::Relaxed)
                .saturating_sub(waiters.len());
            if running < GATHER_RUNNING || began.elapsed() >= GATHER_MAX {
                return false;
            }
            std::thread::sleep(GATHER_STEP);
        }
    }

    /// Takes the result of a compaction that has ended (with `wait`, waits
    /// for a running one): the new snapshot's length, or the store stopped.
    fn reap(&mut self, wait: bool) {
        if !wait && !self.compacting.as_ref().is_some_and(|t| t.is_finished()) {
            return;
        }
        let Some(t) = self.compacting.take() else {
            return;
        };
        match t.join() {
            Ok(Ok(bytes)) => self.snap_bytes = bytes,
            Ok(Err(e)) => self.stop(&e),
            Err(_) => self.stop(&err("the compaction thread panicked")),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the store stopped: every later call fails.
    fn stop(&self, e: &KvError) {
        crate::log::error(&format!(
            "{e}; the store refuses every call until a restart"
        ));
        self.state().failed.get_or_insert_with(|| e.0.clone());
    }

    /// Writes and syncs every buffered frame.
    fn flush(&mut self) -> KvResult<()> {
        let mut frames = std::mem::take(&mut self.spare);
        let upto = {
            let mut s = self.state();
            if let Some(why) = &s.failed {
                return Err(err(format!("stopped after a failed write: {why}")));
            }
            std::mem::swap(&mut s.pending, &mut frames);
            s.appended
        };
        if let Err(e) = self.write_synced(frames, upto) {
            self.stop(&e);
            return Err(e);
        }
        Ok(())
    }

    /// Keeps a written buffer, emptied, to be swapped in for
    /// `State::pending` at the next flush: the writers append into memory
    /// that is already there instead of growing a new buffer from nothing
    /// after every sync. One grown beyond [`SPARE_MAX`] by a burst is
    /// dropped instead.
    fn keep_spare(&mut self, mut frames: Vec<u8>) {
        if frames.capacity() <= SPARE_MAX {
            frames.clear();
            self.spare = frames;
        }
    }

    /// Writes and syncs `frames`, the frames up to number `upto`, and marks
    /// those synced; keeps the buffer for the next flush either way.
    fn write_synced(&mut self, frames: Vec<u8>, upto: u64) -> KvResult<()> {
        let written = self.write_and_sync(&frames);
        self.keep_spare(frames);
        written?;
        self.synced.store(upto, Ordering::Release);
        Ok(())
    }

    fn write_and_sync(&mut self, frames: &[u8]) -> KvResult<()> {
        if !frames.is_empty() {
            let path = log_file(&self.dir, self.generation);
            self.log
                .write_all(frames)
                .map_err(io("cannot write", &path))?;
            self.log.sync_data().map_err(io("cannot sync", &path))?;
            self.log_bytes += frames.len() as u64;
        }
        Ok(())
    }

    /// Starts the snapshot of the next generation. The map is frozen under
    /// the lock ([`Layered::freeze`], constant time: until 2026-12-04 it was
    /// cloned there, 194 ms at 942,000 keys with every store call waiting),
    /// with the frames buffered until then: they go to the old log, synced,
    /// and every later frame to the new generation's log. The snapshot is written and
    /// synced by a thread of its own while this one goes on syncing the new
    /// log: until 2026-12-03 the sync thread wrote it itself, and every
    /// response waiting for durability waited for a snapshot of the whole
    /// store (about 110 MB at 18,000 users) and its `fsync`. Until the
    /// snapshot is renamed into place, opening replays the old snapshot and
    /// both logs; the older files go only after the rename.
    fn compact(&mut self) -> KvResult<()> {
        let mut frames = std::mem::take(&mut self.spare);
        let frozen = {
            let mut s = self.state();
            s.map.freeze().map(|map| {
                std::mem::swap(&mut s.pending, &mut frames);
                (map, s.appended)
            })
        };
        let Some((map, upto)) = frozen else {
            // Not reached: a compaction's merge ends before its thread does.
            self.spare = frames;
            return Ok(());
        };
        self.write_synced(frames, upto)?;
        let next = self.generation + 1;
        let log_path = log_file(&self.dir, next);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("cannot open", &log_path))?;
        sync_dir(&self.dir)?;
        self.log = log;
        self.generation = next;
        self.log_bytes = 0;
        let dir = self.dir.clone();
        let state = self.state.clone();
        let thread = std::thread::Builder::new()
            .name("kv-log-compact".into())
            .spawn(move || {
                let started = crate::now();
                let keys = map.len();
                let bytes = write_snapshot(&dir, next, &map)?;
                drop(map);
                let written = started.elapsed();
                let merge = merge(&state);
                crate::log::info(&format!(
                    "log store: snapshot of generation {next} written ({keys} keys, {bytes} \
                     bytes, in {} ms, nothing waiting); the {} writes made meanwhile merged in \
                     {} steps, the longest {} µs",
                    written.as_millis(),
                    merge.entries,
                    merge.steps,
                    merge.longest.as_micros()
                ));
                // Only now are the older files not needed.
                for (path, generation) in files(&dir)? {
                    if generation < next {
                        std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
                    }
                }
                Ok(bytes)
            })
            .map_err(|e| err(format!("cannot start the compaction thread: {e}")))?;
        self.compacting = Some(thread);
        Ok(())
    }
}

/// Overlay entries folded back into the map per step of [`merge`]: a
/// store call waits for one step at most (about a millisecond).
const MERGE_STEP: usize = 1024;

/// How long [`merge`] leaves the lock alone between two steps. Without
/// it the store's calls starved: `std`'s mutex is not fair, the merging
/// thread took the lock back the moment it let go, before a woken
/// caller ran, and one call waited for the whole merge (365 ms in
/// `tfa-bench kv-pause` at 942,000 keys, 2026-12-04).
const MERGE_REST: std::time::Duration = std::time::Duration::from_micros(250);

/// What [`merge`] did.
struct Merged {
    entries: usize,
    steps: usize,
    longest: std::time::Duration,
}

/// Folds the writes made while a snapshot was written back into the map
/// ([`Layered::merge_some`]), [`MERGE_STEP`] entries under the lock at a
/// time and [`MERGE_REST`] without it, so that the store's calls go on
/// between the steps.
fn merge(state: &Mutex<State>) -> Merged {
    let mut m = Merged {
        entries: 0,
        steps: 0,
        longest: std::time::Duration::ZERO,
    };
    loop {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        let t = crate::now();
        if m.steps == 0 {
            m.entries = s.map.overlay_len();
        }
        let done = s.map.merge_some(MERGE_STEP);
        drop(s);
        m.longest = m.longest.max(t.elapsed());
        m.steps += 1;
        if done {
            return m;
        }
        std::thread::sleep(MERGE_REST);
    }
}

/// Bytes the snapshot writer gathers before each `write(2)`.
const SNAP_BUFFER: usize = 1 << 20;

/// Writes `map` as the snapshot of `generation` and syncs it into place;
/// returns its length. Streams through one [`SNAP_BUFFER`]-sized buffer:
/// building the whole snapshot in memory first (tens of MB at a few
/// thousand users) had the kernel zero that many fresh pages at every
/// compaction, and the growing buffer copied itself at each doubling.
fn write_snapshot(dir: &Path, generation: u64, map: &Frozen) -> KvResult<u64> {
    let tmp = dir.join(format!("kv-{generation}.snap.tmp"));
    let path = snap_file(dir, generation);
    let f = File::create(&tmp).map_err(io("cannot create", &tmp))?;
    let mut out = std::io::BufWriter::with_capacity(SNAP_BUFFER, f);
    let mut frame = Vec::new();
    out.write_all(SNAP_MAGIC)
        .map_err(io("cannot write", &tmp))?;
    let mut payload = Vec::new();
    for (k, v) in map.iter() {
        payload.clear();
        payload.push(b's');
        put_bytes(&mut payload, k.as_bytes());
        put_bytes(&mut payload, v);
        frame.clear();
        put_frame(&mut frame, &payload);
        out.write_all(&frame).map_err(io("cannot write", &tmp))?;
    }
    payload.clear();
    payload.push(b'e');
    payload.extend_from_slice(&(map.len() as u64).to_le_bytes());
    frame.clear();
    put_frame(&mut frame, &payload);
    out.write_all(&frame).map_err(io("cannot write", &tmp))?;
    let f = out
        .into_inner()
        .map_err(|e| io("cannot write", &tmp)(e.into_error()))?;
    f.sync_all().map_err(io("cannot sync", &tmp))?;
    let written = f
        .metadata()
        .map_err(io("cannot read the length of", &tmp))?
        .len();
    std::fs::rename(&tmp, &path).map_err(io("cannot rename", &tmp))?;
    sync_dir(dir)?;
    Ok(written)
}

// --------------------------------------------------------------- recovery

struct Recovered {
    map: Map,
    /// The generation whose log receives new frames.
    generation: u64,
    log_bytes: u64,
    snap_bytes: u64,
}

fn log_file(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("kv-{generation}.log"))
}

fn snap_file(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("kv-{generation}.snap"))
}

/// The store's snapshots and logs with their generation (`.tmp` files are
/// an interrupted compaction's and are removed).
fn files(dir: &Path) -> KvResult<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("cannot list", dir))? {
        let path = entry.map_err(io("cannot list", dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
            continue;
        }
        let generation = name
            .strip_prefix("kv-")
            .and_then(|n| n.strip_suffix(".log").or_else(|| n.strip_suffix(".snap")))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(g) = generation {
            out.push((path, g));
        }
    }
    Ok(out)
}

fn recover(dir: &Path) -> KvResult<Recovered> {
    let found = files(dir)?;
    let is_snap = |p: &Path| p.extension().is_some_and(|e| e == "snap");
    let base = found
        .iter()
        .filter(|(p, _)| is_snap(p))
        .map(|(_, g)| *g)
        .max();
    let mut map = Map::new();
    let mut snap_bytes = 0;
    if let Some(g) = base {
        let path = snap_file(dir, g);
        let bytes = read_all(&path)?;
        snap_bytes = bytes.len() as u64;
        load_snapshot(&bytes, &mut map).map_err(|why| err(format!("{}: {why}", path.display())))?;
    }
    let base = base.unwrap_or(0);
    let mut logs: Vec<u64> = found
        .iter()
        .filter(|(p, g)| !is_snap(p) && *g >= base)
        .map(|(_, g)| *g)
        .collect();
    logs.sort_unstable();
    let newest = logs.last().copied().unwrap_or(base);
    let mut log_bytes = 0;
    for g in logs {
        let path = log_file(dir, g);
        let bytes = read_all(&path)?;
        let good = replay(&bytes, &mut map);
        if good < bytes.len() {
            if g != newest {
                return Err(err(format!(
                    "{} is damaged at byte {good} of {} (not its end: refusing to open)",
                    path.display(),
                    bytes.len()
                )));
            }
            crate::log::info(&format!(
                "log store: {} ends in {} bytes of an interrupted write (never acknowledged); \
                 truncated",
                path.display(),
                bytes.len() - good
            ));
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io("cannot open", &path))?;
            f.set_len(good as u64)
                .map_err(io("cannot truncate", &path))?;
            f.sync_all().map_err(io("cannot sync", &path))?;
        }
        if g == newest {
            log_bytes = good as u64;
        }
    }
    // Files of generations before the snapshot: a compaction ended before
    // removing them.
    for (path, g) in found {
        if g < base {
            std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
        }
    }
    Ok(Recovered {
        map,
        generation: newest,
        log_bytes,
        snap_bytes,
    })
}

fn read_all(path: &Path) -> KvResult<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io("cannot read", path))?;
    Ok(bytes)
}

/// Applies the log's frames to `map`; the length of its intact prefix.
fn replay(bytes: &[u8], map: &mut Map) -> usize {
    let mut at = 0;
    while let Some((payload, next)) = frame(bytes, at) {
        let Some(ops) = parse_ops(payload) else {
            break;
        };
        for op in ops {
            match op {
                Op::Set(k, v) => {
                    map.insert(Arc::from(k), Arc::from(v));
                }
                Op::Delete(k) => {
                    map.remove(k);
                }
            }
        }
        at = next;
    }
    at
}

fn load_snapshot(bytes: &[u8], map: &mut Map) -> Result<(), String> {
    let mut at = bytes
        .strip_prefix(SNAP_MAGIC)
        .map(|_| SNAP_MAGIC.len())
        .ok_or("not a snapshot of this store")?;
    loop {
        let (payload, next) = frame(bytes, at).ok_or(format!("damaged at byte {at}"))?;
        if let Some(count) = payload.strip_prefix(b"e") {
            let count = <[u8; 8]>::try_from(count)
                .map(u64::from_le_bytes)
                .map_err(|_| format!("damaged end at byte {at}"))?;
            if count != map.len() as u64 || next != bytes.len() {
                return Err(format!("holds {} keys, its end says {count}", map.len()));
            }
            return Ok(());
        }
        for op in parse_ops(payload).ok_or(format!("damaged at byte {at}"))? {
            match op {
                Op::Set(k, v) => {
                    map.insert(Arc::from(k), Arc::from(v));
                }
                Op::Delete(_) => return Err(format!("a delete at byte {at}")),
            }
        }
        at = next;
    }
}

// ----------------------------------------------------------------- frames

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The intact frame at `at` and where the next begins; `None` at the end,
/// or where a frame is cut short or fails its checksum.
fn frame(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = bytes.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    if len > MAX_FRAME {
        return None;
    }
    let end = at.checked_add(8)?.checked_add(len)?;
    let payload = bytes.get(at + 8..end)?;
    (crc32fast::hash(payload) == crc).then_some((payload, end))
}

fn parse_ops(mut p: &[u8]) -> Option<Vec<Op<'_>>> {
    fn take<'a>(p: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
        let b = p.get(4..4usize.checked_add(len)?)?;
        *p = &p[4 + len..];
        Some(b)
    }
    let mut ops = Vec::new();
    while let Some((&tag, rest)) = p.split_first() {
        p = rest;
        let key = std::str::from_utf8(take(&mut p)?).ok()?;
        ops.push(match tag {
            b's' => Op::Set(key, take(&mut p)?),
            b'd' => Op::Delete(key),
            _ => return None,
        });
    }
    (!ops.is_empty()).then_some(ops)
}

/// `flock(LOCK_EX | LOCK_NB)`: held until the file is closed, released by
/// the kernel when the process ends however it ends. (`File::try_lock`
/// needs Rust 1.89; the workspace's MSRV is 1.85.)
fn lock_exclusive(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `flock` on a descriptor this `File` owns and keeps open for
    // the call; it touches no memory.
    match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn sync_dir(dir: &Path) -> KvResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("cannot sync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_damage_is_seen() {
        let mut log = Vec::new();
        let mut payload = Vec::new();
        payload.push(b's');
        put_bytes(&mut payload, b"a");
        put_bytes(&mut payload, b"1");
        put_frame(&mut log, &payload);
        let one = log.len();
        payload.clear();
        payload.push(b'd');
        put_bytes(&mut payload, b"a");
        put_frame(&mut log, &payload);
        let mut map = Map::new();
        assert_eq!(replay(&log, &mut map), log.len());
        assert!(map.is_empty());
        // Cut short anywhere in the second frame: only the first applies.
        for cut in one..log.len() {
            let mut map = Map::new();
            assert_eq!(replay(&log[..cut], &mut map), one, "cut at {cut}");
            assert_eq!(map.get("a").map(|v| v.to_vec()), Some(b"1".to_vec()));
        }
        // A flipped bit anywhere in the first frame: nothing applies.
        for byte in 0..one {
            let mut bad = log.clone();
            bad[byte] ^= 0x10;
            let mut map = Map::new();
            assert_eq!(replay(&bad, &mut map), 0, "bit flipped in byte {byte}");
            assert!(map.is_empty());
        }
    }

    #[test]
    fn snapshots_check_their_end() {
        let dir = std::env::temp_dir().join(format!("logkv-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut map = Map::new();
        for i in 0..50 {
            map.insert(Arc::from(format!("k{i}")), Arc::from(vec![i as u8; i]));
        }
        let len = write_snapshot(&dir, 3, &Layered::new(map.clone()).freeze().unwrap()).unwrap();
        let bytes = std::fs::read(snap_file(&dir, 3)).unwrap();
        assert_eq!(bytes.len() as u64, len);
        let mut back = Map::new();
        load_snapshot(&bytes, &mut back).unwrap();
        assert_eq!(back, map);
        for cut in [bytes.len() - 1, bytes.len() / 2, SNAP_MAGIC.len()] {
            assert!(load_snapshot(&bytes[..cut], &mut Map::new()).is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
