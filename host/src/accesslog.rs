//! The per-request log line, written by one thread.
//!
//! Writing each line to stdout from the request's task costs a `write`
//! system call and the stdout lock per request (3–4 % of the host's CPU at
//! concurrency 1 in the profile in `BENCHMARKS.md`), and waking a writer
//! thread per line costs a context switch. Here a line is appended to a
//! shared buffer; a writer thread writes the buffer out every
//! [`FLUSH_EVERY`] (sooner once it holds [`EAGER_BYTES`]). A line reaches
//! stdout at most that long after its request; [`flush`] writes everything
//! at once (at shutdown).

use std::io::Write;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// How often the writer thread writes the buffer out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// A buffer this full is written out without waiting.
pub const EAGER_BYTES: usize = 64 << 10;

struct Shared {
    buf: Mutex<Vec<u8>>,
    full: Condvar,
}

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("tfa-access-log".into())
            .spawn(writer);
        if let Err(e) = spawned {
            eprintln!("tfa-host: no access-log thread ({e}); request lines wait for shutdown");
        }
        Shared {
            buf: Mutex::new(Vec::with_capacity(EAGER_BYTES)),
            full: Condvar::new(),
        }
    })
}

fn writer() {
    let s = shared();
    loop {
        let pending = {
            let Ok(guard) = s.buf.lock() else { return };
            let Ok((mut guard, _)) = s.full.wait_timeout(guard, FLUSH_EVERY) else {
                return;
            };
            std::mem::take(&mut *guard)
        };
        write_out(&pending);
    }
}

fn write_out(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// Queues one line (without its newline) for stdout.
pub fn line(text: &str) {
    let s = shared();
    if let Ok(mut buf) = s.buf.lock() {
        buf.extend_from_slice(text.as_bytes());
        buf.push(b'\n');
        if buf.len() >= EAGER_BYTES {
            s.full.notify_one();
        }
    }
}

/// Writes every queued line now.
pub fn flush() {
    let pending = match shared().buf.lock() {
        Ok(mut buf) => std::mem::take(&mut *buf),
        Err(_) => return,
    };
    write_out(&pending);
}
