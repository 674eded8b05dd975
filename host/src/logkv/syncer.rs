//! The sync thread: group commit of the buffered frames (one `write(2)`
//! and one `fdatasync` for every request waiting at that moment), the
//! flush of frames nobody waits for, and compaction.

use super::disk::{files, log_file, sync_dir, write_snapshot};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use crate::kv::{KvError, KvResult};
#[cfg(doc)]
use crate::layered::Layered;

use super::{err, io, State, Waiter};

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

pub(super) struct Syncer {
    pub(super) dir: PathBuf,
    pub(super) state: Arc<Mutex<State>>,
    pub(super) synced: Arc<AtomicU64>,
    pub(super) connections: Arc<AtomicUsize>,
    pub(super) log: File,
    pub(super) generation: u64,
    pub(super) log_bytes: u64,
    pub(super) snap_bytes: u64,
    pub(super) compact_at: u64,
    pub(super) idle_flush: std::time::Duration,
    /// An empty buffer with room, swapped in for `State::pending` at each
    /// flush ([`Syncer::keep_spare`]).
    pub(super) spare: Vec<u8>,
    /// The compaction being written, if one is: its snapshot's length.
    pub(super) compacting: Option<std::thread::JoinHandle<KvResult<u64>>>,
}

impl Syncer {
    /// Step by step: wait for a waiter; take every waiter queued meanwhile;
    /// take every frame buffered so far (a waiter asked after its frames
    /// were buffered, so they are among them); write and sync them once;
    /// answer the waiters; compact when the log has grown enough. With no
    /// waiter for [`Options::idle_flush`](super::Options::idle_flush), frames nobody waits for (the work after
    /// a response: audit records, webhook fan-out) are flushed all the
    /// same, so a crash loses at most that much of them. Ends, after a
    /// last flush, when the store is dropped.
    ///
    /// Under load a sync answered two waiters or more: the next waiters are
    /// then gathered ([`Syncer::gather`]) instead of each waking this thread.
    pub(super) fn run(&mut self, rx: mpsc::Receiver<Waiter>) {
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
    /// ([`KvBackend::connection_opened`](crate::kv::KvBackend::connection_opened)) have no request among the
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
