//! The SQLite store's two threads: the writer, which commits the writes
//! waiting for it together, each in its own savepoint ([`writer_loop`],
//! fed by [`JobQueue`]), and the checkpointer, which copies the log into the
//! database file and starts it over ([`checkpoint_loop`]). The store that
//! starts them and queues the writes is [`super::SqliteKv`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use super::{KvError, KvResult};
use crate::readcache::{Header, ReadCache};
use crate::walsync::{Waiter, WalSync};

/// The writer thread's queue: jobs in arrival order, taken by the writer
/// a batch at a time. A job queued while the writer is busy costs its
/// sender a short lock and no system call: the writer is woken only when it
/// sleeps on an empty queue. (The standard library's channel, used until
/// 2026-12-07, put 39 % of the writer's context switches in its internal
/// lock, which every sender takes to wake a sleeping receiver.)
#[derive(Default)]
pub(super) struct JobQueue {
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
    pub(super) fn push(&self, job: Job) -> Result<(), Job> {
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
    pub(super) fn take(&self, max: usize, into: &mut Vec<Job>) -> bool {
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
    pub(super) fn close(&self) {
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
pub(super) enum Job {
    /// A write, committed with the others waiting, and the keys it may
    /// change.
    Write(WriteJob, Vec<String>),
    /// A barrier: handed to the sync thread once the commits before it have
    /// ended (step 3 of [`crate::walsync`]).
    Durable(Waiter),
}

/// What a write job hands back after running: called with the outcome of
/// the commit that holds it.
pub(super) type Finish = Box<dyn FnOnce(KvResult<()>) + Send>;
/// One write: run inside the batch transaction (`Some`), or told that it
/// could not run (`None`: the batch could not begin).
pub(super) type WriteJob = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

/// Writes committed together at most.
const MAX_BATCH: usize = 256;

/// The writer thread: takes every job that is waiting (up to
/// [`MAX_BATCH`]; it sleeps while there is none), runs the writes among
/// them in one `BEGIN IMMEDIATE` transaction (each in a savepoint), commits (no sync:
/// `synchronous=NORMAL`), answers each write, and then hands the barriers
/// among them to the sync thread. Ends when the store is dropped.
pub(super) fn writer_loop(
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
pub(super) const fn wal_size_limit(restart_frames: i64) -> i64 {
    2 * restart_frames * 4096
}

/// How long after a restart that failed (a reader held an old snapshot for
/// longer than [`restart_busy`] waits) the checkpointer tries again.
const RESTART_RETRY: Duration = Duration::from_secs(1);

/// Held by the writer thread while it commits, and by the checkpointer while
/// it starts the log over, which needs the writer idle.
pub(super) type WriterGate = Arc<Mutex<()>>;

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
pub(super) fn checkpoint_loop(
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
pub(super) fn restart_busy(tries: i32) -> bool {
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
pub(super) fn in_savepoint<T>(
    c: &Connection,
    f: impl FnOnce(&Connection) -> KvResult<T>,
) -> KvResult<T> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::sqlite::{upsert, SQLITE_TABLE};

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
}
