//! `tfa-bench kv-pause`: how long the log store's calls wait while it
//! compacts (`KV_ENGINE=log`, `tfa_host::logkv`).
//!
//! Fills a log store with `keys` keys (values of `value_bytes`), opens it
//! again so that the first sync compacts it, and then sends `set`s from
//! one thread, with a durability barrier every [`BARRIER_EVERY`] calls, as
//! requests do, until the compaction has ended (its old files are gone):
//! the longest call is the pause a request met. Beside it, in the same
//! process, the time to clone a `HashMap` of the same keys and values
//! (shared pointers), which is what the store did under its lock, with
//! every call waiting, until 2026-12-04: the old design's pause, measured
//! in the same run as its floor.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tfa_host::kv::{KvBackend as _, KvEmulation};
use tfa_host::logkv::{LogKv, Options, LOG_DIR};

use crate::startup::ScratchDir;
use crate::{now, percentile};

/// Calls between two durability barriers (the sync thread compacts after
/// answering one).
const BARRIER_EVERY: usize = 50;
/// How long the timed part may last.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

fn key(i: usize) -> String {
    format!("user:{i:012}:bench-pause-key-of-forty")
}

pub fn run(keys: usize, value_bytes: usize) -> anyhow::Result<()> {
    let dir = ScratchDir::new("kvpause");
    let value = vec![b'v'; value_bytes];
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    // Waits for the store's durability barrier, if it has one to wait for.
    let barrier = |kv: &LogKv| match kv.durable() {
        Some(f) => rt.block_on(f).map_err(|e| anyhow::anyhow!("{e}")),
        None => Ok(()),
    };
    {
        let never = Options {
            compact_at: u64::MAX,
            ..Options::default()
        };
        let kv = LogKv::open_with(dir.path(), KvEmulation::Spin402, never)?;
        for start in (0..keys).step_by(1000) {
            let pairs: Vec<(String, Vec<u8>)> = (start..keys.min(start + 1000))
                .map(|i| (key(i), value.clone()))
                .collect();
            kv.set_many(&pairs)?;
        }
        barrier(&kv)?;
    }
    let at_once = Options {
        compact_at: 1,
        ..Options::default()
    };
    let kv = LogKv::open_with(dir.path(), KvEmulation::Spin402, at_once)?;
    let first_log = dir.path().join(LOG_DIR).join("kv-0.log");
    let mut took_us = Vec::new();
    let started = now();
    let mut i = 0usize;
    while first_log.exists() {
        if started.elapsed() > LIMIT {
            anyhow::bail!("the compaction did not end within {LIMIT:?}");
        }
        let t = now();
        kv.set(&key(i % keys.max(1)), &value)?;
        took_us.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
        if i % BARRIER_EVERY == 0 {
            barrier(&kv)?;
        }
    }
    let compaction_ms = started.elapsed().as_secs_f64() * 1e3;
    drop(kv);

    // The old design's pause: the same map cloned.
    let map: HashMap<Arc<str>, Arc<[u8]>> = (0..keys)
        .map(|i| (Arc::from(key(i).as_str()), Arc::from(&value[..])))
        .collect();
    let mut clone_ms = Vec::new();
    for _ in 0..3 {
        let t = now();
        let copy = map.clone();
        clone_ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(copy);
    }
    println!(
        "{}",
        json!({
            "bench": "kv_pause", "keys": keys, "value_bytes": value_bytes,
            "calls": took_us.len(), "compaction_ms": compaction_ms,
            "us_p50": percentile(&mut took_us, 50.0),
            "us_p99": percentile(&mut took_us, 99.0),
            "us_max": took_us.iter().copied().fold(0.0, f64::max),
            "clone_ms_median": percentile(&mut clone_ms, 50.0),
        })
    );
    Ok(())
}
