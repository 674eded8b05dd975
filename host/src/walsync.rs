//! Durability at the response: one fsync of SQLite's write-ahead log makes
//! every commit before it survive power loss, so the store's writes commit
//! without one (`synchronous=NORMAL`) and a request waits for a sync only
//! once, before its answer leaves ([`crate::kv::KvBackend::durable`]).
//!
//! # Why this is as safe as `synchronous=FULL`
//!
//! * SIGKILL: a commit's frames are in the WAL file (the kernel's page
//!   cache) when `COMMIT` returns, in both modes.
//! * Power loss: in WAL mode the only sync that `FULL` adds over `NORMAL` is
//!   one of the WAL file after each commit (SQLite's docs, `PRAGMA
//!   synchronous`; checkpoints and the WAL header are synced in both). The
//!   WAL is appended to in commit order, so one `fdatasync` of it covers
//!   every commit that ended before the sync began. This module makes that
//!   sync on its own handle of the same file (an fsync acts on the file, not
//!   on the descriptor).
//! * Nobody is told of a write before it is durable: the host holds every
//!   response of a request that touched the store (reads too: a read may
//!   have seen another request's write that is not durable yet) until a
//!   sync that began after the request's last store operation has ended.
//!
//! Writes a request makes after its response (audit records, expiry
//! filings) are acknowledged to nobody; the sync thread makes them durable
//! within [`IDLE_SYNC`] anyway.
//!
//! # Steps
//!
//! 1. The writer thread calls [`WalSync::begin_commit`] before each batch's
//!    `BEGIN` and [`WalSync::end_commit`] after its `COMMIT`.
//! 2. A request's barrier first checks [`WalSync::pending`]: when every
//!    commit begun so far is synced, there is nothing to wait for.
//! 3. Otherwise it queues behind the writer (so that a commit in flight,
//!    whose rows a reader may already see, ends first) and the writer hands
//!    it to the sync thread with [`WalSync::wait`].
//! 4. The sync thread takes every waiter that has arrived, reads how many
//!    commits have ended, syncs the WAL once, and answers them all (group
//!    commit of barriers). A failed sync fails every barrier from then on:
//!    after a failed fsync the kernel may have dropped the pages, and a
//!    later successful one proves nothing about them.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::kv::{KvError, KvResult};

/// The longest a write nobody waits for stays unsynced.
pub const IDLE_SYNC: Duration = Duration::from_millis(100);

/// A request waiting for durability.
pub type Waiter = tokio::sync::oneshot::Sender<KvResult<()>>;

/// Commit and sync counts, shared by the writer, the sync thread and the
/// requests' barriers.
pub struct WalSync {
    /// Commits begun (bumped before `BEGIN`).
    begun: AtomicU64,
    /// Commits ended (`COMMIT` returned or failed).
    ended: AtomicU64,
    /// Commits known durable: all that had ended when the last successful
    /// sync began.
    synced: AtomicU64,
    /// Syncs performed (the tests count them).
    syncs: AtomicU64,
    /// The first failed sync: every barrier fails from then on.
    failed: OnceLock<KvError>,
    /// The sync thread's queue.
    queue: Sender<Vec<Waiter>>,
    /// Test hook: the next syncs fail.
    #[cfg(test)]
    pub(crate) inject_failure: std::sync::atomic::AtomicBool,
}

impl WalSync {
    /// Starts the sync thread for the write-ahead log `wal` (a handle of
    /// SQLite's `-wal` file, kept open for the store's life).
    pub fn start(wal: File) -> KvResult<Arc<WalSync>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let sync = Arc::new(WalSync {
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            failed: OnceLock::new(),
            queue: tx,
            #[cfg(test)]
            inject_failure: std::sync::atomic::AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&sync);
        std::thread::Builder::new()
            .name("tfa-kv-sync".into())
            .spawn(move || sync_loop(wal, rx, weak))
            .map_err(|e| KvError(format!("sqlite: cannot start the sync thread: {e}")))?;
        Ok(sync)
    }

    /// Step 1: a commit begins.
    pub fn begin_commit(&self) {
        self.begun.fetch_add(1, Ordering::SeqCst);
    }

    /// Step 1: the commit begun last has ended (committed or not).
    pub fn end_commit(&self) {
        self.ended.fetch_add(1, Ordering::SeqCst);
    }

    /// Step 2: `Ok(false)` when every commit begun so far is durable (a
    /// barrier need not wait); the first sync failure otherwise.
    pub fn pending(&self) -> KvResult<bool> {
        if let Some(e) = self.failed.get() {
            return Err(e.clone());
        }
        Ok(self.synced.load(Ordering::SeqCst) < self.begun.load(Ordering::SeqCst))
    }

    /// Step 3: hands `waiters` to the sync thread; the writer calls it
    /// after the commits before them have ended.
    pub fn wait(&self, waiters: Vec<Waiter>) {
        if let Err(std::sync::mpsc::SendError(waiters)) = self.queue.send(waiters) {
            for w in waiters {
                let _ = w.send(Err(KvError("sqlite: the sync thread has stopped".into())));
            }
        }
    }

    /// How many syncs of the WAL have run.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::SeqCst)
    }

    /// Step 4, once: syncs `wal` when a commit ended since the last sync.
    fn sync_now(&self, wal: &File) -> KvResult<()> {
        if let Some(e) = self.failed.get() {
            return Err(e.clone());
        }
        let ended = self.ended.load(Ordering::SeqCst);
        if ended <= self.synced.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.syncs.fetch_add(1, Ordering::SeqCst);
        #[cfg(test)]
        if self.inject_failure.load(Ordering::SeqCst) {
            return Err(self.fail(std::io::Error::other("injected sync failure")));
        }
        match wal.sync_data() {
            Ok(()) => {
                self.synced.fetch_max(ended, Ordering::SeqCst);
                if let Some(m) = crate::metrics::get() {
                    m.store_syncs.inc();
                }
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn fail(&self, e: std::io::Error) -> KvError {
        let e = KvError(format!(
            "sqlite: syncing the write-ahead log failed ({e}); no response that used the store is sent from now on"
        ));
        eprintln!("tfa-host: {e}");
        self.failed.get_or_init(|| e).clone()
    }
}

/// The sync thread (step 4). Also syncs, every [`IDLE_SYNC`], writes that
/// nobody waits for. Ends when the store is gone, after a last sync.
fn sync_loop(wal: File, queue: Receiver<Vec<Waiter>>, sync: std::sync::Weak<WalSync>) {
    loop {
        let mut waiters = match queue.recv_timeout(IDLE_SYNC) {
            Ok(w) => w,
            Err(RecvTimeoutError::Timeout) => Vec::new(),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = wal.sync_data();
                return;
            }
        };
        while let Ok(more) = queue.try_recv() {
            waiters.extend(more);
        }
        let Some(sync) = sync.upgrade() else {
            let _ = wal.sync_data();
            return;
        };
        let out = sync.sync_now(&wal);
        for w in waiters {
            let _ = w.send(out.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kv::{KvBackend, KvEmulation, SqliteKv, WriteOp};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    fn store(name: &str) -> (Arc<SqliteKv>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("tfa-walsync-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (
            Arc::new(SqliteKv::open_dir(&dir, KvEmulation::Spin402).unwrap()),
            dir,
        )
    }

    async fn write(kv: &SqliteKv, key: &str) {
        let op = WriteOp::Set(key.into(), b"v".to_vec());
        match kv.write_async(op) {
            Ok(f) => f.await.unwrap(),
            Err(_) => panic!("the SQLite store queues its writes itself"),
        };
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_barrier_waits_for_one_sync_of_what_was_written() {
        let (kv, dir) = store("one");
        // Nothing written since the open: nothing to wait for.
        assert!(kv.durable().is_none());
        write(&kv, "a").await;
        // Committed and visible before it is durable...
        assert_eq!(kv.get("a").unwrap().as_deref(), Some(&b"v"[..]));
        // ...and a barrier after it (a writer's, or a reader's who saw it)
        // waits for a sync.
        let before = kv.sync.syncs();
        kv.durable().expect("a write is pending").await.unwrap();
        assert_eq!(kv.sync.syncs(), before + 1);
        assert!(kv.durable().is_none(), "nothing written since the sync");
        // A read changes nothing; a counter read (increment by 0) neither.
        assert_eq!(kv.increment("n", 0).unwrap(), 0);
        assert!(kv.durable().is_none());
        // Writes nobody waits for are synced within IDLE_SYNC.
        write(&kv, "b").await;
        let waited = crate::now();
        while kv.durable().is_some() {
            assert!(waited.elapsed() < super::IDLE_SYNC * 50, "never synced");
            tokio::time::sleep(super::IDLE_SYNC / 4).await;
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_barriers_all_see_their_writes_durable() {
        let (kv, dir) = store("many");
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let kv = kv.clone();
                tokio::spawn(async move {
                    write(&kv, &format!("k{i}")).await;
                    // The commit that holds this write has begun (and ended).
                    let mine = kv.sync.begun.load(Ordering::SeqCst);
                    if let Some(d) = kv.durable() {
                        d.await.unwrap();
                    }
                    // The barrier covered it: a sync that began after it
                    // has ended.
                    let synced = kv.sync.synced.load(Ordering::SeqCst);
                    assert!(synced >= mine, "task {i}: synced {synced} < {mine}");
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(kv.sync.syncs() >= 1);
        assert_eq!(kv.keys().unwrap().len(), 64);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_sync_fails_every_barrier_after_it() {
        let (kv, dir) = store("fail");
        write(&kv, "a").await;
        kv.sync.inject_failure.store(true, Ordering::SeqCst);
        let e = kv.durable().expect("pending").await.unwrap_err();
        assert!(e.0.contains("syncing the write-ahead log failed"), "{e}");
        kv.sync.inject_failure.store(false, Ordering::SeqCst);
        // Final: later syncs could succeed without the lost pages.
        write(&kv, "b").await;
        let again = kv.durable().expect("a failed store never says durable");
        assert_eq!(again.await.unwrap_err(), e);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn what_is_written_is_there_after_a_reopen() {
        let (kv, dir) = store("reopen");
        kv.set("a", b"1").unwrap();
        kv.increment("n", 5).unwrap();
        drop(kv);
        // Reopened in both modes: with `none` the open writes nothing, and
        // the write-ahead log (gone when the last connection closed) must
        // still be there for the sync thread to open.
        for emulation in [KvEmulation::None, KvEmulation::Spin402] {
            let wal = dir.join("kv.sqlite3-wal");
            let t = crate::now();
            while wal.exists() && t.elapsed() < std::time::Duration::from_secs(5) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(!wal.exists(), "the log outlived its last connection");
            let kv = SqliteKv::open_dir(&dir, emulation).unwrap();
            assert_eq!(kv.get("a").unwrap().as_deref(), Some(&b"1"[..]));
            kv.set("b", b"2").unwrap();
            assert!(kv.durable().is_some());
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
