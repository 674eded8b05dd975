//! The Redis backend against a real `redis-server` that the test starts on
//! 127.0.0.1. It needs `redis-server` on PATH (Debian's package, which
//! `scripts/test.sh` installs) and fails without it.
//!
//! `KV_EMULATE=none`: this host's own guarantees. `spin-4.0.2` (default):
//! what Spin 4.0.2's Redis store does, checked against the same server by
//! replaying the commands Spin sends.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tfa_host::kv::{KvBackend, KvEmulation, RedisKv};

struct Redis {
    child: Child,
    url: String,
}

impl Redis {
    fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        // Owned by `Redis` at once, so its Drop kills and reaps the server
        // on every path, the panic below included.
        let redis = Redis {
            child,
            url: format!("redis://127.0.0.1:{port}/"),
        };
        for _ in 0..100 {
            if RedisKv::open(&redis.url, KvEmulation::None).is_ok() {
                return redis;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {port}");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn redis_backend_guarantees() {
    let redis = Redis::start();
    let kv = Arc::new(RedisKv::open(&redis.url, KvEmulation::None).unwrap());

    // Atomic increments from several threads (and two clients).
    let other = Arc::new(RedisKv::open(&redis.url, KvEmulation::None).unwrap());
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let kv = if i % 2 == 0 {
                kv.clone()
            } else {
                other.clone()
            };
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..250 {
                    kv.increment("n", 1).unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(kv.increment("n", 0).unwrap(), 2000);
    assert_eq!(kv.get("n").unwrap().unwrap(), b"2000".to_vec());

    // CAS: one winner per race; missing keys never swap.
    for round in 0..10 {
        let key = format!("k{round}");
        kv.set(&key, b"old").unwrap();
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let kv = kv.clone();
                let key = key.clone();
                let barrier = barrier.clone();
                thread::spawn(move || {
                    barrier.wait();
                    kv.compare_and_swap(&key, b"old", format!("new{i}").as_bytes())
                        .unwrap()
                })
            })
            .collect();
        let wins = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|w| *w)
            .count();
        assert_eq!(wins, 1);
    }
    assert!(!kv.compare_and_swap("missing", b"", b"x").unwrap());
    assert_eq!(kv.get("missing").unwrap(), None);

    // Plain values, batch, delete, keys.
    kv.set("bin", &[0, 255, 1]).unwrap();
    assert_eq!(
        kv.get_many(&["bin".into(), "nope".into()]).unwrap(),
        vec![Some(vec![0, 255, 1]), None]
    );
    kv.delete("bin").unwrap();
    kv.delete("bin").unwrap();
    assert!(!kv.exists("bin").unwrap());
    assert!(kv.keys().unwrap().contains(&"n".to_string()));
    assert!(kv.increment("k0", 1).is_err(), "not a counter");
}

// ------------------------------------------- KV_EMULATE=spin-4.0.2 (default)

/// Spin 4.0.2's `swap` on a handle for `key`, command for command, on a
/// connection of its own (`current` = `WATCH key` + `GET key`, then
/// `MULTI; SET; EXEC` and `UNWATCH key`). Returns the `UNWATCH` outcome,
/// which decides Spin's answer.
fn spin_swap(url: &str, key: &str, call_current: bool, between: impl FnOnce()) -> bool {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    if call_current {
        redis::cmd("WATCH").arg(key).exec(&mut c).unwrap();
        let _: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(&mut c).unwrap();
    }
    between();
    let _: redis::RedisResult<()> = redis::pipe().atomic().set(key, "new").query(&mut c);
    redis::cmd("UNWATCH").arg(key).exec(&mut c).is_ok()
}

#[test]
fn spin_4_0_2_redis_quirks() {
    let redis = Redis::start();
    let kv = RedisKv::open(&redis.url, KvEmulation::Spin402).unwrap();
    assert_eq!(kv.emulation(), KvEmulation::Spin402);
    let mut raw = redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();

    // Counters are INCRBY strings: `get` returns the digits.
    assert_eq!(kv.increment("n", 41).unwrap(), 41);
    assert_eq!(kv.increment("n", 1).unwrap(), 42);
    assert_eq!(kv.get("n").unwrap().unwrap(), b"42".to_vec());
    kv.set("plain", b"x").unwrap();
    assert!(kv.increment("plain", 1).is_err());

    // CAS: Redis refuses Spin's `UNWATCH <key>`, so every swap is
    // cas-failed; the write lands unless the key changed after `current`.
    // Each case is replayed with Spin's own commands on a twin key.
    for (case, call_current, changed) in [
        ("no-current", false, false),
        ("unchanged", true, false),
        ("changed", true, true),
    ] {
        let (ours, spins) = (format!("ours-{case}"), format!("spin-{case}"));
        for k in [&ours, &spins] {
            kv.set(k, b"old").unwrap();
        }
        // Spin, literally; another client writes between `current` and
        // `swap` when the case says so.
        let spin_ok = spin_swap(&redis.url, &spins, call_current, || {
            if changed {
                kv.set(&spins, b"other").unwrap();
            }
        });
        assert!(!spin_ok, "{case}: Redis accepted UNWATCH with a key");
        // The emulation.
        let seen = kv.get(&ours).unwrap();
        if changed {
            kv.set(&ours, b"other").unwrap();
        }
        let seen = call_current.then_some(seen.as_deref());
        assert!(!kv.swap(&ours, seen, b"new").unwrap(), "{case}: swapped");
        assert_eq!(
            kv.get(&ours).unwrap(),
            kv.get(&spins).unwrap(),
            "{case}: the store differs from Spin's"
        );
        let expected: &[u8] = if changed { b"other" } else { b"new" };
        assert_eq!(kv.get(&ours).unwrap().unwrap(), expected.to_vec(), "{case}");
    }
    // Seen missing: written if still missing, never reported as swapped.
    assert!(!kv.swap("fresh", Some(None), b"1").unwrap());
    assert_eq!(kv.get("fresh").unwrap().unwrap(), b"1".to_vec());
    assert!(!kv.swap("fresh", Some(None), b"2").unwrap());
    assert_eq!(kv.get("fresh").unwrap().unwrap(), b"1".to_vec());

    // get-many sends `KEYS k1 k2 …`: refused for two keys or more…
    let e = kv
        .get_many_pairs(&["n".into(), "plain".into()])
        .unwrap_err();
    assert!(e.0.contains("wrong number of arguments"), "{e}");
    assert!(redis::cmd("KEYS")
        .arg("n")
        .arg("plain")
        .exec(&mut raw)
        .is_err());
    // …and one key is a pattern: no match answers nothing (not the key
    // with no value), one match makes Spin panic (here an error), two are
    // paired up as if they were a key and its value.
    assert_eq!(kv.get_many_pairs(&["nope".into()]).unwrap(), vec![]);
    let e = kv.get_many_pairs(&["n".into()]).unwrap_err();
    assert!(e.0.contains("odd number"), "{e}");
    kv.set_many(&[("q1".into(), b"v1".to_vec()), ("q2".into(), b"v2".to_vec())])
        .unwrap();
    let pairs = kv.get_many_pairs(&["q*".into()]).unwrap();
    let spins: Vec<(String, Option<Vec<u8>>)> =
        redis::cmd("KEYS").arg(&["q*"]).query(&mut raw).unwrap();
    assert_eq!(pairs, spins);
    assert_eq!(pairs.len(), 1);
    let (a, b) = (&pairs[0].0, pairs[0].1.as_deref().unwrap());
    assert!(
        (a == "q1" && b == b"q2") || (a == "q2" && b == b"q1"),
        "{pairs:?}"
    );
    assert_eq!(kv.get_many_pairs(&[]).unwrap(), vec![]);

    // set-many is one MSET, delete-many one DEL; both keep binary values.
    kv.set_many(&[("m1".into(), vec![0, 255]), ("m2".into(), b"2".to_vec())])
        .unwrap();
    assert_eq!(kv.get("m1").unwrap().unwrap(), vec![0, 255]);
    kv.set_many(&[]).unwrap();
    kv.delete_many(&["m1".into(), "m2".into(), "never".into()])
        .unwrap();
    kv.delete_many(&[]).unwrap();
    assert!(!kv.exists("m1").unwrap());
    assert!(!kv.exists("m2").unwrap());
}
