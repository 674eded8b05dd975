//! Admission of memory-heavy instances: at most `MAX_HEAVY_INSTANCES` of a
//! component's instances may hold more than [`HEAVY_MEMORY`] of linear
//! memory at once; the others wait, in arrival order, at the `memory.grow`
//! that would take them over it.
//!
//! Why: a login's Argon2 hash fills 19 MiB of fresh memory and reads it
//! back at random. With every request running at once (32 logins on two
//! cores), the hashes' memory together outgrows the processor's caches and
//! each login costs about a third more CPU than when a few run at a time
//! (BENCHMARKS.md, target 4). Light requests (everything that does not
//! hash) never reach the threshold, so they never wait here: they keep
//! running beside the hashes, as before.
//!
//! How a host drives it: each request's store gets a [`Limiter`] built from
//! its component's [`Gate`] (`Store::limiter_async`). Wasmtime asks the
//! limiter before every growth of a linear memory; the first growth past
//! the threshold waits for a permit, which the limiter then holds until
//! the instance hands over its response, starts an outbound call, or ends
//! ([`Release`]): after-response work and waits on other servers never
//! hold one. What it does not do: it never refuses a growth (the pooling
//! allocator's maximum does that), and it bounds only memory growth, not
//! CPU; a request's deadline (`REQUEST_TIMEOUT_MS`) includes its wait.
//! Each component has its own gate, so an API instance holding a permit
//! never waits for one the mailer needs.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::GaugeGuard;

/// Linear memory above which an instance counts as heavy. A request that
/// does not hash stays near 1 MiB; an Argon2 hash at the defaults needs
/// 19 MiB (and at least 8 MiB at OWASP's lowest recommended settings).
pub const HEAVY_MEMORY: usize = 4 << 20;

/// Default of `MAX_HEAVY_INSTANCES`: `heavy_instances_for` this
/// machine's cores.
pub fn default_heavy_instances() -> usize {
    heavy_instances_for(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Two per core, so that a hash waiting for the store after it has hashed
/// does not leave a core idle.
fn heavy_instances_for(cores: usize) -> usize {
    cores.max(1) * 2
}

/// The permits of one component's heavy instances.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
}

impl Gate {
    /// A gate admitting `heavy` instances at once (at least one).
    pub fn new(heavy: usize) -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(heavy.max(1))),
        }
    }

    /// A fresh limiter for one request's store.
    pub fn limiter(&self) -> Limiter {
        Limiter {
            permits: self.permits.clone(),
            state: Arc::new(Mutex::new(State::Light)),
        }
    }
}

/// One store's resource limiter: takes its gate's permit when its memory
/// first grows past [`HEAVY_MEMORY`] and holds it until [`Release`] is
/// called or the store is dropped.
pub struct Limiter {
    permits: Arc<Semaphore>,
    state: Arc<Mutex<State>>,
}

/// Where one store stands with its gate.
enum State {
    /// Below the threshold so far.
    Light,
    /// Past it, holding a permit (given back when dropped).
    Heavy { _held: Held },
    /// Released: the store never takes a permit again.
    Done,
}

/// A permit, counted in the metrics while it is held.
struct Held {
    _permit: OwnedSemaphorePermit,
    _counted: Option<GaugeGuard>,
}

/// Gives a store's permit back before the store ends: when the instance
/// hands over its response or starts an outbound call. Its hashing is
/// over by then, and a slow peer (an SMTP server, a webhook's endpoint)
/// must not keep other logins waiting.
#[derive(Clone)]
pub struct Release(Arc<Mutex<State>>);

impl Release {
    /// Gives the permit back (if any) and exempts the store from the gate.
    pub fn release(&self) {
        let previous = match self.0.lock() {
            Ok(mut state) => std::mem::replace(&mut *state, State::Done),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), State::Done),
        };
        drop(previous);
    }
}

impl Limiter {
    /// The handle that gives this store's permit back early.
    pub fn release(&self) -> Release {
        Release(self.state.clone())
    }

    /// Whether this store holds a permit.
    pub fn is_heavy(&self) -> bool {
        matches!(self.lock().as_deref(), Some(State::Heavy { .. }))
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, State>> {
        self.state.lock().ok()
    }

    fn is_light(&self) -> bool {
        matches!(self.lock().as_deref(), Some(State::Light))
    }

    async fn admit(&mut self) {
        let metrics = crate::metrics::get();
        // Counted as waiting until this future ends, also when it is
        // dropped at the request's deadline.
        let waiting = metrics.map(|m| GaugeGuard::inc(&m.instances_heavy_waiting));
        let permit = self.permits.clone().acquire_owned().await;
        drop(waiting);
        // The semaphore is never closed: a permit always comes.
        let Ok(permit) = permit else { return };
        let held = Held {
            _permit: permit,
            _counted: metrics.map(|m| GaugeGuard::inc(&m.instances_heavy)),
        };
        if let Some(mut state) = self.lock() {
            if matches!(*state, State::Light) {
                *state = State::Heavy { _held: held };
            }
        }
    }
}

#[async_trait::async_trait]
impl wasmtime::ResourceLimiterAsync for Limiter {
    async fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > HEAVY_MEMORY && self.is_light() {
            self.admit().await;
        }
        Ok(true)
    }

    async fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use wasmtime::ResourceLimiterAsync as _;

    /// The gauges are the process's: the tests that move them run one at
    /// a time, or one would see the other's heavy instance.
    static GAUGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn the_second_heavy_store_waits_for_the_first() {
        let _one_at_a_time = GAUGES.lock().await;
        let gate = Gate::new(1);
        let (mut a, mut b) = (gate.limiter(), gate.limiter());
        // Light growth never waits.
        assert!(b.memory_growing(0, 1 << 20, None).await.unwrap());
        assert!(!b.is_heavy());
        assert!(a.memory_growing(1 << 20, 19 << 20, None).await.unwrap());
        assert!(a.is_heavy());
        // Growing again (already admitted) does not wait either.
        assert!(a.memory_growing(19 << 20, 20 << 20, None).await.unwrap());
        let mut waiting = Box::pin(b.memory_growing(1 << 20, 19 << 20, None));
        let early = tokio::time::timeout(Duration::from_millis(50), &mut waiting).await;
        assert!(early.is_err(), "admitted while the only permit was held");
        drop(a);
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        assert!(admitted
            .expect("still waiting after the permit came back")
            .unwrap());
        assert!(b.is_heavy());

        // A released store gives its permit back at once and never takes
        // one again.
        let mut c = gate.limiter();
        let b_release = b.release();
        b_release.release();
        assert!(!b.is_heavy());
        assert!(c.memory_growing(1 << 20, 19 << 20, None).await.unwrap());
        assert!(c.is_heavy());
        assert!(b.memory_growing(19 << 20, 40 << 20, None).await.unwrap());
        assert!(!b.is_heavy());
    }

    #[tokio::test]
    async fn released_before_growing_never_waits() {
        let _one_at_a_time = GAUGES.lock().await;
        let gate = Gate::new(1);
        let mut a = gate.limiter();
        assert!(a.memory_growing(0, 19 << 20, None).await.unwrap());
        let mut b = gate.limiter();
        b.release().release();
        let grown =
            tokio::time::timeout(Duration::from_secs(10), b.memory_growing(0, 19 << 20, None))
                .await;
        assert!(grown.expect("a released store waited at the gate").unwrap());
        assert!(!b.is_heavy() && a.is_heavy());
    }

    #[tokio::test]
    async fn the_gauges_come_back_down_when_a_wait_is_dropped() {
        let _one_at_a_time = GAUGES.lock().await;
        let m = crate::metrics::enable().unwrap();
        let gate = Gate::new(1);
        let mut a = gate.limiter();
        let heavy_before = m.instances_heavy.get();
        assert!(a.memory_growing(0, 19 << 20, None).await.unwrap());
        assert_eq!(m.instances_heavy.get(), heavy_before + 1);
        // B waits, then its future is dropped (as at a request's deadline).
        let mut b = gate.limiter();
        let waiting_before = m.instances_heavy_waiting.get();
        let dropped = tokio::time::timeout(
            Duration::from_millis(50),
            b.memory_growing(0, 19 << 20, None),
        )
        .await;
        assert!(dropped.is_err());
        assert_eq!(m.instances_heavy_waiting.get(), waiting_before);
        drop(a);
        assert_eq!(m.instances_heavy.get(), heavy_before);
    }

    #[test]
    fn two_heavy_instances_per_core() {
        assert_eq!(heavy_instances_for(0), 2);
        assert_eq!(heavy_instances_for(2), 4);
        assert_eq!(heavy_instances_for(8), 16);
    }
}
