//! The host's own log lines on stderr, filtered by `LOG_LEVEL` (`error`,
//! `warn`, `info` — the default — or `debug`). The per-request lines go to
//! stdout through [`crate::accesslog`] at level `info`.

use std::sync::atomic::{AtomicU8, Ordering};

/// A log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failures.
    Error = 0,
    /// Limits hit, refusals.
    Warn = 1,
    /// Start-up lines and one line per request.
    Info = 2,
    /// Everything else (idle connections closed, …).
    Debug = 3,
}

impl Level {
    /// Parses `LOG_LEVEL` (case-insensitive; unset or empty is `info`).
    pub fn parse(v: Option<&str>) -> Result<Level, String> {
        match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("info") => Ok(Level::Info),
            Some("error") => Ok(Level::Error),
            Some("warn") | Some("warning") => Ok(Level::Warn),
            Some("debug") => Ok(Level::Debug),
            Some(other) => Err(format!(
                "LOG_LEVEL must be error, warn, info or debug, not {other:?}"
            )),
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Sets the level (once, at start).
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether lines of `level` are written.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn write(level: Level, text: &str) {
    if enabled(level) {
        eprintln!("tfa-host: {text}");
    }
}

/// A failure.
pub fn error(text: &str) {
    write(Level::Error, text);
}

/// A limit hit or a refusal.
pub fn warn(text: &str) {
    write(Level::Warn, text);
}

/// An ordinary event.
pub fn info(text: &str) {
    write(Level::Info, text);
}

/// A detail.
pub fn debug(text: &str) {
    write(Level::Debug, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse() {
        assert_eq!(Level::parse(None), Ok(Level::Info));
        assert_eq!(Level::parse(Some(" DEBUG ")), Ok(Level::Debug));
        assert_eq!(Level::parse(Some("warn")), Ok(Level::Warn));
        assert_eq!(Level::parse(Some("error")), Ok(Level::Error));
        assert!(Level::parse(Some("verbose"))
            .unwrap_err()
            .contains("LOG_LEVEL"));
        assert!(Level::Error < Level::Debug);
    }
}
