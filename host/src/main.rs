//! `tfa-host`: serves the two-factor-auth Spin component on 127.0.0.1.
//! See the library documentation for settings.

/// mimalloc instead of glibc's allocator: the host's own allocations
/// (hyper's buffers, wasmtime's per-request structures, the store's
/// values) were about a tenth of its CPU under load with glibc's
/// (docs/decisions.md, "The host allocates with mimalloc").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let env = |name: &str| std::env::var(name).ok();
    if let Err(e) = tfa_host::run(&env).await {
        eprintln!("tfa-host: {e:#}");
        std::process::exit(1);
    }
}
