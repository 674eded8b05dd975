//! `tfa-host`: serves the two-factor-auth Spin component on 127.0.0.1.
//! See the library documentation for settings.

#[tokio::main]
async fn main() {
    let env = |name: &str| std::env::var(name).ok();
    if let Err(e) = tfa_host::run(&env).await {
        eprintln!("tfa-host: {e:#}");
        std::process::exit(1);
    }
}
