//! The steps most end-to-end flows start with, over real HTTP.

use serde_json::{json, Value};
use tfa_core::crypto::totp;
use tfa_core::plumbing::ratelimit;

use crate::client::{Client, Resp};

/// A password that meets the rules.
pub const PASSWORD: &str = "Str0ng!Passw0rd";

/// A registered user.
#[derive(Debug, Clone)]
pub struct User {
    /// Id.
    pub id: String,
    /// E-mail.
    pub email: String,
    /// Access token.
    pub access: String,
    /// Refresh token.
    pub refresh: String,
}

/// Current Unix time (the host's clock is the machine's).
#[allow(clippy::disallowed_methods)] // the test computes TOTP codes as an authenticator app would
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Waits, when less than `needed_secs` is left of `rule`'s current window,
/// until the next window has opened, so that a test counting a window's
/// allowance sees a single window throughout. The service's windows are
/// fixed and aligned to the clock ([`ratelimit::hit`]): a test that
/// straddles a boundary would see the allowance reset halfway. Sleeps at
/// most `needed_secs + 1`.
pub fn within_one_rate_window(rule: ratelimit::Rule, needed_secs: u64) {
    let left = rule.window_secs - now_secs() % rule.window_secs;
    if left < needed_secs {
        std::thread::sleep(std::time::Duration::from_secs(left + 1));
    }
}

/// The TOTP code of `secret` at `unix_secs` (what an authenticator shows).
pub fn totp_code(secret_b32: &str, unix_secs: u64) -> String {
    let raw = totp::base32_decode(secret_b32).expect("base32 secret");
    totp::code_at_step(&raw, unix_secs / 30, totp::TotpAlgorithm::Sha1, 6)
}

/// Registers `name` from a client address of its own (`X-Forwarded-For` is
/// not trusted by default, so the address is the loopback peer: tests that
/// register many users raise the limits instead).
pub fn register(c: &Client, name: &str) -> User {
    let email = format!("{name}@example.com");
    let r = c.post(
        "/api/auth/register",
        &json!({ "email": email, "username": name, "password": PASSWORD }),
        None,
    );
    assert_eq!(
        r.status,
        201,
        "register {name}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let d = r.data();
    User {
        id: d["user"]["id"].as_str().unwrap().to_string(),
        email,
        access: d["accessToken"].as_str().unwrap().to_string(),
        refresh: d["refreshToken"].as_str().unwrap().to_string(),
    }
}

/// Logs in with the password.
pub fn login(c: &Client, ident: &str) -> Resp {
    c.post(
        "/api/auth/login",
        &json!({ "emailOrUsername": ident, "password": PASSWORD }),
        None,
    )
}

/// Enables TOTP; returns (secret, backup codes, the step used).
pub fn enable_totp(c: &Client, u: &User) -> (String, Vec<String>, u64) {
    let d = c
        .post("/api/2fa/totp/setup", &json!({}), Some(&u.access))
        .data();
    let secret = d["secret"].as_str().unwrap().to_string();
    let backups = d["backupCodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let now = now_secs();
    let r = c.post(
        "/api/2fa/totp/verify-setup",
        &json!({ "code": totp_code(&secret, now) }),
        Some(&u.access),
    );
    assert_eq!(r.data(), json!({ "enabled": true, "method": "totp" }));
    (secret, backups, now / 30)
}

/// A TOTP code for the step after `used_step` that the service accepts now
/// (it allows one step either side), waiting only when that step is more
/// than one step ahead of the clock; returns the code and its step.
pub fn fresh_totp(secret: &str, used_step: u64) -> (String, u64) {
    let step = used_step + 1;
    loop {
        let now_step = now_secs() / 30;
        if step <= now_step + 1 {
            let step = step.max(now_step.saturating_sub(1));
            return (totp_code(secret, step * 30), step);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// The temp token of a password login of a 2FA user.
pub fn temp_token(c: &Client, u: &User) -> String {
    let d = login(c, &u.email).data();
    assert_eq!(d["requiresTwoFactor"], Value::Bool(true), "{d}");
    d["tempToken"].as_str().unwrap().to_string()
}
