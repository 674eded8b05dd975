//! The request line: `LOG_FORMAT=json` (one JSON object per request, the
//! route pattern instead of the raw path), `X-Request-Id` (taken when
//! valid, else generated; returned; passed to the component), the text
//! line's path capped and escaped, and `LOG_LEVEL`.

#![allow(clippy::disallowed_methods)] // the tests time the host with the clock

mod support;

use std::time::{Duration, Instant};

use support::{hang_component, Host};

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The JSON request lines of stdout so far (every stdout line must be one).
fn json_lines(host: &Host) -> Vec<serde_json::Value> {
    host.stdout
        .lock()
        .unwrap()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn line_for(host: &Host, request_id: &str) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(v) = json_lines(host)
            .into_iter()
            .find(|v| v["request_id"] == request_id)
        {
            return v;
        }
        assert!(Instant::now() < until, "no line for {request_id}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn json_lines_and_request_ids() {
    let wasm = hang_component();
    let host = Host::start("logjson", &wasm, &[("LOG_FORMAT", "json")]);

    // A valid id from the client is kept, returned, and seen by the
    // component; the line names the route, not the id in the path.
    let (status, head, body) = host.request(
        "GET",
        "/api/webhooks/wh_123456/request-id",
        "X-Request-Id: client-id.1_A\r\n",
    );
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "x-request-id"), Some("client-id.1_A"));
    assert!(body.contains("client-id.1_A"), "{body:?}");
    let (status, _, _) = host.request(
        "DELETE",
        "/api/webhooks/wh_secret_42",
        "X-Request-Id: rid-2\r\n",
    );
    assert_eq!(status, 200);
    let v = line_for(&host, "rid-2");
    assert_eq!(v["method"], "DELETE");
    assert_eq!(v["route"], "/api/webhooks/{webhookId}");
    assert_eq!(v["status"], 200);
    assert_eq!(v["level"], "info");
    assert!(v["duration_ms"].as_f64().is_some_and(|d| d >= 0.0), "{v}");
    let time = v["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
    assert!(!v.to_string().contains("wh_secret_42"), "{v}");

    // Invalid ids (a space; 129 characters) are replaced by generated ones.
    for bad in ["has space", &"a".repeat(129)] {
        let (status, head, body) = host.request(
            "GET",
            "/api/x/request-id",
            &format!("X-Request-Id: {bad}\r\n"),
        );
        assert_eq!(status, 200);
        let id = header(&head, "x-request-id").expect("an id").to_string();
        assert_ne!(id, bad);
        assert!(
            id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{id}"
        );
        assert!(body.contains(&id), "the component saw {body:?}, not {id}");
        assert_eq!(line_for(&host, &id)["route"], "unmatched");
    }
    // No id: one is generated.
    let (_, head, _) = host.request("GET", "/api/health", "");
    let id = header(&head, "x-request-id").expect("an id");
    assert_eq!(line_for(&host, id)["route"], "/api/health");

    // A 20 KB path: the line stays short and names no path.
    let long = format!("/api/{}", "p".repeat(20_000));
    let (_, head, _) = host.request("GET", &long, "X-Request-Id: long\r\n");
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    let v = line_for(&host, "long");
    assert!(v.to_string().len() < 400, "{v}");
}

/// With `LOG_FORMAT=json` the line names the user a credential proved
/// (the component's `tfa-user-id` answer to the host's `spin-tfa-observe`),
/// and the client never sees that header.
#[test]
fn json_lines_name_the_proven_user() {
    let wasm = support::real_component();
    let host = Host::start(
        "loguser",
        &wasm,
        &[("LOG_FORMAT", "json"), ("RATE_LIMIT_ENABLED", "false")],
    );
    let json = "Content-Type: application/json\r\n";
    let (status, head, body) = support::request_with_body(
        host.port,
        "POST",
        "/api/auth/register",
        &format!("{json}X-Request-Id: reg-1\r\n"),
        r#"{"email":"lou@example.com","username":"lou","password":"Correct-Horse-9"}"#,
    );
    assert_eq!(status, 201, "{head}{body}");
    assert_eq!(header(&head, "tfa-user-id"), None, "{head}");
    let data: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = data["data"]["user"]["id"].as_str().unwrap().to_string();
    let token = data["data"]["accessToken"].as_str().unwrap().to_string();
    assert_eq!(line_for(&host, "reg-1")["user_id"], id.as_str());

    let (status, head, _) = host.request(
        "GET",
        "/api/auth/me",
        &format!("Authorization: Bearer {token}\r\nX-Request-Id: me-1\r\n"),
    );
    assert_eq!(status, 200);
    assert_eq!(header(&head, "tfa-user-id"), None, "{head}");
    let v = line_for(&host, "me-1");
    assert_eq!(v["user_id"], id.as_str());
    assert_eq!(v["route"], "/api/auth/me");

    // A wrong password for that user, a forged token: no user named.
    let (status, _, _) = support::request_with_body(
        host.port,
        "POST",
        "/api/auth/login",
        &format!("{json}X-Request-Id: bad-1\r\n"),
        r#"{"emailOrUsername":"lou","password":"Wrong-Horse-99"}"#,
    );
    assert_eq!(status, 401);
    assert!(line_for(&host, "bad-1")["user_id"].is_null());
    let (status, _, _) = host.request(
        "GET",
        "/api/auth/me",
        "Authorization: Bearer a.b.c\r\nX-Request-Id: bad-2\r\n",
    );
    assert_eq!(status, 401);
    assert!(line_for(&host, "bad-2")["user_id"].is_null());
}

#[test]
fn text_lines_are_capped_and_levels_honoured() {
    let wasm = hang_component();
    let host = Host::start("logtext", &wasm, &[]);
    let long = format!("/api/\"q\"{}", "p".repeat(20_000));
    let (status, _, _) = host.request("GET", &long, "");
    assert_eq!(status, 200);
    let line = host
        .wait_line(false, "GET /api/", Duration::from_secs(3))
        .expect("a request line");
    assert!(line.len() < 400, "{} bytes", line.len());
    assert!(line.starts_with("GET /api/\\x22q\\x22ppp"), "{line}");
    assert!(line.contains("…(+"), "{line}");
    assert!(line.ends_with("ms"), "{line}");
    drop(host);

    // LOG_LEVEL=error: no request lines.
    let host = Host::start("loglevel", &wasm, &[("LOG_LEVEL", "error")]);
    for _ in 0..3 {
        assert_eq!(host.request("GET", "/api/health", "").0, 200);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        host.stdout.lock().unwrap().is_empty(),
        "{:?}",
        host.stdout.lock().unwrap()
    );

    // An unknown level is refused at start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tfa-host"))
        .env("LOG_LEVEL", "verbose")
        .env("PORT", "0")
        .env("COMPONENT_PATH", &wasm)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("LOG_LEVEL must be"));
}

/// The `kv-ops` lines of `label` once there are `n` of them (or 5 s passed).
fn kv_ops(host: &Host, label: &str, n: usize) -> Vec<String> {
    let needle = format!("kv-ops {label} ");
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<String> = host
            .stdout
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| l.split_once(&needle).map(|(_, rest)| rest.to_string()))
            .collect();
        if lines.len() >= n || Instant::now() > until {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reads of a `kv-ops … total` line, and whether it made nothing else.
fn total_reads(line: &str) -> (u32, bool) {
    let rest = line
        .strip_prefix("total get=")
        .unwrap_or_else(|| panic!("{line}"));
    let (gets, others) = rest.split_once(' ').unwrap_or_else(|| panic!("{line}"));
    let gets = gets.parse().unwrap_or_else(|_| panic!("{line}"));
    (gets, others == "set=0 delete=0 increment=0 other=0")
}

/// `KV_COUNT=true` (what `scripts/bench.sh` counts store operations with):
/// the operations before the response are counted when the component hands
/// its response over, not when the host gets round to receiving it, by
/// which time the work after the response may have run. `GET /api/health`
/// reads the store once before its answer and does nothing after it;
/// `GET /api/health/live` touches nothing before its answer and, with
/// `MAINTENANCE_INTERVAL_MS=0` (every request checks, as under Spin), reads
/// the maintenance schedule (`sched:next`) after it, even when a client
/// sends the host's mark to skip that (the host removes a client's `spin-*`
/// headers).
#[test]
fn kv_count_splits_store_operations_at_the_response() {
    let wasm = support::real_component();
    let host = Host::start(
        "kvcount",
        &wasm,
        &[("KV_COUNT", "true"), ("MAINTENANCE_INTERVAL_MS", "0")],
    );
    let rounds = 20;
    for _ in 0..rounds {
        assert_eq!(host.request("GET", "/api/health", "").0, 200);
        let forged = "spin-tfa-maintenance: skip\r\n";
        assert_eq!(host.request("GET", "/api/health/live", forged).0, 200);
    }
    // `total`: the exact reads in all, or None where they vary: after
    // `/health/live` on a fresh store maintenance is due until the sweep
    // has caught up, and such a request reads more (always `sched:next`).
    let check = |label: &str, before: u32, total: Option<u32>| {
        let lines = kv_ops(&host, label, 2 * rounds);
        assert_eq!(lines.len(), 2 * rounds, "{lines:#?}");
        let nothing_else = "set=0 delete=0 increment=0 other=0";
        for line in &lines {
            if let Some(rest) = line.strip_prefix("before-response get=") {
                assert_eq!(rest, format!("{before} {nothing_else}"), "{lines:#?}");
            } else {
                let (reads, only_reads) = total_reads(line);
                match total {
                    Some(total) => assert!(reads == total && only_reads, "{lines:#?}"),
                    None => assert!(reads >= 1, "{lines:#?}"),
                }
            }
        }
    };
    check("GET /api/health", 1, Some(1));
    check("GET /api/health/live", 0, None);
}

/// Issue #15: by default one request per `MAINTENANCE_INTERVAL_MS` checks
/// the service's queues (`sched:next`) after its response and the host marks
/// the others to skip that read: the host's first request reads it, the
/// rest of a burst within the interval read nothing after their response,
/// and once the interval has passed the next request reads it again.
#[test]
fn one_request_per_maintenance_interval_checks_the_queues() {
    let wasm = support::real_component();
    let host = Host::start(
        "kvtick",
        &wasm,
        &[("KV_COUNT", "true"), ("MAINTENANCE_INTERVAL_MS", "1500")],
    );
    let label = "GET /api/health/live";
    let started = Instant::now();
    let burst = 10;
    for _ in 0..burst {
        assert_eq!(host.request("GET", "/api/health/live", "").0, 200);
    }
    let in_burst = started.elapsed();
    // Per request: whether it touched the store after its response (a check
    // reads `sched:next`; on a fresh store it also sets up the queues).
    let totals = |n: usize| -> Vec<bool> {
        let lines = kv_ops(&host, label, 2 * n);
        assert_eq!(lines.len(), 2 * n, "{lines:#?}");
        lines
            .iter()
            .filter(|l| l.starts_with("total "))
            .map(|l| total_reads(l) != (0, true))
            .collect()
    };
    // A request's `total` line comes when its after-response work ends,
    // so the lines need not be in the requests' order: count them.
    let checked = |reads: &[bool]| reads.iter().filter(|&&r| r).count();
    let reads = totals(burst);
    let in_burst_checks = checked(&reads);
    if in_burst < Duration::from_millis(1500) {
        assert_eq!(in_burst_checks, 1, "one check in the burst: {reads:?}");
    } else {
        assert!(in_burst_checks >= 1, "{reads:?}");
    }
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(host.request("GET", "/api/health/live", "").0, 200);
    let reads = totals(burst + 1);
    assert_eq!(
        checked(&reads),
        in_burst_checks + 1,
        "the request after the interval checks: {reads:?}"
    );
    assert!(
        host.wait_line(true, "MAINTENANCE_INTERVAL_MS=1500", Duration::from_secs(1))
            .is_some(),
        "the limits line names the interval"
    );
}
