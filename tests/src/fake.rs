//! A tiny HTTP/1.1 server on 127.0.0.1 for services that cannot be reached
//! from here (Twilio's API) and for webhook receivers: it records every
//! request and answers from a queue of statuses (then 201); the status
//! [`HANG`] holds the connection without answering, to make callers time out.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A queued "status" that never answers: the connection is held for
/// [`HANG_FOR`] and then closed.
pub const HANG: u16 = 0;
/// How long a [`HANG`] holds the connection.
pub const HANG_FOR: Duration = Duration::from_secs(20);

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Received {
    /// First value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A running fake server; stops when dropped.
pub struct FakeServer {
    /// Its port.
    pub port: u16,
    /// Requests so far.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Statuses for the next answers.
    pub statuses: Arc<Mutex<VecDeque<u16>>>,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    /// Starts serving on a free port.
    pub fn start() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("addr").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(VecDeque::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, st) = (received.clone(), statuses.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (r, s) = (r.clone(), s.clone());
                        std::thread::spawn(move || answer(stream, &r, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        FakeServer {
            port,
            received,
            statuses,
            stop,
        }
    }

    /// `http://127.0.0.1:port`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits (bounded) until `n` requests have arrived; returns them.
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let start = Instant::now();
        loop {
            let got = self.received.lock().map(|v| v.clone()).unwrap_or_default();
            if got.len() >= n || start.elapsed() > limit {
                return got;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads one request, records it, answers it from the queue.
fn answer(
    stream: std::net::TcpStream,
    received: &Mutex<Vec<Received>>,
    statuses: &Mutex<VecDeque<u16>>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Some(req) = read_request(&stream) else {
        return;
    };
    let status = statuses
        .lock()
        .ok()
        .and_then(|mut q| q.pop_front())
        .unwrap_or(201);
    if let Ok(mut v) = received.lock() {
        v.push(req);
    }
    if status == HANG {
        std::thread::sleep(HANG_FOR);
        return;
    }
    let body = br#"{"sid":"SM00000000000000000000000000000000","status":"queued"}"#;
    let mut w = &stream;
    let _ = write!(
        w,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = w.write_all(body);
}

fn read_request(stream: &std::net::TcpStream) -> Option<Received> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    Some(Received {
        method,
        path,
        headers,
        body,
    })
}
