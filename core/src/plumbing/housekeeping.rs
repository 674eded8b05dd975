//! Removal of expired records without ever listing keys.
//!
//! Whoever creates something that expires (a rate-limit window, a temp-token
//! counter, a session, a trusted device, an account lock) names it with an
//! [`Expiry`], which the request hands on as an effect
//! ([`crate::plumbing::context::Ctx::expire`]); [`crate::Service::complete`]
//! files it after the response: the key goes into the time bucket after its
//! expiry (5-minute buckets, a counter `hk:n:{bucket}` and entries
//! `hk:e:{bucket}:{n}`).
//!
//! Filing after the response keeps these two writes off the client's wait
//! (each is a durable write, and on a disk store each waits for a commit).
//! The price is a crash window: a host killed between the response and the
//! filing leaves that one key unswept. The key is never wrong, only kept:
//! sessions, devices, locks and temp tokens carry their own expiry and are
//! refused after it whether swept or not, and a leftover counter belongs to
//! a window or token that is over (docs/decisions.md, "Expiry index").
//!
//! [`tick`], run by [`crate::Service::complete`] after each response, sweeps
//! at most a few due buckets per call:
//!
//! 0. read `sched:next`, the time at which the next bucket of this index or
//!    of the webhook retry queue comes due ([`anything_due`]); before it,
//!    nothing else is read — the common case costs one read for both queues;
//! 1. read the pointer `hk:ptr` (the last swept bucket); nothing is due when
//!    it is the current bucket;
//! 2. claim the next bucket with `increment(hk:c:{b}:{current})`; only the
//!    caller that gets 1 sweeps it (and it alone advances the pointer); a
//!    claim of an interrupted sweep lapses with the current bucket, so the
//!    bucket is swept again in the next window instead of being skipped;
//! 3. delete each entry's key: counters unconditionally, records only when
//!    their own `expMs` has passed (a session whose expiry moved on refresh
//!    has a later entry too);
//! 4. advance the pointer (a compare-and-set under the pointer's lock,
//!    [`crate::plumbing::records::replace`]) and drop the bucket's keys.
//!
//! Every request ticks except `GET /health` and `/health/ready` (probes that
//! cost one store read) and those whose host says another request checks
//! often enough ([`crate::Reply::skip_maintenance`]: `tfa-host` lets one
//! request a second tick), so a deployment whose traffic stops sweeps later;
//! a scheduler that wants expired keys gone on time can call
//! `GET {base}/health/live` every few minutes.

use crate::contract::error::ApiError;
pub use crate::contract::outbox::Expiry;
use crate::contract::ports::Env;
use crate::plumbing::records;
use crate::plumbing::util::{self, Decimal};

/// Bucket length.
pub const BUCKET_MS: u64 = 5 * 60 * 1000;
/// Buckets swept by one tick at most.
pub const MAX_BUCKETS_PER_TICK: u64 = 8;
const PTR: &str = "hk:ptr";

fn bucket_after(exp_ms: u64) -> u64 {
    exp_ms / BUCKET_MS + 1
}

/// The queue's key prefix: `hk:n:{bucket}`, `hk:e:{bucket}:{n}`
/// ([`util::bucket_count_key`], [`util::bucket_entry_key`]).
const QUEUE: &str = "hk:";

/// Files `expiry` in the bucket after its time: one `increment` of the
/// bucket's counter, one write of the entry.
pub fn schedule(env: &mut Env, expiry: &Expiry) -> Result<(), ApiError> {
    let b = bucket_after(expiry.exp_ms());
    let n = env.store.increment(&util::bucket_count_key(QUEUE, b), 1)?;
    env.store.set(
        &util::bucket_entry_key(QUEUE, b, Decimal::of_signed(n)),
        expiry.entry().as_bytes(),
    )?;
    Ok(())
}

/// A time-bucketed queue swept by a pointer: the shape shared by this
/// module's expiry index and the webhook retry queue
/// ([`crate::api::webhooks::due`]).
pub(crate) struct BucketQueue {
    /// Key of the pointer (the last bucket done).
    pub ptr: &'static str,
    /// Prefix of the per-bucket claim counters.
    pub claim: &'static str,
    /// Bucket length.
    pub bucket_ms: u64,
    /// Buckets processed by one call at most.
    pub max_per_call: u64,
    /// Where a missing pointer starts: this many buckets before the current.
    pub start_behind: u64,
    /// Run (best effort) once a bucket is done and the pointer has moved past
    /// it: for queues whose entries must survive until then.
    pub after: fn(&mut Env, u64),
}

/// Runs `each` on the buckets of `q` that have come due (steps 1, 2 and 4
/// of the module documentation). Returns what it produced for every bucket
/// it finished — also when a later step failed, so finished work is never
/// dropped — and the first error, if any.
pub(crate) fn drain_due<T>(
    env: &mut Env,
    q: &BucketQueue,
    mut each: impl FnMut(&mut Env, u64) -> Result<T, ApiError>,
) -> (Vec<T>, Result<(), ApiError>) {
    let mut out = Vec::new();
    let result = drain_into(env, q, &mut each, &mut out);
    (out, result)
}

fn drain_into<T>(
    env: &mut Env,
    q: &BucketQueue,
    each: &mut impl FnMut(&mut Env, u64) -> Result<T, ApiError>,
    out: &mut Vec<T>,
) -> Result<(), ApiError> {
    let current = env.now_ms / q.bucket_ms;
    let raw = env.store.get(q.ptr)?;
    let Some(raw) = raw else {
        let start = current.saturating_sub(q.start_behind);
        env.store.set(q.ptr, start.to_string().as_bytes())?;
        return Ok(());
    };
    let mut ptr: u64 = std::str::from_utf8(&raw)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(current);
    let mut old = raw;
    for _ in 0..q.max_per_call {
        let next = match ptr.checked_add(1) {
            Some(n) if n <= current => n,
            _ => break,
        };
        // The claim is scoped to the current bucket: a caller that died
        // half-way (its store failed) blocks the bucket only until the next
        // bucket, when another caller processes it again (the work is
        // idempotent). Only the claimer advances the pointer, so a bucket is
        // never skipped.
        let claim = format!("{}:{next}:{current}", q.claim);
        if env.store.increment(&claim, 1)? != 1 {
            break;
        }
        let done = each(env, next)?;
        let new = next.to_string().into_bytes();
        let advanced = records::replace(env, q.ptr, &old, &new)?;
        if !advanced {
            // Another caller moved the pointer: it owns the bucket now.
            let _ = env.store.delete(&claim);
            break;
        }
        // Past the pointer, the bucket is finished whatever happens next.
        out.push(done);
        (q.after)(env, next);
        // A claim left behind by a failure here is never used again.
        let _ = env.store.delete(&claim);
        ptr = next;
        old = new;
    }
    Ok(())
}

const EXPIRY: BucketQueue = BucketQueue {
    ptr: PTR,
    claim: "hk:c",
    bucket_ms: BUCKET_MS,
    max_per_call: MAX_BUCKETS_PER_TICK,
    start_behind: 0,
    // `sweep` deletes each entry right after its key, so nothing is left.
    after: |_, _| {},
};

/// When the next bucket of any queue comes due, in ms: kept so that a
/// request with nothing due costs one read for all queues together.
const NEXT_DUE: &str = "sched:next";

/// Whether a bucket of some queue may have come due: `sched:next` is
/// missing, unreadable or not in the future. A store error counts as "due",
/// so the queues' own reads report it.
pub fn anything_due(env: &mut Env) -> bool {
    match env.store.get(NEXT_DUE) {
        Ok(Some(v)) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .is_none_or(|next| next <= env.now_ms),
        Ok(None) | Err(_) => true,
    }
}

/// After every queue has been brought up to date: records when the next
/// bucket of the expiry index or of `others` comes due (bucket `ptr + 1`,
/// due once the clock enters it). Pointers only move forward, so a writer
/// that read older pointers can only write an earlier time — one more check,
/// never a missed bucket. Best effort: without it, the next request checks.
pub(crate) fn note_next_due(env: &mut Env, others: &[&BucketQueue]) {
    let mut next = u64::MAX;
    for q in std::iter::once(&EXPIRY).chain(others.iter().copied()) {
        let ptr = match env.store.get(q.ptr) {
            Ok(Some(raw)) => std::str::from_utf8(&raw)
                .ok()
                .and_then(|s| s.parse::<u64>().ok()),
            _ => None,
        };
        let Some(due) = ptr
            .and_then(|p| p.checked_add(1))
            .and_then(|b| b.checked_mul(q.bucket_ms))
        else {
            return;
        };
        next = next.min(due);
    }
    let _ = env.store.set(NEXT_DUE, next.to_string().as_bytes());
}

/// Sweeps due buckets (at most [`MAX_BUCKETS_PER_TICK`]). Returns how many
/// keys were deleted.
pub fn tick(env: &mut Env) -> Result<usize, ApiError> {
    let (removed, result) = drain_due(env, &EXPIRY, sweep);
    result.map(|()| removed.into_iter().sum())
}

fn sweep(env: &mut Env, bucket: u64) -> Result<usize, ApiError> {
    let count = util::bucket_count_key(QUEUE, bucket);
    let n = env.store.increment(&count, 0)?.max(0) as u64;
    let mut removed = 0;
    let mut i = 1;
    while i <= n {
        let slot = util::bucket_entry_key(QUEUE, bucket, Decimal::of(i));
        let entry = env.store.get(&slot)?;
        if let Some(entry) = entry.as_deref().and_then(|e| std::str::from_utf8(e).ok()) {
            if let Some(key) = entry.strip_prefix("c|") {
                env.store.delete(key)?;
                removed += 1;
            } else if let Some(key) = entry.strip_prefix("r|") {
                // Under the record's lock: an update that read it before
                // cannot write it back.
                if records::remove_expired(env, key)? {
                    removed += 1;
                }
            }
        }
        env.store.delete(&slot)?;
        i += 1;
    }
    env.store.delete(&count)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn keys_keep_their_spelling() {
        assert_eq!(util::bucket_count_key(QUEUE, 5_881_621), "hk:n:5881621");
        assert_eq!(
            util::bucket_entry_key(QUEUE, 5_881_621, Decimal::of_signed(3)),
            "hk:e:5881621:3"
        );
    }
}
