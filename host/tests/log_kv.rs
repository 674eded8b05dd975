//! The log store (`KV_ENGINE=log`, `tfa_host::logkv`): the same answers as
//! the SQLite store for every operation in both emulations; nothing on disk
//! before the durability barrier and everything after it; a torn tail
//! truncated, damage elsewhere refused; compaction that loses nothing; one
//! process per directory; atomic counters and compare-and-swap under
//! concurrency; a data directory never opened by the wrong engine.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tfa_host::kv::{open_store, KvBackend, KvEmulation, KvEngine, KvFuture, SqliteKv, WriteOp};
use tfa_host::logkv::{LogKv, Options, LOG_DIR};

mod support;
use support::TempDir;

fn wait(f: Option<KvFuture<()>>) {
    if let Some(f) = f {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
            .unwrap();
    }
}

/// A copy of what the store's files hold now: what a crash (SIGKILL) at
/// this moment would leave for the next start.
fn crash_copy(from: &Path, to: &Path) {
    let (from, to) = (from.join(LOG_DIR), to.join(LOG_DIR));
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(LOG_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The store in `dir` (Spin 4.0.2's semantics), compacting once its log is
/// `compact_at` bytes long (and twice the last snapshot).
fn compacting_at(dir: &Path, compact_at: u64) -> LogKv {
    LogKv::open_with(
        dir,
        KvEmulation::Spin402,
        Options {
            compact_at,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Every operation, edge cases included, on both stores: the same answers
/// (values, `false`s and errors alike).
#[test]
fn answers_as_the_sqlite_store_does() {
    for emulation in [KvEmulation::Spin402, KvEmulation::None] {
        let (a, b) = (TempDir::new("same-sqlite"), TempDir::new("same-log"));
        let sqlite = SqliteKv::open_dir(&a.0, emulation).unwrap();
        let log = LogKv::open_dir(&b.0, emulation).unwrap();
        let stores: [&dyn KvBackend; 2] = [&sqlite, &log];
        let k = |s: &str| s.to_string();
        let mut answers: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
        for (store, out) in stores.iter().zip(answers.iter_mut()) {
            let mut say = |what: String| out.push(what);
            say(format!("{:?}", store.get("a")));
            say(format!("{:?}", store.set("a", b"1")));
            say(format!("{:?}", store.get("a")));
            say(format!("{:?}", store.exists("a")));
            say(format!("{:?}", store.increment("n", 0)));
            say(format!("{:?}", store.exists("n")));
            say(format!("{:?}", store.increment("n", 5)));
            say(format!("{:?}", store.increment("n", -7)));
            say(format!("{:?}", store.increment("n", 0)));
            say(format!("{:?}", store.get("n")));
            say(format!("{:?}", store.set("word", b"one")));
            say(format!("{:?}", store.increment("word", 1).is_err()));
            say(format!("{:?}", store.set("max", &i64::MAX.to_le_bytes())));
            say(format!("{:?}", store.increment("max", 1).map_err(|_| ())));
            say(format!("{:?}", store.compare_and_swap("a", b"2", b"3")));
            say(format!("{:?}", store.compare_and_swap("a", b"1", b"3")));
            say(format!("{:?}", store.compare_and_swap("gone", b"", b"x")));
            say(format!("{:?}", store.swap("fresh", None, b"s")));
            say(format!("{:?}", store.swap("fresh2", Some(None), b"s")));
            say(format!("{:?}", store.swap("a", Some(Some(b"3")), b"4")));
            say(format!("{:?}", store.swap("a", Some(Some(b"3")), b"5")));
            say(format!("{:?}", store.delete("nothing")));
            say(format!("{:?}", store.delete("fresh")));
            say(format!("{:?}", store.get("fresh")));
            say(format!(
                "{:?}",
                store.set_many(&[(k("m1"), b"x".to_vec()), (k("m2"), b"y".to_vec())])
            ));
            say(format!(
                "{:?}",
                store.get_many(&[k("m2"), k("none"), k("m1"), k("m2")])
            ));
            say(format!(
                "{:?}",
                store.get_many_pairs(&[k("m2"), k("none"), k("m1"), k("m2")])
            ));
            say(format!("{:?}", store.delete_many(&[k("m1"), k("none")])));
            say(format!("{:?}", store.keys()));
            say(format!("{:?}", store.get("a")));
            say(format!("{:?}", store.get("fresh2")));
            say(format!("{:?}", store.emulation()));
            say(format!("{:?}", store.set("empty", b"")));
            say(format!("{:?}", store.get("empty")));
        }
        assert_eq!(answers[0], answers[1], "{emulation:?}");
        // And the log store gives them back after a restart.
        let keys = log.keys().unwrap();
        let values = log.get_many(&keys).unwrap();
        wait(log.durable());
        drop(log);
        let log = LogKv::open_dir(&b.0, emulation).unwrap();
        assert_eq!(log.keys().unwrap(), keys);
        assert_eq!(log.get_many(&keys).unwrap(), values);
        assert_eq!(
            log.get_many(&keys).unwrap(),
            sqlite.get_many(&keys).unwrap()
        );
    }
}

/// Writes reach the disk at the barrier, not before: a crash before it
/// leaves none of them, after it all of them; a read of an unsynced write
/// waits for the barrier too.
#[test]
fn the_barrier_is_what_makes_writes_durable() {
    let dir = TempDir::new("barrier");
    let opts = Options {
        idle_flush: Duration::from_secs(3600),
        ..Options::default()
    };
    let kv = LogKv::open_with(&dir.0, KvEmulation::Spin402, opts).unwrap();
    assert!(kv.durable().is_none(), "nothing written yet");
    kv.set("user:1", b"alice").unwrap();
    assert_eq!(kv.increment("count", 3).unwrap(), 3);
    let before = TempDir::new("barrier-before");
    crash_copy(&dir.0, &before.0);
    let barrier = kv.durable();
    assert!(barrier.is_some(), "unsynced writes need the barrier");
    wait(barrier);
    assert!(kv.durable().is_none(), "everything is synced");
    // A write through the host's path, then a read of it: the reader's
    // barrier covers the write it saw.
    let f = kv
        .write_async(WriteOp::Set("user:2".into(), b"bob".to_vec()))
        .ok()
        .unwrap();
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
        .unwrap();
    assert_eq!(kv.get("user:2").unwrap(), Some(b"bob".to_vec()));
    wait(kv.durable());
    let after = TempDir::new("barrier-after");
    crash_copy(&dir.0, &after.0);

    let lost = LogKv::open_dir(&before.0, KvEmulation::Spin402).unwrap();
    assert!(lost.is_empty(), "{:?}", lost.keys());
    let kept = LogKv::open_dir(&after.0, KvEmulation::Spin402).unwrap();
    assert_eq!(kept.get("user:1").unwrap(), Some(b"alice".to_vec()));
    assert_eq!(kept.get("user:2").unwrap(), Some(b"bob".to_vec()));
    assert_eq!(kept.increment("count", 0).unwrap(), 3);
}

/// Under load (many client connections open, many requests waiting at
/// once) the sync thread gathers waiters instead of being woken by each
/// (`Syncer::gather` in logkv/syncer.rs): every waiter is still answered, each
/// only once its own write is synced, and a crash right after loses none.
#[test]
fn waiters_gathered_under_load_are_all_answered_and_durable() {
    const CLIENTS: usize = 32;
    const EACH: usize = 40;
    let dir = TempDir::new("gather");
    let opts = Options {
        idle_flush: Duration::from_secs(3600),
        ..Options::default()
    };
    let kv = Arc::new(LogKv::open_with(&dir.0, KvEmulation::Spin402, opts).unwrap());
    for _ in 0..CLIENTS {
        kv.connection_opened();
    }
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (kv, barrier) = (kv.clone(), barrier.clone());
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                barrier.wait();
                for i in 0..EACH {
                    kv.set(&format!("c{c}:{i}"), b"x").unwrap();
                    let f = kv.durable().expect("an unsynced write needs the barrier");
                    rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), f).await })
                        .expect("a waiter was never answered")
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(kv.durable().is_none(), "every write is synced");
    let copy = TempDir::new("gather-copy");
    crash_copy(&dir.0, &copy.0);
    for _ in 0..CLIENTS {
        kv.connection_closed();
    }
    let seen = LogKv::open_dir(&copy.0, KvEmulation::Spin402).unwrap();
    assert_eq!(seen.len(), CLIENTS * EACH);
}

/// Writes nobody waits for (the work after a response) reach the disk
/// within the idle flush all the same.
#[test]
fn writes_nobody_waits_for_are_flushed_soon() {
    let dir = TempDir::new("idle");
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    kv.set("audit:1", b"login").unwrap();
    let copy = TempDir::new("idle-copy");
    // At most 500 idle periods (10 s), a bounded wait without a clock.
    for tries in 0.. {
        assert!(tries < 500, "never flushed");
        std::thread::sleep(tfa_host::logkv::IDLE_FLUSH);
        let _ = std::fs::remove_dir_all(copy.0.join(LOG_DIR));
        crash_copy(&dir.0, &copy.0);
        let seen = LogKv::open_dir(&copy.0, KvEmulation::Spin402).unwrap();
        if seen.get("audit:1").unwrap().is_some() {
            break;
        }
    }
    assert!(kv.durable().is_none(), "flushed and synced");
}

/// A write cut short at the end of the newest log (a crash during it) is
/// dropped and the log truncated; the store goes on appending after it.
#[test]
fn a_torn_tail_is_truncated() {
    let dir = TempDir::new("torn");
    {
        let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
        kv.set("a", b"1").unwrap();
        kv.set_many(&[("b".into(), b"2".to_vec()), ("c".into(), b"3".to_vec())])
            .unwrap();
        wait(kv.durable());
    }
    let log = dir.0.join(LOG_DIR).join("kv-0.log");
    let good = std::fs::read(&log).unwrap();
    // The batch's frame cut in its middle, and a frame of garbage.
    for tail in [&good[..good.len() - 3], &[0xff; 5][..]] {
        let mut torn = good.clone();
        if tail.len() == 5 {
            torn.extend_from_slice(tail);
        } else {
            torn.truncate(tail.len());
        }
        std::fs::write(&log, &torn).unwrap();
        let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
        assert_eq!(kv.get("a").unwrap(), Some(b"1".to_vec()));
        if tail.len() == 5 {
            assert_eq!(kv.get("c").unwrap(), Some(b"3".to_vec()));
            assert_eq!(std::fs::read(&log).unwrap(), good, "garbage truncated");
        } else {
            // The batch is all or nothing.
            assert_eq!(kv.get("b").unwrap(), None);
            assert_eq!(kv.get("c").unwrap(), None);
            kv.set_many(&[("b".into(), b"2".to_vec()), ("c".into(), b"3".to_vec())])
                .unwrap();
            wait(kv.durable());
        }
    }
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert_eq!(kv.keys().unwrap(), ["a", "b", "c"]);
}

/// Damage anywhere but the newest log's end, or in a snapshot, is refused:
/// what follows it was acknowledged.
#[test]
fn damage_before_the_end_is_refused() {
    let dir = TempDir::new("damage");
    {
        let kv = compacting_at(&dir.0, 1);
        kv.set("a", &[7; 100]).unwrap();
        wait(kv.durable()); // compacts: kv-1.snap and an empty kv-1.log
        kv.set("b", b"2").unwrap();
        wait(kv.durable()); // the log is shorter than twice the snapshot
    }
    assert_eq!(files(&dir.0), ["kv-1.log", "kv-1.snap", "kv.lock"]);
    let snap = dir.0.join(LOG_DIR).join("kv-1.snap");
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&snap, &bytes).unwrap();
    let e = LogKv::open_dir(&dir.0, KvEmulation::Spin402).err().unwrap();
    assert!(e.0.contains("kv-1.snap"), "{e}");
    bytes[last] ^= 1;
    std::fs::write(&snap, &bytes).unwrap();

    // An older log with a damaged frame before a newer log.
    let older = dir.0.join(LOG_DIR).join("kv-1.log");
    {
        let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
        kv.set("c", b"3").unwrap();
        wait(kv.durable());
    }
    let mut log = std::fs::read(&older).unwrap();
    log[10] ^= 1;
    std::fs::write(&older, &log).unwrap();
    std::fs::write(dir.0.join(LOG_DIR).join("kv-2.log"), b"").unwrap();
    let e = LogKv::open_dir(&dir.0, KvEmulation::Spin402).err().unwrap();
    assert!(e.0.contains("kv-1.log") && e.0.contains("damaged"), "{e}");
}

/// Compaction keeps every value, deletes included, and removes the files
/// it replaced; an interrupted one (a snapshot never renamed) is harmless.
#[test]
fn compaction_loses_nothing() {
    let dir = TempDir::new("compact");
    let mut expected = std::collections::BTreeMap::new();
    {
        let kv = compacting_at(&dir.0, 4096);
        for round in 0..40u32 {
            for i in 0..20u32 {
                let key = format!("k{i}");
                if (i + round) % 7 == 0 {
                    kv.delete(&key).unwrap();
                    expected.remove(&key);
                } else {
                    let v = format!("{round}-{i}-{}", "x".repeat(i as usize * 10));
                    kv.set(&key, v.as_bytes()).unwrap();
                    expected.insert(key, v.into_bytes());
                }
            }
            kv.increment("rounds", 1).unwrap();
            wait(kv.durable());
            // While a snapshot is written, reads answer from the frozen map
            // and the writes made since (crate::layered): the same answers.
            let mut now = expected.clone();
            now.insert("rounds".into(), i64::from(round + 1).to_le_bytes().to_vec());
            let keys = kv.keys().unwrap();
            assert_eq!(
                keys,
                now.keys().cloned().collect::<Vec<_>>(),
                "round {round}"
            );
            let values: Vec<Vec<u8>> = kv.get_many(&keys).unwrap().into_iter().flatten().collect();
            assert_eq!(
                values,
                now.values().cloned().collect::<Vec<_>>(),
                "round {round}"
            );
            assert_eq!(kv.len(), now.len());
        }
        expected.insert("rounds".into(), 40i64.to_le_bytes().to_vec());
    }
    let names = files(&dir.0);
    let snaps: Vec<_> = names.iter().filter(|n| n.ends_with(".snap")).collect();
    assert_eq!(snaps.len(), 1, "older generations removed: {names:?}");
    let generation: u64 = snaps[0]
        .strip_prefix("kv-")
        .and_then(|n| n.strip_suffix(".snap"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(generation >= 3, "compacted several times: {names:?}");
    // What a compaction interrupted before its rename leaves.
    std::fs::write(
        dir.0
            .join(LOG_DIR)
            .join(format!("kv-{}.snap.tmp", generation + 1)),
        b"half",
    )
    .unwrap();
    let kv = compacting_at(&dir.0, 4096);
    let keys = kv.keys().unwrap();
    let got: std::collections::BTreeMap<String, Vec<u8>> = keys
        .iter()
        .cloned()
        .zip(kv.get_many(&keys).unwrap().into_iter().map(Option::unwrap))
        .collect();
    assert_eq!(got, expected);
    assert!(!files(&dir.0).iter().any(|n| n.ends_with(".tmp")));
}

/// What a crash while a compaction is being written leaves: the next
/// generation's log already holds acknowledged frames, its snapshot was never
/// renamed into place. Opening replays the older snapshot and both logs in
/// order, so nothing acknowledged in either is lost, deletes included.
#[test]
fn a_crash_during_compaction_loses_nothing() {
    let dir = TempDir::new("compact-crash");
    {
        let kv = compacting_at(&dir.0, 1);
        kv.set("a", b"1").unwrap();
        kv.set("b", b"1").unwrap();
        wait(kv.durable()); // compacts: kv-1.snap holds a and b
    }
    assert_eq!(files(&dir.0), ["kv-1.log", "kv-1.snap", "kv.lock"]);
    {
        let kv = compacting_at(&dir.0, u64::MAX);
        kv.set("b", b"2").unwrap();
        kv.set("c", b"2").unwrap();
        wait(kv.durable());
    }
    // The compaction to generation 2 began: generation 1's log is complete,
    // generation 2's log receives the writes, its snapshot is half written.
    std::fs::write(dir.0.join(LOG_DIR).join("kv-2.log"), b"").unwrap();
    {
        let kv = compacting_at(&dir.0, u64::MAX);
        kv.delete("a").unwrap();
        kv.set("c", b"3").unwrap();
        wait(kv.durable());
    }
    std::fs::write(dir.0.join(LOG_DIR).join("kv-2.snap.tmp"), b"half").unwrap();
    let kv = compacting_at(&dir.0, u64::MAX);
    assert_eq!(kv.keys().unwrap(), ["b", "c"]);
    assert_eq!(kv.get("b").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(kv.get("c").unwrap().as_deref(), Some(&b"3"[..]));
    drop(kv);
    assert_eq!(
        files(&dir.0),
        ["kv-1.log", "kv-1.snap", "kv-2.log", "kv.lock"],
        "the interrupted snapshot is removed, the logs are kept"
    );
}

/// A write too large for one frame is refused before it changes anything
/// (a frame that large would be read back as damage).
#[test]
fn a_write_larger_than_a_frame_is_refused() {
    let dir = TempDir::new("huge");
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    kv.set("k", b"small").unwrap();
    let huge = vec![0u8; (64 << 20) + 1];
    let e = kv.set("k", &huge).unwrap_err();
    assert!(e.0.contains("larger than a frame"), "{e}");
    assert_eq!(kv.get("k").unwrap(), Some(b"small".to_vec()));
    wait(kv.durable());
    drop(kv);
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert_eq!(kv.get("k").unwrap(), Some(b"small".to_vec()));
}

/// One process per directory; the engines never open each other's data.
#[test]
fn one_store_per_directory() {
    let dir = TempDir::new("lock");
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    let e = LogKv::open_dir(&dir.0, KvEmulation::Spin402).err().unwrap();
    assert!(e.0.contains("in use by another process"), "{e}");
    drop(kv);
    let kv = open_store(None, &dir.0, KvEngine::Log, KvEmulation::Spin402, None).unwrap();
    drop(kv);
    let e = open_store(None, &dir.0, KvEngine::Sqlite, KvEmulation::Spin402, None)
        .err()
        .unwrap();
    assert!(e.0.contains("KV_ENGINE=log"), "{e}");

    let sqlite = TempDir::new("lock-sqlite");
    drop(
        open_store(
            None,
            &sqlite.0,
            KvEngine::Sqlite,
            KvEmulation::Spin402,
            None,
        )
        .unwrap(),
    );
    let e = open_store(None, &sqlite.0, KvEngine::Log, KvEmulation::Spin402, None)
        .err()
        .unwrap();
    assert!(e.0.contains("holds a SQLite store"), "{e}");
    let e = open_store(
        Some("redis://127.0.0.1:1"),
        &sqlite.0,
        KvEngine::Log,
        KvEmulation::Spin402,
        None,
    )
    .err()
    .unwrap();
    assert!(e.0.contains("KV_URL"), "{e}");
    assert_eq!(KvEngine::parse(None), Ok(KvEngine::Sqlite));
    assert_eq!(KvEngine::parse(Some(" log ")), Ok(KvEngine::Log));
    assert!(KvEngine::parse(Some("memory"))
        .unwrap_err()
        .contains("KV_ENGINE"));
}

/// Increments and compare-and-swap from many threads: none lost, none
/// doubled, also after a restart.
#[test]
fn counters_and_swaps_are_atomic() {
    const THREADS: usize = 8;
    const EACH: usize = 500;
    let dir = TempDir::new("atomic");
    // Compacting as it goes: the counters and swaps of the writes made while
    // a snapshot is written go to the overlay, then merge (crate::layered).
    let kv = Arc::new(compacting_at(&dir.0, 2048));
    kv.set("cas", b"0").unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (kv, barrier) = (kv.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut seen = Vec::new();
                let mut swapped = 0;
                for i in 0..EACH {
                    if i % 25 == 0 {
                        wait(kv.durable()); // where the sync thread compacts
                    }
                    seen.push(kv.increment("n", 1).unwrap());
                    let old = kv.get("cas").unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&old).unwrap().parse().unwrap();
                    if kv
                        .compare_and_swap("cas", &old, (n + 1).to_string().as_bytes())
                        .unwrap()
                    {
                        swapped += 1;
                    }
                }
                wait(kv.durable());
                (seen, swapped)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut swaps = 0u64;
    for h in handles {
        let (seen, swapped) = h.join().unwrap();
        all.extend(seen);
        swaps += swapped;
    }
    all.sort_unstable();
    assert_eq!(all, (1..=(THREADS * EACH) as i64).collect::<Vec<_>>());
    assert_eq!(kv.get("cas").unwrap(), Some(swaps.to_string().into_bytes()));
    drop(kv);
    let names = files(&dir.0);
    assert!(
        !names.iter().any(|n| n == "kv-0.log" || n == "kv-1.log"),
        "compacted more than once meanwhile: {names:?}"
    );
    let kv = LogKv::open_dir(&dir.0, KvEmulation::Spin402).unwrap();
    assert_eq!(kv.increment("n", 0).unwrap(), (THREADS * EACH) as i64);
    assert_eq!(kv.get("cas").unwrap(), Some(swaps.to_string().into_bytes()));
}
