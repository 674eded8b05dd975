//! A real SMTP server for the tests: aiosmtpd from `tests/smtp/server.py`,
//! on 127.0.0.1, started and stopped by the test that owns it.
//!
//! The tests that use it FAIL, never skip, when Python (`$TFA_PYTHON`,
//! default `python3`), `aiosmtpd` or `openssl` is missing:
//! `scripts/test-smtp.sh --install-only` installs them.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// The Python that has aiosmtpd: `$TFA_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("TFA_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// One aiosmtpd process and its mail directory.
pub struct SmtpServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl SmtpServer {
    /// Starts `server.py` with `args` (e.g. `--tls starttls`) and waits
    /// (at most 60 s) for it to accept connections.
    pub fn start(args: &[&str]) -> SmtpServer {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tfa-smtp-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mail dir");
        let stderr = std::fs::File::create(dir.join("server.log")).expect("log file");
        let script = crate::root().join("tests/smtp/server.py");
        let mut child = Command::new(python())
            .arg(&script)
            .arg("--dir")
            .arg(&dir)
            .args(["--lifetime", "120"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| {
                let _ = std::fs::remove_dir_all(&dir);
                panic!(
                    "cannot run {} ({e}): run scripts/test-smtp.sh, which installs what these tests need",
                    python()
                )
            });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let port = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&dir);
            panic!(
                "the SMTP test server did not start (is aiosmtpd installed? run scripts/test-smtp.sh):\n{log}"
            );
        };
        SmtpServer { child, port, dir }
    }

    /// The test CA (with `--tls starttls|implicit`).
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.join("ca.pem")).expect("ca.pem")
    }

    /// Waits (at most 10 s) for message `n` and returns it parsed by
    /// Python's e-mail package, with the session facts the server saw.
    pub fn message(&self, n: usize) -> (Value, Value, String) {
        let eml = self.dir.join(format!("{n}.eml"));
        for _ in 0..100 {
            if eml.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let raw = std::fs::read_to_string(&eml).expect("the server received no message");
        let meta: Value = serde_json::from_str(
            &std::fs::read_to_string(self.dir.join(format!("{n}.json"))).expect("meta"),
        )
        .expect("meta json");
        let out = Command::new(python())
            .arg(crate::root().join("tests/smtp/parse_eml.py"))
            .arg(&eml)
            .output()
            .expect("parse_eml.py");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            serde_json::from_slice(&out.stdout).expect("parsed json"),
            meta,
            raw,
        )
    }

    /// Messages received so far.
    pub fn count(&self) -> usize {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "eml"))
                })
                .count()
            })
            .unwrap_or(0)
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        // Closing stdin asks the script to stop; then wait up to 5 s.
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
