//! The host-only floor: a Spin HTTP component that answers every request
//! with a fixed 200 JSON body and touches nothing else (no store, no
//! variables). Served by the same `tfa-host` as the real component, its
//! latency is what the host, wasmtime and the component model cost on their
//! own; `scripts/bench.sh` reports our API as a ratio over it.
//!
//! With the feature `test-routes` (tests only, never in the product or the
//! benchmark build), paths ending in:
//! - `/hang` never return (the guest loops, so the host's deadline
//!   `REQUEST_TIMEOUT_MS` has something to stop, `host/tests/limits.rs`);
//! - `/request-id` answer the `x-request-id` header the host passed in
//!   (`host/tests/logs.rs`);
//! - `/heavy?ms=N` fill 24 MiB of memory, as an Argon2 hash does, keep
//!   computing for N ms, then answer (the host's gate of memory-heavy
//!   instances, `host/tests/limits.rs`);
//! - `/heavy-linger` fill 24 MiB, answer, then loop after the answer until
//!   the deadline stops them.

#[cfg(all(target_arch = "wasm32", not(feature = "test-routes")))]
mod component {
    use spin_sdk::http::{Request, Response};
    use spin_sdk::http_component;

    #[http_component]
    fn handle(_req: Request) -> Response {
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(r#"{"success":true,"data":{"status":"ok"}}"#)
            .build()
    }
}

#[cfg(all(target_arch = "wasm32", feature = "test-routes"))]
mod component {
    use spin_sdk::http::{
        Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
    };
    use spin_sdk::http_component;

    /// What `/heavy` fills: more than the host's 4 MiB threshold.
    const HEAVY: usize = 24 << 20;

    #[http_component]
    async fn handle(req: IncomingRequest, out: ResponseOutparam) {
        let path_query = req.path_with_query().unwrap_or_default();
        let (path, query) = path_query.split_once('?').unwrap_or((&path_query, ""));
        if path.ends_with("/hang") {
            loop {
                std::hint::black_box(());
            }
        }
        if path.ends_with("/request-id") {
            let id = req
                .headers()
                .get("x-request-id")
                .into_iter()
                .next()
                .unwrap_or_default();
            answer(out, 200, &id);
            return;
        }
        if path.ends_with("/heavy") {
            let ms: u64 = query
                .strip_prefix("ms=")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let memory = std::hint::black_box(vec![1u8; HEAVY]);
            #[allow(clippy::disallowed_methods)] // a test guest, not core
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(ms) {
                std::hint::black_box(&memory);
            }
            answer(out, 200, b"heavy");
            return;
        }
        if path.ends_with("/heavy-linger") {
            let memory = std::hint::black_box(vec![1u8; HEAVY]);
            answer(out, 200, b"lingering");
            loop {
                std::hint::black_box(&memory);
            }
        }
        answer(out, 200, br#"{"success":true,"data":{"status":"ok"}}"#);
    }

    fn answer(out: ResponseOutparam, status: u16, body: &[u8]) {
        let len = body.len().to_string();
        let headers = Fields::from_list(&[("content-length".to_string(), len.into_bytes())])
            .unwrap_or_else(|_| Fields::new());
        let response = OutgoingResponse::new(headers);
        let _ = response.set_status_code(status);
        let sink = response.body();
        out.set(response);
        let Ok(sink) = sink else { return };
        if let Ok(stream) = sink.write() {
            let _ = stream.blocking_write_and_flush(body);
        }
        let _ = OutgoingBody::finish(sink, None);
    }
}
