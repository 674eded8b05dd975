//! The SQLite backend's guarantees: atomic increments and compare-and-swap
//! under concurrency, CAS on a missing key fails, data survives reopening.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::thread;

use tfa_host::kv::{FailingKv, KvBackend, SqliteKv};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("tfa-host-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn concurrent_increments_are_not_lost() {
    let dir = TempDir::new("incr");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0).unwrap());
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
    let kv = SqliteKv::open_dir(&dir.0).unwrap();
    kv.set("plain", b"hello").unwrap();
    assert!(kv.increment("plain", 1).is_err());
    assert_eq!(kv.get("plain").unwrap().unwrap(), b"hello".to_vec());
}

#[test]
fn compare_and_swap_has_exactly_one_winner() {
    let dir = TempDir::new("cas");
    let kv = Arc::new(SqliteKv::open_dir(&dir.0).unwrap());
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
    let kv = SqliteKv::open_dir(&dir.0).unwrap();
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
        let kv = SqliteKv::open_dir(&dir.0).unwrap();
        kv.set("a", b"1").unwrap();
        kv.set("b", &[0, 255, 7]).unwrap();
        kv.increment("c", 41).unwrap();
        kv.set("gone", b"x").unwrap();
        kv.delete("gone").unwrap();
        kv.delete("never-there").unwrap();
    }
    let kv = SqliteKv::open_dir(&dir.0).unwrap();
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
    assert!(dir.0.join("kv.sqlite3").exists());
    let conn = rusqlite::Connection::open(dir.0.join("kv.sqlite3")).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn failing_wrapper_fails_from_the_nth_operation() {
    let dir = TempDir::new("failing");
    let inner: Arc<dyn KvBackend> = Arc::new(SqliteKv::open_dir(&dir.0).unwrap());
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
    let a = Arc::new(SqliteKv::open_dir(&dir.0).unwrap());
    let b = Arc::new(SqliteKv::open_dir(&dir.0).unwrap());
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
