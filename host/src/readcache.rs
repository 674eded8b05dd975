//! A bounded cache of values read from the SQLite store, in front of its
//! reader connections ([`crate::kv::SqliteKv`]'s `get`).
//!
//! A `GET /auth/me` reads two records, and each read on a reader connection
//! costs a read transaction: SQLite takes and releases a read mark of the
//! write-ahead log's index (two `fcntl` calls on the `-shm` file), finds the
//! page and copies the value out. Most reads are of records nobody changed
//! since the last read (a session's and its user's, read with every request
//! the session makes), so this cache answers them from memory. It must never
//! answer a value the store no longer holds, whoever changed it:
//!
//! * **This store's own writes.** While a batch of the writer thread
//!   commits, no read uses the cache and none fills it; when it has
//!   committed, its keys are dropped before any of its writes is answered.
//!   A read that missed keeps what it read only if no batch began or ended
//!   while it read (an epoch, bumped by both), so a value read before a
//!   commit is never kept after it.
//! * **Anyone else's writes** (another process, another handle of the same
//!   file, the `sqlite3` shell): every commit to a database in WAL mode, by
//!   any connection of any process, rewrites the header of the write-ahead
//!   log's index at the start of the `-shm` file (the last frame's number,
//!   checksums, and salts that change when the log starts over; SQLite's
//!   file format, "WAL-Index Format"). The cache remembers the header as
//!   this store's own last commit left it, and every read compares the
//!   current one (from SQLite's own mapping of the file, through a
//!   connection the cache keeps, see `ShmHeader`; both copies, as SQLite's
//!   own readers read it without a lock): when they differ and
//!   no batch of ours is committing, someone else has committed, and the
//!   whole cache is dropped before anything is answered from it.
//!
//! # Steps
//!
//! 1. The writer calls [`ReadCache::begin`] before a batch's `BEGIN
//!    IMMEDIATE`, and [`ReadCache::header`] once it holds the write lock:
//!    from then until its `COMMIT`, no other connection can commit.
//! 2. After `COMMIT` (or the rollback), it calls [`ReadCache::end`] with the
//!    batch's keys, that header, and the frame count SQLite's WAL hook
//!    reported for the commit. When the header under the lock is the one
//!    remembered, and the header now is that one plus exactly this commit
//!    (its last frame, the same salts), only the batch's keys are dropped.
//!    Otherwise someone else committed before the lock or after the commit
//!    (or the log started over) and the whole cache is dropped. Either way
//!    the header now is remembered.
//! 3. A read ([`ReadCache::lookup`]): bypass while a batch commits; drop
//!    everything and bypass when the header is not the remembered one;
//!    else answer a cached value, or read SQLite and offer the value
//!    ([`ReadCache::fill`]), which keeps it if the epoch and the header are
//!    still those of the lookup.
//!
//! Anything unexpected (the index cannot be mapped, the two copies of
//! the header differ because a commit is writing them) sends the read to
//! SQLite, so the cache can make a read cheaper, never different. It holds
//! at most [`SLOTS`] values of at most [`MAX_VALUE`] bytes (direct-mapped on
//! the key's hash; a newer key takes its slot over). Counters, `exists` and
//! `get-many` are not cached.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Values the cache holds at most.
pub const SLOTS: usize = 2048;

/// The largest value it keeps (a user record holding many sessions is
/// larger and is read from SQLite each time). With [`SLOTS`], the cache
/// holds at most 16 MiB.
pub const MAX_VALUE: usize = 8 * 1024;

/// Bytes of one copy of the WAL-index header.
const HEADER: usize = 48;

/// One cached value.
#[derive(Default)]
struct Slot {
    key: String,
    value: Vec<u8>,
}

/// What a read compares before it uses the cache.
struct State {
    /// A batch of this store's writer is committing.
    committing: bool,
    /// Bumped when a batch begins and when it ends, and when a foreign
    /// commit is seen.
    epoch: u64,
    /// The WAL-index header as this store's last commit left it (or as the
    /// last foreign commit seen left it).
    header: [u8; HEADER],
}

/// The cache (see the module documentation).
pub struct ReadCache {
    state: Mutex<State>,
    slots: Box<[Mutex<Slot>]>,
    shm: ShmHeader,
    hits: AtomicU64,
}

/// What [`ReadCache::lookup`] found.
pub enum Lookup {
    /// The value, current.
    Hit(Vec<u8>),
    /// Not cached: read SQLite, then offer the value to [`ReadCache::fill`]
    /// with this ticket.
    Miss(Ticket),
    /// Read SQLite, keep nothing.
    Bypass,
}

/// The epoch a missed read began in.
pub struct Ticket(u64);

impl ReadCache {
    /// A cache for the database `conn` has open in WAL mode; the cache
    /// keeps the connection, unused, for the mapping of the log's index it
    /// reads (see `ShmHeader`). `None` when the index cannot be mapped:
    /// the store then reads SQLite every time.
    pub fn open(conn: rusqlite::Connection) -> Option<ReadCache> {
        let shm = ShmHeader::map(conn)?;
        let header = shm.read()?;
        Some(ReadCache {
            state: Mutex::new(State {
                committing: false,
                epoch: 0,
                header,
            }),
            slots: (0..SLOTS).map(|_| Mutex::new(Slot::default())).collect(),
            shm,
            hits: AtomicU64::new(0),
        })
    }

    /// Reads answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(&self, key: &str) -> std::sync::MutexGuard<'_, Slot> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let i = (h.finish() % SLOTS as u64) as usize;
        self.slots[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops every value (a foreign commit was seen).
    fn clear(&self) {
        for s in self.slots.iter() {
            *s.lock().unwrap_or_else(|p| p.into_inner()) = Slot::default();
        }
    }

    /// Whether the cache may be used now; the epoch it is valid in.
    fn current(&self) -> Option<u64> {
        let mut st = self.state();
        if st.committing {
            return None;
        }
        let now = self.shm.read()?;
        if now != st.header {
            // Someone else committed: nothing cached can be trusted.
            st.header = now;
            st.epoch = st.epoch.wrapping_add(1);
            self.clear();
            return None;
        }
        Some(st.epoch)
    }

    /// Step 1 of a read of `key`.
    pub fn lookup(&self, key: &str) -> Lookup {
        let Some(epoch) = self.current() else {
            return Lookup::Bypass;
        };
        let slot = self.slot(key);
        if slot.key == key {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Hit(slot.value.clone());
        }
        Lookup::Miss(Ticket(epoch))
    }

    /// Step 2 of a read that missed: keeps `value`, read from SQLite after
    /// the lookup, if nothing committed since the lookup.
    pub fn fill(&self, key: &str, value: &[u8], ticket: Ticket) {
        if value.len() > MAX_VALUE {
            return;
        }
        // The state stays locked while the slot is written, so no batch can
        // begin in between.
        let st = self.state();
        if st.committing || st.epoch != ticket.0 || self.shm.read() != Some(st.header) {
            return;
        }
        let mut slot = self.slot(key);
        slot.key.clear();
        slot.key.push_str(key);
        slot.value.clear();
        slot.value.extend_from_slice(value);
    }

    /// The writer thread, before a batch's `BEGIN`: no read uses the cache
    /// until [`ReadCache::end`].
    pub fn begin(&self) {
        let mut st = self.state();
        st.committing = true;
        st.epoch = st.epoch.wrapping_add(1);
    }

    /// The log's header now, for the writer thread to read once its `BEGIN
    /// IMMEDIATE` holds the write lock (no other connection can commit
    /// until its `COMMIT`).
    pub fn header(&self) -> Option<Header> {
        self.shm.read().map(Header)
    }

    /// The writer thread, after the batch's `COMMIT` or rollback and before
    /// it answers any write of it. `keys` are the batch's; `locked` is
    /// [`ReadCache::header`] read under the write lock (`None`: `BEGIN`
    /// failed); `frames` the log's frame count after the commit as SQLite's
    /// WAL hook reported it (`None`: no frame was written). Drops `keys`
    /// and records the header. When anything else may have committed
    /// between this store's last commit and its lock, or after this commit,
    /// or the log started over, the whole cache is dropped instead: a
    /// header that changed in any unforeseen way costs the cache's
    /// contents, never a stale answer.
    pub fn end<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        locked: Option<Header>,
        frames: Option<u32>,
    ) {
        let mut st = self.state();
        let now = self.shm.read();
        let ours = match (locked, now) {
            (Some(Header(locked)), Some(now)) => {
                locked == st.header
                    && match frames {
                        Some(n) => mx_frame(&now) == n && salts(&now) == salts(&locked),
                        None => now == locked,
                    }
            }
            (None, Some(now)) => now == st.header,
            (_, None) => false,
        };
        if ours {
            for key in keys {
                let mut slot = self.slot(key);
                if slot.key == key {
                    *slot = Slot::default();
                }
            }
        } else {
            self.clear();
        }
        // Unreadable now: the next read sees a difference and bypasses.
        st.header = now.unwrap_or([0; HEADER]);
        st.epoch = st.epoch.wrapping_add(1);
        st.committing = false;
    }
}

/// The WAL-index header read by the writer under the write lock.
#[derive(Clone, Copy)]
pub struct Header([u8; HEADER]);

/// `mxFrame`: the index of the last valid frame in the log (bytes 16..20,
/// native byte order).
fn mx_frame(h: &[u8; HEADER]) -> u32 {
    u32::from_ne_bytes([h[16], h[17], h[18], h[19]])
}

/// `aSalt`: changed each time the log starts over (bytes 32..40).
fn salts(h: &[u8; HEADER]) -> &[u8] {
    &h[32..40]
}

/// The start of the log's index as SQLite itself maps it for one
/// connection of the cache's own.
///
/// The cache never opens the `-shm` file itself: POSIX record locks belong
/// to the process, and closing *any* descriptor of a file drops every lock
/// the process holds on it. Until 2026-12-06 the cache opened the file,
/// mapped it and closed its descriptor, which dropped the shared lock that
/// tells other processes the index is in use. A process opening the
/// database after that (the `sqlite3` shell, a backup) could believe it was
/// the first, and rebuild or truncate the index under this host's feet; and
/// this store's last connection, closing, could not always clean up its log.
struct ShmHeader {
    /// SQLite's mapping of the index's first 32 KiB region.
    ptr: *const u8,
    /// The connection that mapping belongs to: SQLite keeps it mapped, and
    /// its locks held, until the connection closes. Never used after
    /// [`ShmHeader::map`]; the mutex only makes it `Sync`.
    _conn: Mutex<rusqlite::Connection>,
}

// The mapping is only read, with volatile reads, and lives as long as the
// connection beside it.
unsafe impl Send for ShmHeader {}
unsafe impl Sync for ShmHeader {}

/// Bytes of one region of the log's index: SQLite maps it in regions of
/// this size (`WALINDEX_PGSZ`), and asks for no other.
const SHM_REGION: std::ffi::c_int = 32 * 1024;

impl ShmHeader {
    /// Maps the index of the database `conn` has open in WAL mode, through
    /// SQLite's own shared-memory method; `None` when the VFS has none or
    /// the index does not exist yet.
    fn map(conn: rusqlite::Connection) -> Option<ShmHeader> {
        use rusqlite::ffi;
        // A read transaction opens the log and maps its index.
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
            .ok()?;
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: `conn` is open and used by no one else; the file-pointer
        // control writes the main database's `sqlite3_file` into `file`.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return None;
        }
        // SAFETY: `file` is the open database file SQLite just gave; its
        // methods table is SQLite's and outlives the connection. Version 2
        // and above have the shared-memory methods. Region 0 is mapped
        // already (the read above), so this only returns it; `bExtend` 0
        // never grows the file.
        let region = unsafe {
            let methods = (*file).pMethods;
            if methods.is_null() || (*methods).iVersion < 2 {
                return None;
            }
            let shm_map = (*methods).xShmMap?;
            let mut region: *mut std::ffi::c_void = std::ptr::null_mut();
            if shm_map(file, 0, SHM_REGION, 0, &raw mut region) != ffi::SQLITE_OK {
                return None;
            }
            region
        };
        (!region.is_null()).then(|| ShmHeader {
            ptr: region.cast_const().cast(),
            _conn: Mutex::new(conn),
        })
    }

    /// The header when both copies agree and it is initialised (`isInit`,
    /// byte 12); `None` while a commit is writing it.
    fn read(&self) -> Option<[u8; HEADER]> {
        let copy = |at: usize| {
            let mut out = [0u8; HEADER];
            for (i, b) in out.iter_mut().enumerate() {
                // SAFETY: `at + i < 2 * HEADER`, inside the mapped region;
                // another connection or process may write it at any time,
                // hence volatile.
                *b = unsafe { std::ptr::read_volatile(self.ptr.add(at + i)) };
            }
            out
        };
        let first = copy(0);
        std::sync::atomic::fence(Ordering::Acquire);
        let second = copy(HEADER);
        (first == second && first[12] != 0).then_some(first)
    }
}

#[cfg(test)]
mod tests {
    //! The writer's steps driven by hand on real SQLite connections: what
    //! `end` keeps depends on reading SQLite's header where its file format
    //! puts it.
    use super::*;
    use std::path::Path;
    use std::sync::atomic::AtomicU32;

    /// The frame count of the last commit of a connection with [`hook`].
    static FRAMES: AtomicU32 = AtomicU32::new(0);

    fn hook(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
        FRAMES.store(frames as u32, Ordering::SeqCst);
        Ok(())
    }

    fn open(dir: &Path) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(dir.join("db")).unwrap();
        c.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
            .unwrap();
        c.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
        c
    }

    fn set(c: &rusqlite::Connection, k: &str, v: &str) {
        c.execute(crate::kv::SQLITE_UPSERT, [k, v]).unwrap();
    }

    /// Reads `k` through the cache as the store does: `hit` or filled.
    fn read(cache: &ReadCache, c: &rusqlite::Connection, k: &str) -> (String, bool) {
        let ticket = match cache.lookup(k) {
            Lookup::Hit(v) => return (String::from_utf8(v).unwrap(), true),
            Lookup::Miss(t) => Some(t),
            Lookup::Bypass => None,
        };
        let v: String = c
            .query_row("SELECT value FROM kv WHERE key = ?1", [k], |r| r.get(0))
            .unwrap();
        if let Some(t) = ticket {
            cache.fill(k, v.as_bytes(), t);
        }
        (v, false)
    }

    /// One batch of "our" writer on `c`, and a commit of `foreign` right
    /// after its COMMIT, before `end`, when `then` is given.
    fn batch(
        cache: &ReadCache,
        c: &rusqlite::Connection,
        k: &str,
        v: &str,
        then: Option<(&rusqlite::Connection, &str, &str)>,
    ) {
        cache.begin();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        let locked = cache.header();
        set(c, k, v);
        c.execute_batch("COMMIT").unwrap();
        if let Some((f, k, v)) = then {
            set(f, k, v);
        }
        cache.end([k], locked, Some(FRAMES.load(Ordering::SeqCst)));
    }

    #[test]
    fn own_commits_drop_their_keys_and_foreign_ones_everything() {
        let dir = std::env::temp_dir().join(format!("tfa-readcache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ours = open(&dir);
        ours.execute_batch("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID")
            .unwrap();
        set(&ours, "a", "1");
        set(&ours, "b", "1");
        ours.wal_hook(Some(hook));
        let theirs = open(&dir);
        let cache = ReadCache::open(open(&dir)).expect("the index maps");
        assert_eq!(read(&cache, &ours, "a"), ("1".into(), false));
        assert_eq!(read(&cache, &ours, "a"), ("1".into(), true));
        assert_eq!(read(&cache, &ours, "b"), ("1".into(), false));
        assert_eq!(read(&cache, &ours, "b"), ("1".into(), true));

        // Our own commit of `b`: `a` stays cached (the header is read where
        // SQLite writes it, or this commit would have dropped everything).
        batch(&cache, &ours, "b", "2", None);
        assert_eq!(read(&cache, &ours, "a"), ("1".into(), true));
        assert_eq!(read(&cache, &ours, "b"), ("2".into(), false));
        assert_eq!(read(&cache, &ours, "b"), ("2".into(), true));

        // Someone else commits `a` between our COMMIT and `end`.
        batch(&cache, &ours, "b", "3", Some((&theirs, "a", "theirs")));
        assert_eq!(read(&cache, &ours, "a"), ("theirs".into(), false));

        // Someone else commits while nothing of ours is committing.
        assert_eq!(read(&cache, &ours, "a"), ("theirs".into(), true));
        set(&theirs, "a", "again");
        assert_eq!(read(&cache, &ours, "a"), ("again".into(), false));

        // Someone else commits before our batch takes the write lock.
        assert_eq!(read(&cache, &ours, "a"), ("again".into(), false));
        assert_eq!(read(&cache, &ours, "a"), ("again".into(), true));
        cache.begin();
        set(&theirs, "a", "before");
        ours.execute_batch("BEGIN IMMEDIATE").unwrap();
        let locked = cache.header();
        set(&ours, "b", "4");
        ours.execute_batch("COMMIT").unwrap();
        cache.end(["b"], locked, Some(FRAMES.load(Ordering::SeqCst)));
        assert_eq!(read(&cache, &ours, "a"), ("before".into(), false));

        // While a batch commits, nothing is answered from the cache.
        assert_eq!(read(&cache, &ours, "a"), ("before".into(), true));
        cache.begin();
        assert_eq!(read(&cache, &ours, "a"), ("before".into(), false));
        cache.end(["b"], None, None);
        assert_eq!(read(&cache, &ours, "a"), ("before".into(), true));
        drop((ours, theirs));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
