//! The per-request log line, written by one thread.
//!
//! Writing each line to stdout from the request's task costs a `write`
//! system call and the stdout lock per request (3–4 % of the host's CPU at
//! concurrency 1 in the profile in `BENCHMARKS.md`). Here the lines go
//! through a channel to a writer thread with a buffer, which flushes
//! whenever it has nothing more to write: under load many lines share a
//! system call, and when idle each line is out at once.

use std::io::Write;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};

enum Msg {
    Line(String),
    /// Flush, then answer.
    Flush(Sender<()>),
}

fn sender() -> &'static Mutex<Sender<Msg>> {
    static TX: OnceLock<Mutex<Sender<Msg>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = channel();
        let spawned = std::thread::Builder::new()
            .name("tfa-access-log".into())
            .spawn(move || writer(rx));
        if let Err(e) = spawned {
            eprintln!("tfa-host: no access-log thread ({e}); request lines are dropped");
        }
        Mutex::new(tx)
    })
}

fn writer(rx: Receiver<Msg>) {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout());
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next {
            match msg {
                Msg::Line(line) => {
                    let _ = out.write_all(line.as_bytes());
                    let _ = out.write_all(b"\n");
                }
                Msg::Flush(done) => {
                    let _ = out.flush();
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
    }
}

/// Queues one line (without its newline) for stdout.
pub fn line(text: String) {
    if let Ok(tx) = sender().lock() {
        let _ = tx.send(Msg::Line(text));
    }
}

/// Waits (at most a second) until every queued line is written.
pub fn flush() {
    let (done, wait) = channel();
    if let Ok(tx) = sender().lock() {
        if tx.send(Msg::Flush(done)).is_err() {
            return;
        }
    }
    let _ = wait.recv_timeout(std::time::Duration::from_secs(1));
}
