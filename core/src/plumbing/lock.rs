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
//! 2. it then reads the key of one neighbouring period: `b - 1` when its
//!    clock is in the first half of `b`, `b + 1` when in the second half.
//!    If that key exists, a request whose clock is in another period holds
//!    the lock (or is taking it). A caller in the first half deletes its own
//!    key and retries from step 1; a caller in the second half keeps its
//!    key and reads the neighbour's again after each pause, going on once
//!    it is gone (and deleting its own key if it gives up);
//! 3. the holder reads, changes and writes what the lock protects, then
//!    deletes its key.
//!
//! Why one neighbour is enough: take two callers whose clock readings
//! `t1 < t2` are less than half a period apart. Either they are in the same
//! period (one key, and `increment` lets one of them through), or `t1` is in
//! the second half of `b` and `t2` in the first half of `b + 1`, so each
//! reads the other's key. Each writes its own key before reading the
//! other's, so at least one of them sees the other: they may both back off,
//! never both go on. (Reading the neighbour's key again while keeping one's
//! own changes nothing in this: what lets a caller go on is its last read,
//! made after its own increment.)
//!
//! Why the second half waits: until 2026-12-07 both sides of a boundary
//! backed off alike, and callers on both sides that kept retrying at once
//! (the same pauses, the same moment) could each find the other's key again
//! and again until one gave up with 503: a test with sixteen requests on the
//! two sides of a boundary failed that way once under CI's load. Now the
//! earlier period's caller holds its key while it waits, so the later
//! period's callers find it, back off, and leave their key free. A wait
//! points only from period `b` to `b + 1`, so no two callers wait for each
//! other.
//!
//! A holder that dies (a trap, a killed process, a store failure on
//! release) leaves its key behind; a caller reads it only from the second
//! half of the period before to the first half of the period after, so the
//! lock lapses after at most `1.5 * LEASE_MS`. In exchange, the section a
//! lock protects must end within `LEASE_MS / 2` of the holder's `now_ms`
//! (clock skew between instances included): in core it is one read, a pure
//! function and one write.
//!
//! Presence is read with `get`, which every backend answers for a counter
//! (digits on Redis, 8 bytes on Spin's SQLite); the value is never read.
//! Waiting callers poll with `get` (no write) and call [`Store::pause`]
//! between attempts, so a host can back off instead of spinning.

use crate::contract::error::ApiError;
use crate::contract::ports::Store;
use crate::plumbing::util;

/// Length of a lease period. A locked section must end within half of this
/// (10 s) of the holder's `now_ms`; a dead holder blocks the key for at most
/// one and a half times this (30 s).
pub const LEASE_MS: u64 = 20_000;

/// Attempts before a caller gives up with 503 `Service unavailable`. With
/// the pauses of [`pause_for`] this is about 4 s of waiting.
pub const ATTEMPTS: u32 = 400;

/// How long a host's [`Store::pause`] waits before attempt `attempt`
/// (from 1): 1 ms more for each attempt, at most 10 ms, so that
/// [`ATTEMPTS`] attempts wait 3.945 s in all. Core does not sleep; the
/// component and the tests' stores sleep this long.
pub fn pause_for(attempt: u32) -> core::time::Duration {
    core::time::Duration::from_millis(u64::from(attempt.min(10)))
}

/// A lock this caller holds; give it back with [`release`].
#[must_use = "a held lock must be released"]
pub struct Held {
    key: String,
}

fn lock_key(name: &str, period: u64) -> String {
    util::key(&["lk:", name, ":", util::Decimal::of(period).as_str()])
}

/// The key a caller at `now_ms` takes, and the one neighbouring key it
/// reads (module documentation, step 2); none before period 0.
fn keys(name: &str, now_ms: u64) -> (String, Option<String>) {
    let period = now_ms / LEASE_MS;
    let neighbour = if in_second_half(now_ms) {
        period.checked_add(1)
    } else {
        period.checked_sub(1)
    };
    (lock_key(name, period), neighbour.map(|p| lock_key(name, p)))
}

/// Whether `now_ms` is in the second half of its lease period: its caller
/// reads the next period's key, and keeps its own while it waits (step 2).
fn in_second_half(now_ms: u64) -> bool {
    now_ms % LEASE_MS >= LEASE_MS / 2
}

/// Takes the lock on `name` (steps 1 and 2 of the module documentation).
/// Fails with [`ApiError::Unavailable`] after [`ATTEMPTS`] tries, or when
/// the store fails.
pub fn acquire(store: &dyn Store, name: &str, now_ms: u64) -> Result<Held, ApiError> {
    let (mine, neighbour) = keys(name, now_ms);
    let keeps_its_key = in_second_half(now_ms);
    let mut holding = false;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            store.pause(attempt);
        }
        if !holding {
            // Wait without writing while somebody holds this period's key.
            if attempt > 0 && store.get(&mine)?.is_some() {
                continue;
            }
            if store.increment(&mine, 1)? != 1 {
                continue;
            }
            holding = true;
        }
        let neighbour_held = match &neighbour {
            Some(key) => match store.get(key) {
                Ok(value) => value.is_some(),
                Err(e) => {
                    let _ = store.delete(&mine);
                    return Err(e.into());
                }
            },
            None => false,
        };
        if !neighbour_held {
            return Ok(Held { key: mine });
        }
        if !keeps_its_key {
            store.delete(&mine)?;
            holding = false;
        }
    }
    if holding {
        let _ = store.delete(&mine);
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
    use crate::contract::ports::StoreError;
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
        let early = acquire(&store, "k", 2 * LEASE_MS - 1).unwrap(); // period 1
        assert!(acquire(&store, "k", 2 * LEASE_MS).is_err()); // period 2
        release(&store, early);
        let late = acquire(&store, "k", 2 * LEASE_MS).unwrap();
        assert!(acquire(&store, "k", 2 * LEASE_MS - 1).is_err());
        release(&store, late);
        assert!(store.is_empty());
    }

    /// The argument of the module documentation, checked on a grid of pairs
    /// of clock readings less than half a period apart around two period
    /// boundaries: the two callers share a key, or each reads the other's.
    #[test]
    fn callers_less_than_half_a_period_apart_always_meet() {
        let half = LEASE_MS / 2;
        let step = 997; // prime, so the grid hits many offsets in a period
        for base in [0, 7 * LEASE_MS] {
            let mut t1 = base;
            while t1 < base + 2 * LEASE_MS {
                for gap in [0, 1, 2, step, half / 2, half - 2, half - 1] {
                    let t2 = t1 + gap;
                    let (k1, n1) = keys("k", t1);
                    let (k2, n2) = keys("k", t2);
                    assert!(
                        k1 == k2 || (n1.as_ref() == Some(&k2) && n2.as_ref() == Some(&k1)),
                        "t1 {t1}, t2 {t2}: {k1} {n1:?} / {k2} {n2:?}"
                    );
                    // And through the store, in both orders.
                    let store = MemoryStore::new();
                    let a = acquire(&store, "k", t1).unwrap();
                    assert!(acquire(&store, "k", t2).is_err(), "{t1} then {t2}");
                    release(&store, a);
                    let b = acquire(&store, "k", t2).unwrap();
                    assert!(acquire(&store, "k", t1).is_err(), "{t2} then {t1}");
                    release(&store, b);
                }
                t1 += step;
            }
        }
    }

    #[test]
    fn which_neighbour_a_caller_reads() {
        let store = MemoryStore::new();
        let (mine, neighbour) = keys("k", 3 * LEASE_MS + 1);
        assert_eq!(mine, "lk:k:3");
        assert_eq!(neighbour.as_deref(), Some("lk:k:2"));
        let (_, neighbour) = keys("k", 3 * LEASE_MS + LEASE_MS / 2);
        assert_eq!(neighbour.as_deref(), Some("lk:k:4"));
        assert_eq!(keys("k", 1).1, None, "no period before 0");
        let held = acquire(&store, "k", 3 * LEASE_MS + 1).unwrap();
        release(&store, held);
        assert!(store.is_empty());
    }

    #[test]
    fn a_dead_holder_blocks_for_at_most_one_and_a_half_periods() {
        let half = LEASE_MS / 2;
        // Held at the start of period 10: blocks up to the middle of 11.
        let store = MemoryStore::new();
        std::mem::forget(acquire(&store, "k", 10 * LEASE_MS).unwrap());
        assert!(acquire(&store, "k", 11 * LEASE_MS + half - 1).is_err());
        release(&store, acquire(&store, "k", 11 * LEASE_MS + half).unwrap());
        // Held at the end of period 10: the same bound.
        let store = MemoryStore::new();
        std::mem::forget(acquire(&store, "k", 11 * LEASE_MS - 1).unwrap());
        assert!(acquire(&store, "k", 11 * LEASE_MS + half - 1).is_err());
        release(&store, acquire(&store, "k", 11 * LEASE_MS + half).unwrap());
        // Callers of the period before, in its second half, see it too.
        assert!(acquire(&store, "k", 10 * LEASE_MS - 1).is_err());
    }

    /// A store that runs a script at each pause: it notes whether the
    /// caller's own key exists, and at the third pause deletes the
    /// neighbour's key (its holder has backed off or finished).
    struct Scripted {
        inner: MemoryStore,
        mine: &'static str,
        neighbour: &'static str,
        own_key_at_pauses: std::sync::Mutex<Vec<bool>>,
    }

    impl Store for Scripted {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
            self.inner.set(key, value)
        }
        fn delete(&self, key: &str) -> Result<(), StoreError> {
            self.inner.delete(key)
        }
        fn increment(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
            self.inner.increment(key, delta)
        }
        fn pause(&self, attempt: u32) {
            let own = self.inner.get(self.mine).unwrap().is_some();
            self.own_key_at_pauses.lock().unwrap().push(own);
            if attempt == 3 {
                self.inner.delete(self.neighbour).unwrap();
            }
        }
    }

    /// Step 2's tie-break at a boundary (period 4 ends at `5 * LEASE_MS`):
    /// the caller in the second half of period 4 that finds period 5's key
    /// keeps its own key while it waits, and goes on once that key is gone;
    /// the caller in the first half of period 5 that finds period 4's key
    /// gives its own back before every pause, as before.
    #[test]
    fn at_a_boundary_only_the_earlier_period_keeps_its_key_while_it_waits() {
        let boundary = 5 * LEASE_MS;
        for (now, mine, neighbour, kept) in [
            (boundary - 1, "lk:k:4", "lk:k:5", true),
            (boundary, "lk:k:5", "lk:k:4", false),
        ] {
            let store = Scripted {
                inner: MemoryStore::new(),
                mine,
                neighbour,
                own_key_at_pauses: Default::default(),
            };
            store.inner.increment(neighbour, 1).unwrap();
            let held = acquire(&store, "k", now).unwrap();
            assert_eq!(
                *store.own_key_at_pauses.lock().unwrap(),
                [kept; 3],
                "{now}: its own key at each pause"
            );
            assert!(release(&store, held));
            assert!(store.inner.is_empty(), "{:?}", store.inner.keys());
        }
    }

    /// A caller that waited with its key and gave up takes the key with it.
    #[test]
    fn a_caller_that_gives_up_waiting_leaves_no_key() {
        let store = MemoryStore::new();
        let later = acquire(&store, "k", 5 * LEASE_MS).unwrap();
        assert!(matches!(
            acquire(&store, "k", 5 * LEASE_MS - 1),
            Err(ApiError::Unavailable)
        ));
        assert_eq!(store.keys(), ["lk:k:5"]);
        assert!(release(&store, later));
        assert!(store.is_empty());
    }

    /// The pauses a waiting caller makes add up to the budget the
    /// documentation of [`ATTEMPTS`] states.
    #[test]
    fn the_pauses_of_all_attempts_add_up_to_about_four_seconds() {
        assert_eq!(pause_for(1).as_millis(), 1);
        assert_eq!(pause_for(10).as_millis(), 10);
        assert_eq!(pause_for(ATTEMPTS).as_millis(), 10);
        let all: core::time::Duration = (1..ATTEMPTS).map(pause_for).sum();
        assert_eq!(all.as_millis(), 3945);
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
