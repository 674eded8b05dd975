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

// ------------------------------------------------------ the request line

/// How request lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `METHOD PATH STATUS DURATIONms` (the path capped and escaped).
    Text,
    /// One JSON object per request: `time`, `level`, `request_id`,
    /// `method`, `route`, `status`, `user_id` (`null` when no credential
    /// proved one), `duration_ms`.
    Json,
}

impl Format {
    /// Parses `LOG_FORMAT` (unset or empty is `text`).
    pub fn parse(v: Option<&str>) -> Result<Format, String> {
        match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("text") => Ok(Format::Text),
            Some("json") => Ok(Format::Json),
            Some(other) => Err(format!("LOG_FORMAT must be text or json, not {other:?}")),
        }
    }
}

/// The longest path a text line shows, in bytes of its escaped form.
pub const MAX_PATH: usize = 256;

/// `path` as a log line shows it: every byte outside printable ASCII, and
/// `"` and `\`, as `\xNN`; cut after [`MAX_PATH`] bytes with
/// `…(+N bytes)` saying how much was left out.
pub fn shown_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len().min(MAX_PATH) + 16);
    for (i, b) in path.bytes().enumerate() {
        if out.len() >= MAX_PATH {
            out.push_str(&format!("…(+{} bytes)", path.len() - i));
            break;
        }
        if (0x21..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// What the request line says about one request.
pub struct Request<'a> {
    /// The method.
    pub method: &'a str,
    /// The path (the text line shows it capped and escaped; the JSON line
    /// shows `route` instead).
    pub path: &'a str,
    /// The route pattern (`/api/webhooks/{webhookId}`), or `unmatched`.
    pub route: &'a str,
    /// The request id (`X-Request-Id`).
    pub request_id: &'a str,
    /// The user the request acted for, when a credential proved it (JSON
    /// lines only: the component names it only when asked).
    pub user_id: Option<&'a str>,
    /// The status sent.
    pub status: u16,
    /// From the request's head to its response's head.
    pub duration: std::time::Duration,
}

/// The time now as RFC 3339 UTC with milliseconds.
#[allow(clippy::disallowed_methods)] // the host reads the clock for its logs
pub fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The request line of `r` in `format`.
pub fn request_line(format: Format, r: &Request<'_>) -> String {
    match format {
        Format::Text => format!(
            "{} {} {} {}ms",
            r.method,
            shown_path(r.path),
            r.status,
            r.duration.as_millis()
        ),
        Format::Json => serde_json::json!({
            "time": timestamp(),
            "level": "info",
            "request_id": r.request_id,
            "method": r.method,
            "route": r.route,
            "status": r.status,
            "user_id": r.user_id,
            "duration_ms": (r.duration.as_secs_f64() * 1e6).round() / 1e3,
        })
        .to_string(),
    }
}

/// Queues the request line of `r` (at level `info`).
pub fn request(format: Format, r: &Request<'_>) {
    if crate::log::enabled(crate::log::Level::Info) {
        line(&request_line(format, r));
    }
}

// -------------------------------------------------------- the request id

/// The longest `X-Request-Id` taken from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// Whether a client's `X-Request-Id` is kept: 1 to [`MAX_REQUEST_ID`]
/// characters of `A-Z a-z 0-9 . _ -`.
pub fn valid_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_REQUEST_ID
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A fresh request id: this process's random 64-bit prefix and a counter
/// (`3f2a…c1-1a`), unique without a system call per request.
pub fn new_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = *PREFIX.get_or_init(|| {
        let mut b = [0u8; 8];
        if getrandom::getrandom(&mut b).is_err() {
            // No OS randomness: the process id and start time still make
            // collisions between processes unlikely.
            let t = timestamp();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(&(std::process::id(), t), &mut h);
            return std::hash::Hasher::finish(&h);
        }
        u64::from_le_bytes(b)
    });
    format!("{prefix:016x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_capped_and_escaped() {
        assert_eq!(shown_path("/api/health"), "/api/health");
        assert_eq!(shown_path("/a\"b\\c d\n"), "/a\\x22b\\x5cc\\x20d\\x0a");
        assert_eq!(shown_path("/é"), "/\\xc3\\xa9");
        let long = format!("/{}", "x".repeat(20_000));
        let shown = shown_path(&long);
        assert!(shown.starts_with("/xxx"));
        assert!(shown.ends_with(&format!("…(+{} bytes)", 20_001 - MAX_PATH)));
        assert!(shown.len() < MAX_PATH + 24, "{}", shown.len());
    }

    #[test]
    fn request_ids() {
        assert!(valid_request_id(b"abc-DEF_1.2"));
        assert!(valid_request_id(&[b'a'; 128]));
        assert!(!valid_request_id(&[b'a'; 129]));
        assert!(!valid_request_id(b""));
        assert!(!valid_request_id(b"a b"));
        assert!(!valid_request_id(b"a\"b"));
        let (a, b) = (new_request_id(), new_request_id());
        assert_ne!(a, b);
        assert!(valid_request_id(a.as_bytes()), "{a}");
    }

    #[test]
    fn json_line_is_one_object() {
        let r = Request {
            method: "GET",
            path: "/api/webhooks/123",
            route: "/api/webhooks/{webhookId}",
            request_id: "r-1",
            user_id: None,
            status: 200,
            duration: std::time::Duration::from_micros(1500),
        };
        let v: serde_json::Value = serde_json::from_str(&request_line(Format::Json, &r)).unwrap();
        assert_eq!(v["route"], "/api/webhooks/{webhookId}");
        assert_eq!(v["duration_ms"], 1.5);
        assert_eq!(v["request_id"], "r-1");
        assert!(v.get("path").is_none());
        assert_eq!(
            request_line(Format::Text, &r),
            "GET /api/webhooks/123 200 1ms"
        );
    }
}
