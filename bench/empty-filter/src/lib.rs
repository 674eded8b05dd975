//! An Envoy HTTP filter (proxy-wasm ABI, `wasm32-wasip1`) that lets every
//! request through untouched: the floor of the edge-filter benchmark in
//! `scripts/bench.sh`. Whatever it costs per request is what Envoy's V8
//! runtime charges any wasm filter (a context per stream, the calls into
//! the VM), before the filter does any work of its own.

#![forbid(unsafe_code)]

#[cfg(target_arch = "wasm32")]
mod filter {
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType, LogLevel};

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Warn);
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
    }}

    struct Root;
    impl Context for Root {}
    impl RootContext for Root {
        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
        fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Pass))
        }
    }

    struct Pass;
    impl Context for Pass {}
    impl HttpContext for Pass {
        fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
            Action::Continue
        }
    }
}
