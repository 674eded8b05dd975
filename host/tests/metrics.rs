//! `METRICS_ADDR`: the Prometheus text format on a listener of its own,
//! scraped during a small load; counters increase, histograms have
//! buckets, and Prometheus's own Python client parses it (PyPI
//! `prometheus-client`, installed by this test with pip when missing).

#![allow(clippy::disallowed_methods)] // the tests time the host with the clock

mod support;

use std::process::Command;
use std::time::Duration;

use support::{metric_value as value, real_component, Host};

fn scrape(port: u16) -> String {
    let (status, head, body) = support::request(port, "GET", "/metrics", "");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("text/plain; version=0.0.4"),
        "{head}"
    );
    body
}

/// Parses `text` with prometheus_client's parser; the families found.
fn python_parse(text: &str) -> Vec<String> {
    let have = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .status()
        .expect("python3 must be installed for this test");
    if !have.success() {
        let ok = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "prometheus-client"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "pip install prometheus-client failed");
    }
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tfa-metrics-{}-{n}.txt", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys\n\
             from prometheus_client.parser import text_string_to_metric_families\n\
             for f in text_string_to_metric_families(open(sys.argv[1]).read()):\n\
             \x20   print(f.name, f.type, len(f.samples))",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "the parser refused the metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn metrics_under_load() {
    let wasm = real_component();
    let (host, mport) =
        Host::start_with_metrics("metrics", &wasm, &[("RATE_LIMIT_ENABLED", "false")]);
    let port = host.port;

    let before = scrape(mport);
    let health_before = value(
        &before,
        "tfa_http_requests_total",
        &["route=\"/api/health\"", "status=\"200\""],
    );
    let gets_before = value(
        &before,
        "tfa_store_operation_duration_seconds_count",
        &["op=\"get\""],
    );
    // A small load: 4 threads × 25 requests, scraped meanwhile.
    let load: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let path = if i == 0 {
                        "/api/webhooks/wh_1"
                    } else {
                        "/api/health"
                    };
                    let want = if i == 0 { 401 } else { 200 };
                    assert_eq!(support::request(port, "GET", path, "").0, want);
                }
            })
        })
        .collect();
    let during = scrape(mport);
    for t in load {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let after = scrape(mport);

    let health = |t: &str| {
        value(
            t,
            "tfa_http_requests_total",
            &["route=\"/api/health\"", "status=\"200\""],
        )
    };
    assert!(health(&during) >= health_before);
    assert_eq!(health(&after) - health_before, 75.0, "{after}");
    assert_eq!(
        value(
            &after,
            "tfa_http_requests_total",
            &["route=\"/api/webhooks/{webhookId}\"", "method=\"GET\""]
        ),
        25.0
    );
    assert_eq!(
        value(
            &after,
            "tfa_http_requests_total",
            &["route=\"/api/webhooks/{webhookId}\"", "status=\"401\""]
        ),
        25.0
    );
    // Health reads the store: store reads were timed.
    let gets = value(
        &after,
        "tfa_store_operation_duration_seconds_count",
        &["op=\"get\""],
    );
    assert!(gets - gets_before >= 75.0, "{gets_before} → {gets}");
    assert!(after.contains("tfa_store_operation_duration_seconds_bucket{op=\"get\",le=\"0.001\"}"));
    // The histogram: buckets, cumulative, +Inf equal to the count.
    let buckets: Vec<f64> = after
        .lines()
        .filter(|l| {
            l.starts_with("tfa_http_request_duration_seconds_bucket{")
                && l.contains("route=\"/api/health\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(buckets.len() >= 10, "{after}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(
        *buckets.last().unwrap(),
        value(
            &after,
            "tfa_http_request_duration_seconds_count",
            &["route=\"/api/health\""]
        )
    );
    assert_eq!(value(&after, "tfa_instances_in_use", &[]), 0.0);
    assert_eq!(value(&after, "tfa_instances_waiting", &[]), 0.0);
    assert_eq!(value(&after, "tfa_instances_heavy", &[]), 0.0);
    assert_eq!(value(&after, "tfa_instances_heavy_waiting", &[]), 0.0);
    for name in [
        "tfa_store_operation_duration_seconds",
        "tfa_store_errors_total",
        "tfa_outbound_requests_total",
        "tfa_connections_open",
        "tfa_instances_heavy",
        "tfa_instances_heavy_waiting",
    ] {
        assert!(
            after.contains(&format!("# TYPE {name} ")),
            "no {name} in {after}"
        );
    }

    let families = python_parse(&after);
    for f in [
        "tfa_http_requests counter",
        "tfa_http_request_duration_seconds histogram",
        "tfa_instances_in_use gauge",
    ] {
        assert!(
            families.iter().any(|l| l.starts_with(f)),
            "{f} not parsed: {families:?}"
        );
    }
    // Anything but /metrics is 404.
    assert_eq!(support::request(mport, "GET", "/", "").0, 404);
}

/// `tfa_webhook_deliveries_pending`: read from the store at each scrape.
/// A delivery to a closed port stays pending (its retry is queued); it
/// leaves when its hook is deleted.
#[test]
fn pending_webhook_deliveries() {
    let wasm = real_component();
    let closed = support::free_port();
    let allowed = format!("http://127.0.0.1:{closed}");
    let (host, mport) = Host::start_with_metrics(
        "metrics-webhooks",
        &wasm,
        &[
            ("RATE_LIMIT_ENABLED", "false"),
            ("WEBHOOK_ALLOW_PRIVATE", "true"),
            ("ALLOWED_OUTBOUND_HOSTS", allowed.as_str()),
        ],
    );
    let pending = || value(&scrape(mport), "tfa_webhook_deliveries_pending", &[]);
    assert_eq!(pending(), 0.0);

    let json = "Content-Type: application/json\r\n";
    let (status, _, body) = support::request_with_body(
        host.port,
        "POST",
        "/api/auth/register",
        json,
        r#"{"email":"wes@example.com","username":"wes","password":"Correct-Horse-9"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let auth = format!(
        "{json}Authorization: Bearer {}\r\n",
        v["data"]["accessToken"].as_str().unwrap()
    );
    let (status, _, body) = support::request_with_body(
        host.port,
        "POST",
        "/api/webhooks",
        &auth,
        &format!(r#"{{"url":"{allowed}/hook","events":["webhook.test"]}}"#),
    );
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = v["data"]["id"].as_str().unwrap().to_string();
    let (status, _, body) = support::request_with_body(
        host.port,
        "POST",
        &format!("/api/webhooks/{id}/test"),
        &auth,
        "{}",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(pending(), 1.0);
    // The attempt fails (nothing listens) and is recorded; still pending.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, body) = support::request(
            host.port,
            "GET",
            &format!("/api/webhooks/{id}/deliveries"),
            &auth,
        );
        if body.contains("\"attempts\":[{") {
            break;
        }
        assert!(std::time::Instant::now() < until, "no attempt: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pending(), 1.0);
    let (status, _, _) =
        support::request(host.port, "DELETE", &format!("/api/webhooks/{id}"), &auth);
    assert_eq!(status, 200);
    assert_eq!(pending(), 0.0);
    let families = python_parse(&scrape(mport));
    assert!(
        families
            .iter()
            .any(|l| l.starts_with("tfa_webhook_deliveries_pending gauge")),
        "{families:?}"
    );
}

/// Durability at the response (`tfa_host::walsync`): a response that
/// follows store writes leaves only after a sync of the write-ahead log
/// that began after them, so the sync counter has moved by the time the
/// client reads it; a read-only request with nothing pending waits for
/// nothing. (Without the wait the background sync, every 100 ms, would
/// rarely have run within the few milliseconds between the writes and the
/// scrape.)
#[test]
fn responses_wait_for_their_writes_to_be_durable() {
    let wasm = real_component();
    let (host, mport) =
        Host::start_with_metrics("metrics-durable", &wasm, &[("RATE_LIMIT_ENABLED", "false")]);
    // Let the start's own writes settle.
    std::thread::sleep(Duration::from_millis(300));
    let counts = || {
        let t = scrape(mport);
        (
            value(&t, "tfa_store_syncs_total", &[]),
            value(&t, "tfa_store_durable_wait_seconds_count", &[]),
        )
    };
    for i in 0..3 {
        let (syncs, waits) = counts();
        let (status, _, body) = support::request_with_body(
            host.port,
            "POST",
            "/api/auth/register",
            "Content-Type: application/json\r\n",
            &format!(
                r#"{{"email":"dur{i}@example.com","username":"dur{i}","password":"Correct-Horse-9"}}"#
            ),
        );
        assert_eq!(status, 201, "{body}");
        let (syncs_after, waits_after) = counts();
        assert!(
            syncs_after > syncs,
            "registration {i}: no sync before its answer"
        );
        assert!(
            waits_after > waits,
            "registration {i}: its answer did not wait"
        );
    }
    // A read with no write pending anywhere does not wait.
    std::thread::sleep(Duration::from_millis(300));
    let (_, waits) = counts();
    assert_eq!(support::request(host.port, "GET", "/api/health", "").0, 200);
    assert_eq!(counts().1, waits);
}
