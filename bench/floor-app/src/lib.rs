//! The host-only floor: a Spin HTTP component that answers every request
//! with a fixed 200 JSON body and touches nothing else (no store, no
//! variables). Served by the same `tfa-host` as the real component, its
//! latency is what the host, wasmtime and the component model cost on their
//! own; `scripts/bench.sh` reports our API as a ratio over it.
//!
//! With the feature `test-routes` (tests only, never in the product or the
//! benchmark build): a path ending in `/hang` never returns (the guest
//! loops, so the host's deadline `REQUEST_TIMEOUT_MS` has something to
//! stop, `host/tests/limits.rs`); a path ending in `/request-id` answers
//! the `x-request-id` header the host passed in (`host/tests/logs.rs`).

#[cfg(target_arch = "wasm32")]
mod component {
    use spin_sdk::http::{Request, Response};
    use spin_sdk::http_component;

    #[http_component]
    fn handle(_req: Request) -> Response {
        #[cfg(feature = "test-routes")]
        {
            if _req.path().ends_with("/hang") {
                loop {
                    std::hint::black_box(());
                }
            }
            if _req.path().ends_with("/request-id") {
                let id = _req
                    .header("x-request-id")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                return Response::builder().status(200).body(id).build();
            }
        }
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(r#"{"success":true,"data":{"status":"ok"}}"#)
            .build()
    }
}
