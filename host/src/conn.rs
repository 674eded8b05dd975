//! Connection limits: the cap on open connections (at the cap the server
//! stops accepting, so new connections wait in the kernel's backlog instead
//! of being accepted and starved), the header-read timeout (hyper's, on
//! tokio's timer) and the idle keep-alive timeout (a watchdog per
//! connection over the bytes it moves).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one connection has done: bytes moved (as a count of reads and
/// writes that moved some) and requests being answered.
#[derive(Debug, Default)]
pub struct Activity {
    io: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    /// Marks a request as being answered until the guard is dropped.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Resolves once the connection has moved no byte and answered no
    /// request for `idle` (measured in steps of a quarter of it, so it
    /// resolves between `idle` and 1.25 × `idle` after the last byte).
    pub async fn idle_for(&self, idle: Duration) {
        let step = (idle / 4).max(Duration::from_millis(5));
        let mut last = self.io.load(Ordering::Relaxed);
        let mut quiet = Duration::ZERO;
        loop {
            tokio::time::sleep(step).await;
            let now = self.io.load(Ordering::Relaxed);
            if now != last || self.in_flight.load(Ordering::Relaxed) > 0 {
                last = now;
                quiet = Duration::ZERO;
            } else {
                quiet += step;
                if quiet >= idle {
                    return;
                }
            }
        }
    }
}

/// A request being answered (see [`Activity::request`]).
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that counts its reads and writes into an [`Activity`].
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Tracked<S> {
        Tracked { inner, activity }
    }

    fn moved(&self) {
        self.activity.io.fetch_add(1, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_quiet_and_no_request() {
        let a = Arc::new(Activity::default());
        let busy = a.request();
        let idle = tokio::time::timeout(
            Duration::from_millis(500),
            a.idle_for(Duration::from_millis(100)),
        );
        assert!(idle.await.is_err(), "a request in flight is not idle");
        drop(busy);
        let t = tokio::time::Instant::now();
        a.idle_for(Duration::from_millis(100)).await;
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took <= Duration::from_millis(125),
            "{took:?}"
        );
    }
}
