//! The host-only floor: a Spin HTTP component that answers every request
//! with a fixed 200 JSON body and touches nothing else (no store, no
//! variables). Served by the same `tfa-host` as the real component, its
//! latency is what the host, wasmtime and the component model cost on their
//! own; `scripts/bench.sh` reports our API as a ratio over it.

#[cfg(target_arch = "wasm32")]
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
