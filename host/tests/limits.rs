//! The local host's limits against a real guest: the request deadline
//! (`REQUEST_TIMEOUT_MS`) stops a guest that never returns; the gate of
//! memory-heavy instances (`MAX_HEAVY_INSTANCES`) lets them grow one
//! batch at a time and never holds up light requests; the connection
//! limits (`HEADER_READ_TIMEOUT_MS`, `IDLE_TIMEOUT_MS`, `MAX_CONNECTIONS`)
//! hold against half-open and idle connections; a client that leaves
//! while it waits for an instance slot is no longer counted as waiting,
//! and one that leaves while its instance runs does not stop the instance.

#![allow(clippy::disallowed_methods)] // the tests time the host with the clock

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{hang_component, Host};

#[test]
fn a_guest_that_never_returns_is_stopped_at_the_deadline() {
    let wasm = hang_component();
    let host = Host::start("deadline", &wasm, &[("REQUEST_TIMEOUT_MS", "3000")]);
    let port = host.port;

    // A few hanging requests; others are served meanwhile: their answers
    // come before any hanging request's 503. (An order, not a time bound:
    // a busy machine may serve them slowly, but a host whose looping
    // guests held up other requests would answer these only after the
    // deadline has stopped the guests.)
    let t0 = Instant::now();
    let hanging: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                (
                    support::request(port, "GET", "/api/hang", ""),
                    Instant::now(),
                )
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let (status, head, _) = host.request("GET", "/api/health", "");
        assert_eq!(status, 200, "{head}");
    }
    let served = Instant::now();
    for h in hanging {
        let ((status, head, body), answered) = h.join().unwrap();
        assert!(
            served < answered,
            "normal requests were answered after a hanging one ({:?} after the start)",
            served - t0
        );
        assert_eq!(status, 503, "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success": false, "error": "Service unavailable"})
        );
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(2950) && took < Duration::from_millis(8000),
        "hanging requests ended after {took:?}"
    );
    hang_stopped_before_answering(&host, 3000, Duration::from_secs(2));

    // More hanging requests than there are instance slots (64): every one
    // ends with 503, so the slots are freed and reused.
    let n = 70;
    let t0 = Instant::now();
    let hanging: Vec<_> = (0..n)
        .map(|_| std::thread::spawn(move || support::request(port, "GET", "/api/hang", "").0))
        .collect();
    let statuses: Vec<u16> = hanging.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    // 70 > 64: some waited for a slot, so two deadlines at least.
    assert!(
        t0.elapsed() >= Duration::from_millis(5900),
        "{:?}",
        t0.elapsed()
    );
    let until = Instant::now() + Duration::from_secs(3);
    while host.count_lines(true, "request deadline exceeded") < 4 + n && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        host.count_lines(true, "request deadline exceeded"),
        4 + n,
        "one log line per stopped instance"
    );
    // Every slot is back: a normal request is served.
    let (status, _, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200);
}

#[test]
fn a_client_that_leaves_does_not_stop_its_instance() {
    // The instance runs in the request's own task until it answers
    // (`server::Run`); a client that closes its connection first must not
    // take the instance with it (a half-done sequence of store writes):
    // the run goes on in a task of its own until it ends, here at the
    // deadline, which logs its line only if the run was still going.
    let wasm = hang_component();
    let host = Host::start("left", &wasm, &[("REQUEST_TIMEOUT_MS", "1500")]);
    let mut s = TcpStream::connect(("127.0.0.1", host.port)).unwrap();
    s.write_all(b"GET /api/hang HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    // Only a run that went on after its client left reaches the deadline.
    hang_stopped_before_answering(&host, 1500, Duration::from_secs(10));
    // Its slot is back: a normal request is served.
    let (status, _, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200);
}

/// Waits `within` for the log line of a `GET /api/hang` stopped at the
/// deadline (`REQUEST_TIMEOUT_MS=timeout_ms`) before it answered.
fn hang_stopped_before_answering(host: &Host, timeout_ms: u32, within: Duration) {
    let needle =
        format!("request deadline exceeded (REQUEST_TIMEOUT_MS={timeout_ms}): GET /api/hang");
    let line = host
        .wait_line(true, &needle, within)
        .expect("a deadline line");
    assert!(
        line.contains("before any response (answered 503)"),
        "{line}"
    );
}

/// Opens a connection and sends half a request line.
fn half_open(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /api/hea").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads until the server closes; the time that took, or None if it
/// did not within the read timeout.
fn closed_after(mut s: TcpStream, t0: Instant) -> Option<Duration> {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

#[test]
fn half_open_connections_are_closed_after_the_header_timeout() {
    let wasm = hang_component();
    let host = Host::start(
        "slowloris",
        &wasm,
        &[
            ("HEADER_READ_TIMEOUT_MS", "1000"),
            ("IDLE_TIMEOUT_MS", "60000"),
            ("MAX_CONNECTIONS", "100"),
        ],
    );
    let t0 = Instant::now();
    let open: Vec<TcpStream> = (0..60).map(|_| half_open(host.port)).collect();
    // A normal request is served while they are open.
    let (status, head, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200, "{head}");
    let served = t0.elapsed();
    let closed: Vec<_> = open
        .into_iter()
        .map(|s| std::thread::spawn(move || closed_after(s, t0)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for c in &closed {
        let c = c.expect("a half-open connection was still open after 20 s");
        assert!(
            c >= Duration::from_millis(950) && c < Duration::from_secs(5),
            "closed after {c:?}"
        );
        // Served while they were all open (an order, not a time bound).
        assert!(
            served < c,
            "served after {served:?}, one closed after {c:?}"
        );
    }
    assert!(host
        .wait_line(
            true,
            "closed: no complete request head within HEADER_READ_TIMEOUT_MS=1000",
            Duration::from_secs(2)
        )
        .is_some());
}

#[test]
fn at_the_connection_cap_new_connections_wait_unaccepted() {
    let wasm = hang_component();
    let host = Host::start(
        "conncap",
        &wasm,
        &[("HEADER_READ_TIMEOUT_MS", "1500"), ("MAX_CONNECTIONS", "5")],
    );
    let t0 = Instant::now();
    let open: Vec<TcpStream> = (0..10).map(|_| half_open(host.port)).collect();
    let closed: Vec<Duration> = open
        .into_iter()
        .map(|s| std::thread::spawn(move || closed_after(s, t0)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap().expect("closed within 20 s"))
        .collect();
    // The first five are accepted at once and closed at the header
    // timeout; the other five wait in the backlog (their header timer has
    // not started: never accepted) and are accepted one by one as slots
    // free, so they are closed a whole timeout later.
    let first = closed
        .iter()
        .filter(|c| **c < Duration::from_millis(2500))
        .count();
    assert_eq!(first, 5, "closing times {closed:?}");
    assert!(
        closed.iter().all(|c| *c >= Duration::from_millis(1400)),
        "{closed:?}"
    );
    assert!(host
        .wait_line(
            true,
            "MAX_CONNECTIONS=5 connections open: not accepting more",
            Duration::from_secs(2)
        )
        .is_some());
    // Below the cap again: served.
    let (status, _, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200);
}

#[test]
fn idle_keep_alive_connections_are_closed() {
    let wasm = hang_component();
    let host = Host::start(
        "idle",
        &wasm,
        &[
            ("IDLE_TIMEOUT_MS", "400"),
            ("HEADER_READ_TIMEOUT_MS", "10000"),
        ],
    );
    let mut s = TcpStream::connect(("127.0.0.1", host.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /api/health HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let t0 = Instant::now();
    let c = closed_after(s, t0).expect("the idle connection was not closed");
    assert!(
        c >= Duration::from_millis(350) && c < Duration::from_millis(2000),
        "closed after {c:?}"
    );
}

#[test]
fn memory_heavy_instances_wait_at_the_gate_until_an_answer() {
    let wasm = hang_component();
    let (host, mport) = Host::start_with_metrics(
        "gate",
        &wasm,
        &[("MAX_HEAVY_INSTANCES", "1"), ("REQUEST_TIMEOUT_MS", "5000")],
    );
    let port = host.port;
    host.wait_line(true, "MAX_HEAVY_INSTANCES=1", Duration::from_secs(5))
        .expect("the limits line names MAX_HEAVY_INSTANCES");
    let timed = move |path: &'static str| {
        std::thread::spawn(move || {
            let (status, head, body) = support::request(port, "GET", path, "");
            (status, head, body, Instant::now())
        })
    };

    // A fills 24 MiB and computes for 1.5 s before answering; B, sent while
    // A computes, fills 24 MiB and answers at once: it can only grow once
    // A's permit is back, so it answers after A.
    let a = timed("/api/heavy?ms=1500");
    std::thread::sleep(Duration::from_millis(300));
    let b = timed("/api/heavy?ms=0");
    std::thread::sleep(Duration::from_millis(200));
    // Light requests do not wait at the gate.
    let (status, head, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200, "{head}");
    let (status, _, metrics) = support::request(mport, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(
        !a.is_finished() && !b.is_finished(),
        "a heavy request ended before the light one was served"
    );
    let gauge = |name| support::metric_value(&metrics, name, &[]);
    assert_eq!(
        (
            gauge("tfa_instances_heavy"),
            gauge("tfa_instances_heavy_waiting")
        ),
        (1.0, 1.0),
        "{metrics}"
    );
    let (a_status, a_head, a_body, a_done) = a.join().unwrap();
    let (b_status, b_head, b_body, b_done) = b.join().unwrap();
    assert_eq!((a_status, a_body.as_str()), (200, "heavy"), "{a_head}");
    assert_eq!((b_status, b_body.as_str()), (200, "heavy"), "{b_head}");
    assert!(
        b_done > a_done,
        "the second heavy instance grew while the only permit was held"
    );

    // C answers, then keeps running until the deadline stops it; D, sent
    // after C's answer, is not held up by C's after-answer work: the
    // permit went back with C's answer.
    let c = timed("/api/heavy-linger");
    let (c_status, c_head, c_body, _) = c.join().unwrap();
    assert_eq!((c_status, c_body.as_str()), (200, "lingering"), "{c_head}");
    let (d_status, d_head, d_body) = host.request("GET", "/api/heavy?ms=0", "");
    assert_eq!((d_status, d_body.as_str()), (200, "heavy"), "{d_head}");
    assert_eq!(
        host.count_lines(true, "request deadline exceeded"),
        0,
        "D waited for C's end"
    );
    host.wait_line(
        true,
        "request deadline exceeded (REQUEST_TIMEOUT_MS=5000): GET /api/heavy-linger stopped",
        Duration::from_secs(10),
    )
    .expect("C was stopped at its deadline");
}

/// A client that leaves while its request waits for an instance slot is
/// not counted as waiting any more, and its request never runs: the
/// waiting gauge's guard goes with the dropped request, while all 64
/// slots are still held by guests that have not reached their deadline.
#[test]
fn a_client_that_leaves_while_waiting_for_a_slot_is_no_longer_counted() {
    let wasm = hang_component();
    let (host, mport) =
        Host::start_with_metrics("leave-waiting", &wasm, &[("REQUEST_TIMEOUT_MS", "10000")]);
    let port = host.port;
    let gauges = || {
        let (status, _, metrics) = support::request(mport, "GET", "/metrics", "");
        assert_eq!(status, 200);
        (
            support::metric_value(&metrics, "tfa_instances_in_use", &[]),
            support::metric_value(&metrics, "tfa_instances_waiting", &[]),
        )
    };
    let wait_for = |want: (f64, f64), what: &str| {
        let until = Instant::now() + Duration::from_secs(5);
        let mut seen = gauges();
        while seen != want && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
            seen = gauges();
        }
        assert_eq!(seen, want, "{what}: (in use, waiting)");
    };

    let t0 = Instant::now();
    let hanging: Vec<_> = (0..64)
        .map(|_| std::thread::spawn(move || support::request(port, "GET", "/api/hang", "").0))
        .collect();
    wait_for((64.0, 0.0), "every slot held by a hanging guest");

    // A 65th request waits for a slot; then its client goes away.
    let mut leaving = TcpStream::connect(("127.0.0.1", port)).unwrap();
    leaving
        .write_all(format!("GET /api/hang HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
        .unwrap();
    wait_for((64.0, 1.0), "the 65th request waits");
    drop(leaving);
    wait_for((64.0, 0.0), "the client left");
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "too slow to tell a left client from a freed slot: {:?}",
        t0.elapsed()
    );

    let statuses: Vec<u16> = hanging.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    // The left request never ran: 64 instances stopped, not 65.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(host.count_lines(true, "request deadline exceeded"), 64);
    wait_for((0.0, 0.0), "every slot back");
    let (status, _, _) = host.request("GET", "/api/health", "");
    assert_eq!(status, 200);
}
