//! The SQLite store's read cache (`tfa_host::readcache`): a read answered
//! from it is never older than the store, whoever wrote the store: this
//! store's own writes, another handle of the same file (as a second host
//! process would be), or any other connection (the `sqlite3` shell).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use tfa_host::kv::{KvBackend, KvEmulation, SqliteKv, WriteOp};
use tfa_host::readcache::MAX_VALUE;

mod support;
use support::TempDir;

/// Reads `key` three times and checks that the last read came from the
/// cache (the first read after someone else's commit drops the cache and
/// keeps nothing; the second fills it).
fn read_cached(kv: &SqliteKv, key: &str) -> Option<Vec<u8>> {
    let first = kv.get(key).unwrap();
    assert_eq!(kv.get(key).unwrap(), first);
    let hits = kv.cache_hits();
    let third = kv.get(key).unwrap();
    assert_eq!(first, third);
    if first.is_some() {
        assert_eq!(
            kv.cache_hits(),
            hits + 1,
            "the third read of {key} was not cached"
        );
    }
    third
}

#[test]
fn reads_are_cached_and_every_own_write_is_seen() {
    let dir = TempDir::new("own");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    kv.set("k", b"one").unwrap();
    assert_eq!(read_cached(&kv, "k").as_deref(), Some(&b"one"[..]));
    kv.set("k", b"two").unwrap();
    assert_eq!(read_cached(&kv, "k").as_deref(), Some(&b"two"[..]));
    // A counter read with `get` (Spin's 8 bytes), then incremented.
    kv.increment("n", 5).unwrap();
    assert_eq!(read_cached(&kv, "n"), Some(5i64.to_le_bytes().to_vec()));
    kv.increment("n", 1).unwrap();
    assert_eq!(kv.get("n").unwrap(), Some(6i64.to_le_bytes().to_vec()));
    // Compare-and-swap, batches and deletes.
    assert!(kv.compare_and_swap("k", b"two", b"three").unwrap());
    assert_eq!(read_cached(&kv, "k").as_deref(), Some(&b"three"[..]));
    kv.set_many(&[("k".into(), b"four".to_vec()), ("j".into(), b"x".to_vec())])
        .unwrap();
    assert_eq!(read_cached(&kv, "k").as_deref(), Some(&b"four"[..]));
    kv.delete_many(&["k".into()]).unwrap();
    assert_eq!(kv.get("k").unwrap(), None);
    kv.set("k", b"five").unwrap();
    read_cached(&kv, "k");
    kv.delete("k").unwrap();
    assert_eq!(kv.get("k").unwrap(), None);
    // The writes the host queues itself.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    read_cached(&kv, "j");
    rt.block_on(
        kv.write_async(WriteOp::Set("j".into(), b"y".to_vec()))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(read_cached(&kv, "j").as_deref(), Some(&b"y"[..]));
    rt.block_on(kv.write_async(WriteOp::Delete("j".into())).unwrap())
        .unwrap();
    assert_eq!(kv.get("j").unwrap(), None);
}

#[test]
fn a_write_by_another_connection_is_seen_at_once() {
    let dir = TempDir::new("foreign");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    kv.set("k", b"ours").unwrap();
    kv.set("other", b"x").unwrap();
    read_cached(&kv, "k");
    read_cached(&kv, "other");
    // What the sqlite3 shell, or another host process, would do.
    let shell = rusqlite::Connection::open(dir.db()).unwrap();
    shell
        .execute("UPDATE kv SET value = X'7468656972' WHERE key = 'k'", [])
        .unwrap();
    assert_eq!(kv.get("k").unwrap().as_deref(), Some(&b"their"[..]));
    shell.execute("DELETE FROM kv WHERE key = 'k'", []).unwrap();
    assert_eq!(kv.get("k").unwrap(), None);
    // Then this store's own write on top of theirs, and theirs again.
    kv.set("k", b"ours again").unwrap();
    assert_eq!(read_cached(&kv, "k").as_deref(), Some(&b"ours again"[..]));
    shell
        .execute("UPDATE kv SET value = X'78' WHERE key = 'k'", [])
        .unwrap();
    assert_eq!(kv.get("k").unwrap().as_deref(), Some(&b"x"[..]));
}

/// Whether a process other than this one would find the log's index in
/// use: SQLite holds a shared lock on its "dead man's switch" byte (byte
/// 128 of the `-shm` file in the unix VFS) while any connection has the
/// index open, and a process that can lock that byte exclusively believes
/// it is the first and rebuilds the index. An open file description lock
/// (`F_OFD_GETLK`) conflicts with this process's own record locks, so the
/// question can be asked from here. `shm` must stay open until the store's
/// connections have closed: closing a descriptor of the file would drop
/// this process's locks on it, the very fault this looks for.
fn index_in_use(shm: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain `flock` value, filled in by the call.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 128;
    lock.l_len = 1;
    // SAFETY: an open descriptor and a valid `flock`.
    let rc = unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_OFD_GETLK, &raw mut lock) };
    assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    lock.l_type != libc::F_UNLCK as libc::c_short
}

/// The cache reads SQLite's index without taking SQLite's locks on it away
/// (until 2026-12-06 it mapped the file through a descriptor of its own
/// and closed it, which dropped them all): another process that opens the
/// database while the store is open finds the index in use.
#[test]
fn the_index_stays_locked_while_the_store_is_open() {
    let dir = TempDir::new("locked");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    let shm = std::fs::File::open(dir.0.join("kv.sqlite3-shm")).unwrap();
    assert!(index_in_use(&shm), "right after the open");
    for i in 0..50u8 {
        kv.set("k", &[i]).unwrap();
        assert_eq!(read_cached(&kv, "k"), Some(vec![i]));
        kv.increment("n", 1).unwrap();
    }
    assert!(kv.cache_hits() > 0, "the cache was in use");
    assert!(index_in_use(&shm), "after reads and writes");
    drop(kv);
    assert!(
        !index_in_use(&shm),
        "the closed store still holds the index"
    );
}

#[test]
fn two_handles_of_one_file_see_each_others_writes() {
    let dir = TempDir::new("handles");
    let a = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    let b = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    for round in 0..20u32 {
        let value = round.to_string().into_bytes();
        a.set("k", &value).unwrap();
        assert_eq!(read_cached(&b, "k"), Some(value.clone()));
        assert_eq!(read_cached(&a, "k"), Some(value));
        let value = format!("b{round}").into_bytes();
        b.set("k", &value).unwrap();
        assert_eq!(a.get("k").unwrap(), Some(value));
    }
}

#[test]
fn large_values_are_read_from_sqlite() {
    let dir = TempDir::new("large");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    let big = vec![7u8; MAX_VALUE + 1];
    kv.set("big", &big).unwrap();
    let hits = kv.cache_hits();
    assert_eq!(kv.get("big").unwrap(), Some(big.clone()));
    assert_eq!(kv.get("big").unwrap(), Some(big));
    assert_eq!(kv.cache_hits(), hits);
}

/// Under concurrency: writers (this store's, and another connection's)
/// publish each value once its write has returned; readers, on several
/// threads, check that a read begun after that never answers an older
/// value, while the cache answers most reads.
#[test]
fn no_read_is_older_than_a_write_that_returned() {
    let dir = TempDir::new("race");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    kv.set("ours", b"0").unwrap();
    kv.set("theirs", b"0").unwrap();
    const WRITES: u64 = 300;
    let done = Arc::new(AtomicBool::new(false));
    let acked = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let own = {
        let (kv, acked) = (kv.clone(), acked.clone());
        thread::spawn(move || {
            for i in 1..=WRITES {
                kv.set("ours", i.to_string().as_bytes()).unwrap();
                acked[0].store(i, Ordering::SeqCst);
            }
        })
    };
    let foreign = {
        let (db, acked) = (dir.db(), acked.clone());
        thread::spawn(move || {
            let c = rusqlite::Connection::open(db).unwrap();
            c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
            for i in 1..=WRITES {
                c.execute(
                    "UPDATE kv SET value = ?1 WHERE key = 'theirs'",
                    [i.to_string().into_bytes()],
                )
                .unwrap();
                acked[1].store(i, Ordering::SeqCst);
            }
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (kv, acked, done) = (kv.clone(), acked.clone(), done.clone());
            thread::spawn(move || {
                let mut reads = 0u64;
                while !done.load(Ordering::SeqCst) {
                    for (i, key) in ["ours", "theirs"].into_iter().enumerate() {
                        let floor = acked[i].load(Ordering::SeqCst);
                        let v = kv.get(key).unwrap().unwrap();
                        let v: u64 = std::str::from_utf8(&v).unwrap().parse().unwrap();
                        assert!(v >= floor, "{key}: read {v} after {floor} was written");
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    own.join().unwrap();
    foreign.join().unwrap();
    done.store(true, Ordering::SeqCst);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 0);
    assert_eq!(kv.get("ours").unwrap().as_deref(), Some(b"300".as_slice()));
    assert_eq!(
        kv.get("theirs").unwrap().as_deref(),
        Some(b"300".as_slice())
    );
    // With nobody writing, reads come from the cache again.
    read_cached(&kv, "ours");
    read_cached(&kv, "theirs");
}
