//! The Redis backend against a real `redis-server` that the test starts on
//! 127.0.0.1. It needs `redis-server` on PATH (Debian's package, which
//! `scripts/test.sh` installs) and fails without it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tfa_host::kv::{KvBackend, RedisKv};

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
            if RedisKv::open(&redis.url).is_ok() {
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
    let kv = Arc::new(RedisKv::open(&redis.url).unwrap());

    // Atomic increments from several threads (and two clients).
    let other = Arc::new(RedisKv::open(&redis.url).unwrap());
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
