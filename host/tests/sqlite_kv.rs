//! The SQLite backend's guarantees. With `KV_EMULATE=none` (this host's own
//! semantics): atomic increments and compare-and-swap under concurrency,
//! CAS on a missing key fails, data survives reopening. With the default
//! `spin-4.0.2`: what Spin 4.0.2's SQLite store does (8-byte counters, CAS
//! on a missing key writes, get-many answers existing keys only), and data
//! written in the old format keeps working.

use std::sync::{Arc, Barrier};
use std::thread;

use tfa_host::kv::{FailingKv, KvBackend, KvEmulation, SqliteKv, WriteOp};

mod support;
use support::TempDir;

#[test]
fn concurrent_increments_are_not_lost() {
    let dir = TempDir::new("incr");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    const THREADS: usize = 8;
    const EACH: usize = 1000;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let kv = kv.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let mut seen = Vec::with_capacity(EACH);
                for _ in 0..EACH {
                    seen.push(kv.increment("counter", 1).unwrap());
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    // Every increment returned a distinct value: 1..=8000.
    let expected: Vec<i64> = (1..=(THREADS * EACH) as i64).collect();
    assert_eq!(all, expected);
    assert_eq!(kv.increment("counter", 0).unwrap(), (THREADS * EACH) as i64);
    // A counter reads back as its digits.
    assert_eq!(kv.get("counter").unwrap().unwrap(), b"8000".to_vec());
    // Negative deltas and a fresh counter.
    assert_eq!(kv.increment("other", -3).unwrap(), -3);
}

#[test]
fn increment_refuses_a_non_counter() {
    let dir = TempDir::new("notcounter");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    kv.set("plain", b"hello").unwrap();
    assert!(kv.increment("plain", 1).is_err());
    assert_eq!(kv.get("plain").unwrap().unwrap(), b"hello".to_vec());
}

#[test]
fn compare_and_swap_has_exactly_one_winner() {
    let dir = TempDir::new("cas");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    for round in 0..20 {
        let key = format!("k{round}");
        kv.set(&key, b"old").unwrap();
        const THREADS: usize = 8;
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let kv = kv.clone();
                let barrier = barrier.clone();
                let key = key.clone();
                thread::spawn(move || {
                    barrier.wait();
                    kv.compare_and_swap(&key, b"old", format!("new{i}").as_bytes())
                        .unwrap()
                })
            })
            .collect();
        let results: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<usize> = (0..THREADS).filter(|&i| results[i]).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let value = kv.get(&key).unwrap().unwrap();
        assert_eq!(value, format!("new{}", winners[0]).into_bytes());
    }
}

#[test]
fn compare_and_swap_semantics() {
    let dir = TempDir::new("cas-missing");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    // Missing key: fails and writes nothing.
    assert!(!kv.compare_and_swap("missing", b"", b"x").unwrap());
    assert!(!kv.compare_and_swap("missing", b"a", b"x").unwrap());
    assert_eq!(kv.get("missing").unwrap(), None);
    // Different value: fails.
    kv.set("k", b"a").unwrap();
    assert!(!kv.compare_and_swap("k", b"b", b"x").unwrap());
    assert_eq!(kv.get("k").unwrap().unwrap(), b"a".to_vec());
    // Equal value: swaps.
    assert!(kv.compare_and_swap("k", b"a", b"x").unwrap());
    assert_eq!(kv.get("k").unwrap().unwrap(), b"x".to_vec());
    // A counter never equals bytes.
    kv.increment("n", 5).unwrap();
    assert!(!kv.compare_and_swap("n", b"5", b"x").unwrap());
}

#[test]
fn data_survives_reopening() {
    let dir = TempDir::new("reopen");
    {
        let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
        kv.set("a", b"1").unwrap();
        kv.set("b", &[0, 255, 7]).unwrap();
        kv.increment("c", 41).unwrap();
        kv.set("gone", b"x").unwrap();
        kv.delete("gone").unwrap();
        kv.delete("never-there").unwrap();
    }
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    assert_eq!(kv.get("a").unwrap().unwrap(), b"1".to_vec());
    assert_eq!(kv.get("b").unwrap().unwrap(), vec![0, 255, 7]);
    assert_eq!(kv.increment("c", 1).unwrap(), 42);
    assert_eq!(kv.get("gone").unwrap(), None);
    assert!(kv.exists("a").unwrap());
    assert!(!kv.exists("gone").unwrap());
    assert_eq!(kv.keys().unwrap(), ["a", "b", "c"]);
    let many = kv
        .get_many(&["b".into(), "nope".into(), "a".into()])
        .unwrap();
    assert_eq!(many, vec![Some(vec![0, 255, 7]), None, Some(b"1".to_vec())]);
    kv.set_many(&[("x".into(), b"1".to_vec()), ("y".into(), b"2".to_vec())])
        .unwrap();
    kv.delete_many(&["x".into()]).unwrap();
    assert_eq!(kv.keys().unwrap(), ["a", "b", "c", "y"]);
    // The file is in WAL mode.
    assert!(dir.db().exists());
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert!(!without_rowid(&dir), "a new store's table is a rowid table");
}

/// Whether the store's table in `dir` is `WITHOUT ROWID` (the form before
/// 2026-12-06).
fn without_rowid(dir: &TempDir) -> bool {
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let wr: i64 = conn
        .query_row(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = 'kv'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    wr == 1
}

/// A store created before 2026-12-06 has a `WITHOUT ROWID` table. Two hosts
/// opening it at the same moment move its records into a rowid table once
/// (one of them does, the other waits and finds it done), and every record
/// reads as before: values larger than a page, empty ones, Spin's counters.
#[test]
fn a_without_rowid_store_moves_into_a_rowid_table() {
    let dir = TempDir::new("without-rowid");
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let user = |i: u32| (format!("user:{i:04}"), vec![(i % 256) as u8; 1_500]);
    {
        let c = rusqlite::Connection::open(dir.db()).unwrap();
        let mode: String = c
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        c.execute_batch(
            "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
        let mut st = c
            .prepare("INSERT INTO kv (key, value) VALUES (?1, ?2)")
            .unwrap();
        for i in 0..500 {
            let (k, v) = user(i);
            st.execute(rusqlite::params![k, v]).unwrap();
        }
        st.execute(rusqlite::params!["big", big]).unwrap();
        st.execute(rusqlite::params!["counter", 41i64.to_le_bytes().to_vec()])
            .unwrap();
        st.execute(rusqlite::params!["empty", Vec::<u8>::new()])
            .unwrap();
    }
    assert!(without_rowid(&dir));
    let start = Arc::new(Barrier::new(2));
    let opened: Vec<SqliteKv> = (0..2)
        .map(|_| {
            let (start, dir) = (start.clone(), dir.0.clone());
            thread::spawn(move || {
                start.wait();
                SqliteKv::open_dir(&dir, KvEmulation::Spin402).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(!without_rowid(&dir));
    for kv in &opened {
        for i in 0..500 {
            let (k, v) = user(i);
            assert_eq!(kv.get(&k).unwrap(), Some(v), "{k}");
        }
        assert_eq!(kv.get("big").unwrap(), Some(big.clone()));
        assert_eq!(kv.get("empty").unwrap(), Some(Vec::new()));
        assert_eq!(kv.keys().unwrap().len(), 503);
    }
    assert_eq!(opened[0].increment("counter", 1).unwrap(), 42);
    assert_eq!(opened[1].increment("counter", 1).unwrap(), 43);
    opened[1].set("new", b"v").unwrap();
    opened[0].delete("user:0000").unwrap();
    drop(opened);
    // Reopened: nothing to move, nothing lost.
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert!(!without_rowid(&dir));
    assert_eq!(kv.increment("counter", 0).unwrap(), 43);
    assert_eq!(kv.get("new").unwrap(), Some(b"v".to_vec()));
    assert_eq!(kv.get("user:0000").unwrap(), None);
    assert_eq!(kv.get("user:0499").unwrap(), Some(user(499).1));
    assert_eq!(kv.keys().unwrap().len(), 503);
}

/// Dropping the store closes its file before the drop returns: the last
/// connection's close has copied the log into the database and removed it,
/// and the same path opens again at once with everything written. (With the
/// writer and checkpointer threads left to end on their own, the log was
/// still there after the drop, and an open right after it failed now and
/// then with `disk I/O error`.)
#[test]
fn a_dropped_store_has_closed_its_file() {
    let dir = TempDir::new("closed");
    let wal = dir.0.join("kv.sqlite3-wal");
    for round in 0..40u8 {
        let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
        assert!(wal.exists(), "round {round}: an open store has its log");
        if round > 0 {
            assert_eq!(kv.get("last").unwrap(), Some(vec![round - 1]));
            assert_eq!(kv.increment("rounds", 0).unwrap(), i64::from(round));
        }
        kv.set("last", &[round]).unwrap();
        kv.increment("rounds", 1).unwrap();
        drop(kv);
        assert!(!wal.exists(), "round {round}: the log outlived the store");
    }
}

/// Writes queued and not yet answered when the store is dropped are
/// committed before the drop returns: the writer takes everything left in
/// its queue once the queue is closed. Each round queues 300 writes from
/// the async path (their futures never polled) and drops the store at once.
#[test]
fn writes_queued_before_a_drop_are_committed() {
    let dir = TempDir::new("queued-drop");
    for round in 0..5u8 {
        let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
        let queued: Vec<_> = (0..300)
            .map(|i| {
                kv.write_async(WriteOp::Set(format!("r{round}-{i}"), vec![round]))
                    .unwrap_or_else(|_| panic!("round {round}: write {i} not queued"))
            })
            .collect();
        drop(kv);
        drop(queued);
        let kv = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
        for i in 0..300 {
            assert_eq!(
                kv.get(&format!("r{round}-{i}")).unwrap(),
                Some(vec![round]),
                "round {round}: write {i} lost at the drop"
            );
        }
    }
}

#[test]
fn failing_wrapper_fails_from_the_nth_operation() {
    let dir = TempDir::new("failing");
    let inner: Arc<dyn KvBackend> =
        Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    let kv = FailingKv::new(inner.clone(), 3, Some(2));
    assert!(kv.set("a", b"1").is_ok()); // 1
    assert!(kv.get("a").is_ok()); // 2
    assert!(kv.get("a").is_err()); // 3
    assert!(kv.increment("n", 1).is_err()); // 4
    assert!(kv.get("a").is_ok()); // 5: recovered
    let always = FailingKv::new(inner, 1, None);
    assert!(always.get("a").is_err());
    assert!(always.get("a").is_err());
}

#[test]
fn two_handles_on_one_file_share_counters() {
    // Two opens of one file behave like two host processes: their writers
    // meet only in SQLite's own locking.
    let dir = TempDir::new("two-handles");
    let a = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    let b = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap());
    let handles: Vec<_> = [a.clone(), a.clone(), b.clone(), b.clone()]
        .into_iter()
        .map(|kv| {
            thread::spawn(move || {
                for _ in 0..250 {
                    kv.increment("n", 1).unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(a.increment("n", 0).unwrap(), 1000);
    assert_eq!(b.increment("n", 0).unwrap(), 1000);
}

// ------------------------------------------- KV_EMULATE=spin-4.0.2 (default)

#[test]
fn spin_4_0_2_counters_are_8_le_bytes() {
    let dir = TempDir::new("spin-incr");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    assert_eq!(kv.emulation(), KvEmulation::Spin402);
    // Still atomic under concurrency (read and write in one transaction).
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let kv = kv.clone();
            thread::spawn(move || {
                (0..250)
                    .map(|_| kv.increment("n", 1).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (1..=1000).collect::<Vec<i64>>());
    // `get` on a counter returns Spin's 8 little-endian bytes.
    assert_eq!(
        kv.get("n").unwrap().unwrap(),
        1000i64.to_le_bytes().to_vec()
    );
    assert_eq!(
        kv.get_many(&["n".into()]).unwrap(),
        vec![Some(1000i64.to_le_bytes().to_vec())]
    );
    assert_eq!(kv.increment("neg", -3).unwrap(), -3);
    assert_eq!(
        kv.get("neg").unwrap().unwrap(),
        (-3i64).to_le_bytes().to_vec()
    );
    // Stored as a blob, as Spin stores it.
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let kind: String = conn
        .query_row("SELECT typeof(value) FROM kv WHERE key = 'n'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kind, "blob");
    // Any 8-byte value is a counter to Spin; overflow wraps (release build).
    kv.set("eight", &i64::MAX.to_le_bytes()).unwrap();
    assert_eq!(kv.increment("eight", 1).unwrap(), i64::MIN);
}

#[test]
fn spin_4_0_2_increment_on_a_non_counter_is_an_error() {
    let dir = TempDir::new("spin-notcounter");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    // Spin 4.0.2 panics on these (`expect("incorrect length")`).
    for bad in [&b"hello"[..], b"", b"123456789"] {
        kv.set("plain", bad).unwrap();
        let e = kv.increment("plain", 1).unwrap_err();
        assert!(e.0.contains("not an 8-byte counter"), "{e}");
        assert_eq!(kv.get("plain").unwrap().unwrap(), bad.to_vec());
    }
    // The store is still usable afterwards.
    assert_eq!(kv.increment("ok", 2).unwrap(), 2);
}

#[test]
fn spin_4_0_2_compare_and_swap() {
    let dir = TempDir::new("spin-cas");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    // Missing key, seen as missing: Spin's `None` branch writes.
    assert!(kv.swap("missing", Some(None), b"x").unwrap());
    assert_eq!(kv.get("missing").unwrap().unwrap(), b"x".to_vec());
    // Nothing read (`current` never called): also an unconditional write,
    // even over an existing value.
    assert!(kv.swap("missing", None, b"y").unwrap());
    assert_eq!(kv.get("missing").unwrap().unwrap(), b"y".to_vec());
    // Seen as missing but written meanwhile: still overwritten.
    assert!(kv.swap("missing", Some(None), b"z").unwrap());
    assert_eq!(kv.get("missing").unwrap().unwrap(), b"z".to_vec());
    // Existing key: UPDATE … WHERE value = old.
    kv.set("k", b"a").unwrap();
    assert!(!kv.swap("k", Some(Some(b"b")), b"x").unwrap());
    assert_eq!(kv.get("k").unwrap().unwrap(), b"a".to_vec());
    assert!(kv.swap("k", Some(Some(b"a")), b"x").unwrap());
    assert_eq!(kv.get("k").unwrap().unwrap(), b"x".to_vec());
    // A counter's 8 bytes are its value, so CAS works on it.
    kv.increment("n", 5).unwrap();
    assert!(kv
        .swap("n", Some(Some(&5i64.to_le_bytes())), &6i64.to_le_bytes())
        .unwrap());
    assert_eq!(kv.increment("n", 0).unwrap(), 6);
    // Deleted after being seen: no row to update.
    kv.delete("k").unwrap();
    assert!(!kv.swap("k", Some(Some(b"x")), b"y").unwrap());
    assert_eq!(kv.get("k").unwrap(), None);
}

#[test]
fn spin_4_0_2_get_many_answers_existing_keys_only() {
    let dir = TempDir::new("spin-many");
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    kv.set_many(&[
        ("b".into(), b"2".to_vec()),
        ("a".into(), vec![0, 255]),
        ("c".into(), b"3".to_vec()),
    ])
    .unwrap();
    // Spin's `key IN rarray(:keys)`: existing keys, each once, in key order.
    let keys: Vec<String> = ["c", "zz", "a", "c"].map(String::from).to_vec();
    assert_eq!(
        kv.get_many_pairs(&keys).unwrap(),
        vec![
            ("a".to_string(), Some(vec![0, 255])),
            ("c".to_string(), Some(b"3".to_vec())),
        ]
    );
    assert_eq!(kv.get_many_pairs(&["zz".into()]).unwrap(), vec![]);
    kv.delete_many(&["a".into(), "zz".into()]).unwrap();
    assert_eq!(kv.keys().unwrap(), ["b", "c"]);
    // This host's own mode answers every key, in order.
    drop(kv);
    let own = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    assert_eq!(
        own.get_many_pairs(&keys[..2]).unwrap(),
        vec![
            ("c".to_string(), Some(b"3".to_vec())),
            ("zz".to_string(), None)
        ]
    );
}

#[test]
fn spin_4_0_2_keeps_counters_of_the_old_integer_format() {
    let dir = TempDir::new("spin-upgrade");
    {
        // A data directory written by this host's own format.
        let old = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
        old.increment("c", 41).unwrap();
        old.set("plain", b"text").unwrap();
        old.set("eight", b"8 bytes!").unwrap();
    }
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    // Converted when the store opened: reads as Spin's bytes, counts on.
    assert_eq!(kv.get("c").unwrap().unwrap(), 41i64.to_le_bytes().to_vec());
    assert_eq!(kv.increment("c", 1).unwrap(), 42);
    assert_eq!(kv.get("plain").unwrap().unwrap(), b"text".to_vec());
    assert_eq!(kv.get("eight").unwrap().unwrap(), b"8 bytes!".to_vec());
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let integers: i64 = conn
        .query_row(
            "SELECT count(*) FROM kv WHERE typeof(value) = 'integer'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(integers, 0);
    // An INTEGER counter written later (a second host with
    // KV_EMULATE=none on the same file) still counts and reads as bytes.
    let other = SqliteKv::open_dir(&dir.0, KvEmulation::None).unwrap();
    assert_eq!(other.increment("d", 7).unwrap(), 7);
    assert_eq!(kv.get("d").unwrap().unwrap(), 7i64.to_le_bytes().to_vec());
    assert_eq!(kv.increment("d", 1).unwrap(), 8);
    assert_eq!(kv.get("d").unwrap().unwrap(), 8i64.to_le_bytes().to_vec());
    // Reopening converts nothing twice and loses nothing.
    drop(kv);
    let kv = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert_eq!(kv.increment("c", 0).unwrap(), 42);
    assert_eq!(kv.increment("d", 0).unwrap(), 8);
}

#[test]
fn failing_wrapper_keeps_the_emulation() {
    let dir = TempDir::new("spin-failing");
    let inner: Arc<dyn KvBackend> =
        Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    let kv = FailingKv::new(inner, 3, Some(1));
    assert_eq!(kv.emulation(), KvEmulation::Spin402);
    assert!(kv.swap("k", None, b"x").unwrap()); // 1: Spin's write
    assert_eq!(kv.increment("n", 1).unwrap(), 1); // 2
    assert!(kv.get_many_pairs(&["k".into()]).is_err()); // 3: injected
    assert_eq!(
        kv.get_many_pairs(&["k".into(), "n".into()]).unwrap(),
        vec![
            ("k".to_string(), Some(b"x".to_vec())),
            ("n".to_string(), Some(1i64.to_le_bytes().to_vec())),
        ]
    );
}

/// Group commit: concurrent writers share transactions, yet each write
/// stands alone. Spin's 8-byte counters from 8 threads over two stores on
/// one file (two writer threads competing for SQLite's lock, as two
/// processes would), with failing writes mixed in: no increment is lost or
/// counted twice, a failing write changes nothing and does not undo the
/// writes committed with it.
#[test]
fn group_commit_keeps_every_write_on_its_own() {
    let dir = TempDir::new("group");
    let a = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    let b = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    a.set("plain", b"hello").unwrap();
    const THREADS: usize = 8;
    const EACH: usize = 300;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let kv = if t % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let mut seen = Vec::with_capacity(EACH);
                for i in 0..EACH {
                    seen.push(kv.increment("counter", 1).unwrap());
                    kv.set(&format!("k:{t}:{i}"), &[t as u8]).unwrap();
                    if i % 10 == 0 {
                        assert!(kv.increment("plain", 1).is_err());
                    }
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    let expected: Vec<i64> = (1..=(THREADS * EACH) as i64).collect();
    assert_eq!(all, expected);
    assert_eq!(b.get("plain").unwrap().unwrap(), b"hello".to_vec());
    for t in 0..THREADS {
        for i in [0, EACH / 2, EACH - 1] {
            assert_eq!(a.get(&format!("k:{t}:{i}")).unwrap(), Some(vec![t as u8]));
        }
    }
    // Acknowledged writes are on disk: a fresh store on the file sees them.
    drop((a, b));
    let c = SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert_eq!(c.increment("counter", 0).unwrap(), (THREADS * EACH) as i64);
}

/// `increment(key, 0)` is how the service reads a counter: answered from
/// the committed value without a write, in both emulations, through the
/// blocking and the queued interface alike; nothing is created for a
/// missing key; a value that is not a counter is refused as an increment
/// would refuse it.
#[test]
fn counter_reads_write_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (emulation, refusal) in [
        (KvEmulation::None, "is not a counter"),
        (KvEmulation::Spin402, "not an 8-byte counter"),
    ] {
        let dir = TempDir::new(&format!("read-counter-{}", emulation.name()));
        let kv = SqliteKv::open_dir(&dir.0, emulation).unwrap();
        assert_eq!(kv.increment("missing", 0).unwrap(), 0);
        assert_eq!(kv.get("missing").unwrap(), None, "{emulation}");
        assert_eq!(kv.increment("n", 5).unwrap(), 5);
        assert_eq!(kv.increment("n", 0).unwrap(), 5);
        let queued = kv.write_async(WriteOp::Increment("n".into(), 0)).unwrap();
        assert_eq!(rt.block_on(queued).unwrap(), 5);
        let queued = kv.write_async(WriteOp::Increment("n".into(), 2)).unwrap();
        assert_eq!(rt.block_on(queued).unwrap(), 7);
        kv.set("plain", b"hello").unwrap();
        for e in [
            kv.increment("plain", 0).unwrap_err(),
            kv.increment("plain", 1).unwrap_err(),
        ] {
            assert!(e.0.contains(refusal), "{emulation}: {e}");
        }
        assert_eq!(kv.get("plain").unwrap().unwrap(), b"hello".to_vec());
    }
}

/// A counter read does not queue behind the writer: while another
/// connection holds SQLite's write lock (so no commit can happen), the
/// committed value is answered at once; the increment waits for the lock.
#[test]
fn counter_reads_do_not_wait_for_the_writer() {
    let dir = TempDir::new("read-counter-lock");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    assert_eq!(kv.increment("n", 3).unwrap(), 3);
    let other = rusqlite::Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let (kv, tx) = (kv.clone(), tx.clone());
        thread::spawn(move || tx.send(("increment", kv.increment("n", 1))).unwrap())
    };
    let reader = {
        let kv = kv.clone();
        thread::spawn(move || tx.send(("read", kv.increment("n", 0))).unwrap())
    };
    let first = rx.recv_timeout(std::time::Duration::from_secs(5));
    assert_eq!(first.unwrap(), ("read", Ok(3)));
    other.execute_batch("ROLLBACK").unwrap();
    let second = rx.recv_timeout(std::time::Duration::from_secs(15));
    assert_eq!(second.unwrap(), ("increment", Ok(4)));
    writer.join().unwrap();
    reader.join().unwrap();
}

/// Deleting a key that is not there is answered without the writer: also
/// while another connection holds the write lock. A key that is there is
/// deleted (and that waits for the lock).
#[test]
fn deleting_a_missing_key_does_not_wait_for_the_writer() {
    let dir = TempDir::new("delete-missing");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap());
    kv.set("there", b"x").unwrap();
    let other = rusqlite::Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for key in ["there", "absent"] {
        let (kv, tx) = (kv.clone(), tx.clone());
        threads.push(thread::spawn(move || {
            tx.send((key, kv.delete(key))).unwrap();
        }));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let queued = kv.write_async(WriteOp::Delete("absent2".into())).unwrap();
    assert_eq!(rt.block_on(queued), Ok(0));
    let first = rx.recv_timeout(std::time::Duration::from_secs(5));
    assert_eq!(first.unwrap(), ("absent", Ok(())));
    other.execute_batch("ROLLBACK").unwrap();
    let second = rx.recv_timeout(std::time::Duration::from_secs(15));
    assert_eq!(second.unwrap(), ("there", Ok(())));
    assert_eq!(kv.get("there").unwrap(), None);
    for t in threads {
        t.join().unwrap();
    }
}
