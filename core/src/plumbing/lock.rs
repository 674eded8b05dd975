//! Mutual exclusion on one key, built on `increment` alone.
//!
//! # Why not compare-and-swap
//! Spin's key-value stores do not all implement `wasi:keyvalue/atomics`
//! compare-and-swap correctly: on Spin 4.0.x's Redis backend every swap fails
//! (it sends `UNWATCH key`, which Redis refuses), and even with that fixed a
//! swap runs `WATCH`/`MULTI`/`EXEC` on a connection shared by every request of
//! the process, so it is not isolated. On Spin's SQLite backend a swap of a
//! missing key is an unconditional write. `increment` is atomic on every
//! backend (`INCRBY` on Redis, one transaction on SQLite), so every state
//! change that must happen once rests on it (see `docs/decisions.md`).
//!
//! # The lock
//! A lock on `name` is a counter `lk:{name}:{b}`, where `b` is the lease
//! period (`now_ms / LEASE_MS`) of the request that takes it:
//!
//! 1. `increment(lk:{name}:{b}, 1)`; only the caller that gets 1 may go on
//!    (the others retry once the key is gone);
//! 2. it then reads the keys of the neighbouring periods `b - 1` and `b + 1`;
//!    if either exists, a request whose clock is in another period holds the
//!    lock, so it deletes its own key and retries. Two callers in adjacent
//!    periods each write their own key before reading the other's, so at
//!    least one of them sees the other (they may both back off, never both
//!    go on);
//! 3. the holder reads, changes and writes what the lock protects, then
//!    deletes its key.
//!
//! A holder that dies (a trap, a killed process, a store failure on
//! release) leaves its key behind; callers whose period is two or more
//! periods later never look at it, so the lock lapses after at most
//! `2 * LEASE_MS`. In exchange, the section a lock protects must end within
//! `LEASE_MS` of the holder's `now_ms` (clock skew between instances
//! included): in core it is one read, a pure function and one write.
//!
//! Presence is read with `get`, which every backend answers for a counter
//! (digits on Redis, 8 bytes on Spin's SQLite); the value is never read.
//! Waiting callers poll with `get` (no write) and call [`Store::pause`]
//! between attempts, so a host can back off instead of spinning.

use crate::contract::error::ApiError;
use crate::contract::ports::Store;

/// Length of a lease period. A locked section must end within this time of
/// the holder's `now_ms`; a dead holder blocks the key for at most twice
/// this.
pub const LEASE_MS: u64 = 10_000;

/// Attempts before a caller gives up with 503 `Service unavailable`. With a
/// host's [`Store::pause`] of about a millisecond (more for later attempts)
/// this is a few seconds of waiting.
pub const ATTEMPTS: u32 = 400;

/// A lock this caller holds; give it back with [`release`].
#[must_use = "a held lock must be released"]
pub struct Held {
    key: String,
}

fn lock_key(name: &str, period: u64) -> String {
    format!("lk:{name}:{period}")
}

/// Takes the lock on `name` (steps 1 and 2 of the module documentation).
/// Fails with [`ApiError::Unavailable`] after [`ATTEMPTS`] tries, or when
/// the store fails.
pub fn acquire(store: &dyn Store, name: &str, now_ms: u64) -> Result<Held, ApiError> {
    let period = now_ms / LEASE_MS;
    let mine = lock_key(name, period);
    let before = period.checked_sub(1).map(|p| lock_key(name, p));
    let after = period.checked_add(1).map(|p| lock_key(name, p));
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            store.pause(attempt);
            // Wait without writing while somebody holds this period's key.
            if store.get(&mine)?.is_some() {
                continue;
            }
        }
        if store.increment(&mine, 1)? != 1 {
            continue;
        }
        let mut neighbour_held = false;
        for key in [&before, &after].into_iter().flatten() {
            if store.get(key)?.is_some() {
                neighbour_held = true;
                break;
            }
        }
        if !neighbour_held {
            return Ok(Held { key: mine });
        }
        store.delete(&mine)?;
    }
    Err(ApiError::Unavailable)
}

/// Gives the lock back (step 3). A failure here is not the caller's: the
/// protected write has happened, and the lock lapses by itself (see the
/// module documentation).
pub fn release(store: &dyn Store, held: Held) -> bool {
    store.delete(&held.key).is_ok()
}

/// Runs `section` while holding the lock on `name`, and releases it whatever
/// `section` returns.
pub fn with<R>(
    store: &dyn Store,
    name: &str,
    now_ms: u64,
    section: impl FnOnce() -> Result<R, ApiError>,
) -> Result<R, ApiError> {
    let held = acquire(store, name, now_ms)?;
    let out = section();
    release(store, held);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryStore;

    #[test]
    fn one_holder_per_name_and_release_frees_it() {
        let store = MemoryStore::new();
        let a = acquire(&store, "user:1", 50_000).unwrap();
        // Same period, same name: refused until released.
        assert!(matches!(
            acquire(&store, "user:1", 50_001),
            Err(ApiError::Unavailable)
        ));
        // Another name is independent.
        let b = acquire(&store, "user:2", 50_000).unwrap();
        assert!(release(&store, a));
        let c = acquire(&store, "user:1", 50_002).unwrap();
        assert!(release(&store, b));
        assert!(release(&store, c));
        assert!(store.is_empty(), "no key left behind: {:?}", store.keys());
    }

    #[test]
    fn a_holder_in_the_neighbouring_period_blocks_both_ways() {
        let store = MemoryStore::new();
        let early = acquire(&store, "k", 19_999).unwrap(); // period 1
        assert!(acquire(&store, "k", 20_000).is_err()); // period 2
        release(&store, early);
        let late = acquire(&store, "k", 20_000).unwrap();
        assert!(acquire(&store, "k", 19_999).is_err());
        release(&store, late);
        assert!(store.is_empty());
    }

    #[test]
    fn a_dead_holder_blocks_for_at_most_two_periods() {
        let store = MemoryStore::new();
        let dead = acquire(&store, "k", 10 * LEASE_MS).unwrap();
        std::mem::forget(dead);
        assert!(acquire(&store, "k", 11 * LEASE_MS).is_err());
        let later = acquire(&store, "k", 12 * LEASE_MS).unwrap();
        release(&store, later);
    }

    #[test]
    fn a_failing_section_still_releases() {
        let store = MemoryStore::new();
        let out: Result<(), ApiError> = with(&store, "k", 0, || Err(ApiError::Internal));
        assert!(matches!(out, Err(ApiError::Internal)));
        assert!(store.is_empty());
        assert_eq!(with(&store, "k", 0, || Ok(7)).unwrap(), 7);
    }
}
