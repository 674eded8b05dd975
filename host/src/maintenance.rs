//! Which requests check the service's time-bucketed queues.
//!
//! After its response, a request of the API component reads `sched:next`
//! (has a webhook retry or an expiry sweep come due?), unless its host marks
//! it with `spin-tfa-maintenance: skip` ([`HEADER`];
//! `tfa_core::Reply::skip_maintenance`). Spin marks no request, so there
//! every request reads it. This host lets the first request through and
//! then one per `MAINTENANCE_INTERVAL_MS` (default 1000; 0: every request,
//! as on Spin), and marks the others: under load the read is made about once
//! a second instead of once per request. The queues' buckets are 30 s
//! (webhook retries) and 5 min (expiry), so due work starts at most one
//! interval later than it would have; a host without traffic checks at its
//! next request, as before.
//!
//! A client cannot send the mark: the server removes every `spin-*` header
//! a client sends before it adds its own.
//!
//! # Steps
//!
//! 1. The server asks [`Ticker::check`] as each request arrives.
//! 2. `true` (the first request, or the interval has passed since the last
//!    one let through, and this request won the race for it): the request
//!    goes unmarked and checks the queues after its response.
//! 3. `false`: the server adds [`HEADER`]; the component drops its check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The mark of a request that need not check the queues.
pub const HEADER: http::HeaderName = http::HeaderName::from_static("spin-tfa-maintenance");

/// Its only value.
pub const SKIP: http::HeaderValue = http::HeaderValue::from_static("skip");

/// Default of `MAINTENANCE_INTERVAL_MS`.
pub const DEFAULT_INTERVAL_MS: u64 = 1_000;

/// Lets one request per interval check the queues.
#[derive(Debug)]
pub struct Ticker {
    epoch: Instant,
    interval_ms: u64,
    /// When the last request was let through: ms since `epoch`, plus one
    /// (0: none yet).
    last: AtomicU64,
}

impl Ticker {
    /// A ticker whose first request checks; `interval` zero lets every
    /// request check.
    pub fn new(interval: Duration, epoch: Instant) -> Ticker {
        Ticker {
            epoch,
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last: AtomicU64::new(0),
        }
    }

    /// Whether the request arriving at `now` checks the queues. Of requests
    /// arriving at once when the interval has passed, exactly one does.
    pub fn check(&self, now: Instant) -> bool {
        if self.interval_ms == 0 {
            return true;
        }
        let t = u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && t.saturating_sub(last) < self.interval_ms {
            return false;
        }
        self.last
            .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_checks_then_one_per_interval() {
        let epoch = crate::now();
        let t = Ticker::new(Duration::from_millis(1000), epoch);
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        assert!(t.check(at(0)));
        assert!(!t.check(at(0)));
        assert!(!t.check(at(998)));
        assert!(t.check(at(1000)));
        assert!(!t.check(at(1999)));
        // After a pause, the next request checks whenever it comes.
        assert!(t.check(at(60_000)));
        assert!(!t.check(at(60_001)));
        // A clock reading older than the epoch counts as the epoch.
        let late = Ticker::new(Duration::from_millis(1000), at(5_000));
        assert!(late.check(at(0)));
        assert!(!late.check(at(5_500)));
    }

    #[test]
    fn interval_zero_lets_every_request_check() {
        let epoch = crate::now();
        let t = Ticker::new(Duration::ZERO, epoch);
        assert!((0..10).all(|_| t.check(epoch)));
    }

    #[test]
    fn of_requests_arriving_at_once_exactly_one_checks() {
        let epoch = crate::now();
        let t = std::sync::Arc::new(Ticker::new(Duration::from_millis(1000), epoch));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (t, barrier) = (t.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..1000)
                        .filter(|_| t.check(epoch + Duration::from_millis(5)))
                        .count()
                })
            })
            .collect();
        let passed: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(passed, 1);
    }
}
