//! Fixed-window rate limits on atomic counters.
//!
//! A window is `rl:{rule}:{subject}:{window start}`; each request increments
//! it once and is refused when the new value exceeds the limit, so concurrent
//! requests can never exceed it. The counter is scheduled for removal when its
//! window ends. A failed delivery gives its slot back with a decrement.

use crate::contract::error::{ApiError, RateInfo};
use crate::contract::ports::Env;
use crate::plumbing::housekeeping::Expiry;
use crate::plumbing::util::{self, Decimal};

/// A rate-limit rule of the specification's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Name used in the counter key.
    pub name: &'static str,
    /// Requests allowed per window.
    pub limit: u32,
    /// Window length in seconds.
    pub window_secs: u64,
}

const M15: u64 = 15 * 60;
const H1: u64 = 60 * 60;

/// `/auth/register`: 5 per 15 minutes per IP.
pub const REGISTER: Rule = Rule {
    name: "register",
    limit: 5,
    window_secs: M15,
};
/// `/auth/login`: 5 per 15 minutes per IP.
pub const LOGIN: Rule = Rule {
    name: "login",
    limit: 5,
    window_secs: M15,
};
/// `/auth/refresh`: 10 per 15 minutes per user (IP without a valid token).
pub const REFRESH: Rule = Rule {
    name: "refresh",
    limit: 10,
    window_secs: M15,
};
/// `/2fa/verify`: 10 per 15 minutes per IP.
pub const VERIFY: Rule = Rule {
    name: "verify",
    limit: 10,
    window_secs: M15,
};
/// `/2fa/verify-backup-code`: 5 per 15 minutes per IP.
pub const VERIFY_BACKUP: Rule = Rule {
    name: "verify-backup",
    limit: 5,
    window_secs: M15,
};
/// Sending SMS codes: 5 per hour per user.
pub const SEND_SMS: Rule = Rule {
    name: "send-sms",
    limit: 5,
    window_secs: H1,
};
/// Sending e-mail codes: 10 per hour per user.
pub const SEND_EMAIL: Rule = Rule {
    name: "send-email",
    limit: 10,
    window_secs: H1,
};
/// Passkey ceremonies without a session (`/2fa/webauthn/options`,
/// `/2fa/verify-webauthn`, `/auth/passkey/options`, `/auth/passkey/verify`):
/// 20 per 15 minutes per IP, i.e. 10 option + verification pairs.
pub const PASSKEY: Rule = Rule {
    name: "passkey",
    limit: 20,
    window_secs: M15,
};
/// `/2fa/*/setup`: 10 per 15 minutes per user.
pub const SETUP: Rule = Rule {
    name: "setup",
    limit: 10,
    window_secs: M15,
};
/// `/2fa/*/verify-setup`: 10 per 15 minutes per user.
pub const VERIFY_SETUP: Rule = Rule {
    name: "verify-setup",
    limit: 10,
    window_secs: M15,
};
/// Other 2FA endpoints: 100 per 15 minutes per user.
pub const OTHER_2FA: Rule = Rule {
    name: "2fa",
    limit: 100,
    window_secs: M15,
};
/// `/auth/introspect`: 1000 per minute per API key (gateways call it often).
pub const INTROSPECT: Rule = Rule {
    name: "introspect",
    limit: 1000,
    window_secs: 60,
};
/// Every other endpoint: 100 per 15 minutes per IP.
pub const DEFAULT: Rule = Rule {
    name: "default",
    limit: 100,
    window_secs: M15,
};

/// One counted request: what to report in headers, and how to give the slot
/// back.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Header figures.
    pub info: RateInfo,
    key: String,
}

/// The key of `subject`'s counter in `rule`'s window that began at `start`
/// (Unix seconds), `rl:{rule}:{subject}:{start}`.
fn window_key(rule: Rule, subject: &str, start: u64) -> String {
    util::key(&[
        "rl:",
        rule.name,
        ":",
        subject,
        ":",
        Decimal::of(start).as_str(),
    ])
}

/// Counts one request of `subject` under `rule`. Returns the slot (for the
/// headers) or `RateLimited` when the window is full, and, when this request
/// opened the window, the window's counter for the caller to have swept
/// once the window is over ([`crate::plumbing::context::Ctx::expire`]).
pub fn hit(env: &mut Env, rule: Rule, subject: &str) -> (Result<Slot, ApiError>, Option<Expiry>) {
    let now = env.now_secs();
    let start = now - now % rule.window_secs;
    let Some(reset) = start.checked_add(rule.window_secs) else {
        return (Err(ApiError::Internal), None);
    };
    let key = window_key(rule, subject, start);
    let count = match env.store.increment(&key, 1) {
        Ok(count) => count,
        Err(e) => return (Err(e.into()), None),
    };
    let expiry = (count == 1).then(|| Expiry::counter(&key, reset.saturating_mul(1000)));
    (judge(rule, count, now, reset, key), expiry)
}

/// The slot of the `count`th request of a window ending at `reset`, or
/// `RateLimited` past the rule's limit.
fn judge(rule: Rule, count: i64, now: u64, reset: u64, key: String) -> Result<Slot, ApiError> {
    let used = u32::try_from(count.max(0)).unwrap_or(u32::MAX);
    let info = RateInfo {
        limit: rule.limit,
        remaining: rule.limit.saturating_sub(used),
        reset_secs: reset,
        retry_after_secs: reset.saturating_sub(now),
    };
    if used > rule.limit {
        return Err(ApiError::RateLimited(info));
    }
    Ok(Slot { info, key })
}

/// Gives a slot back (after a delivery failed), so a failure does not cost
/// the user their allowance twice.
pub fn refund(env: &mut Env, slot: &Slot) -> Result<(), ApiError> {
    env.store.increment(&slot.key, -1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters' keys are stored data: spelled as `format!` spelled them.
    #[test]
    fn window_keys_keep_their_spelling() {
        assert_eq!(
            window_key(LOGIN, "ip:127.0.0.1", 0),
            "rl:login:ip:127.0.0.1:0"
        );
        assert_eq!(
            window_key(LOGIN, "u", 1_764_892_800),
            format!("rl:{}:{}:{}", LOGIN.name, "u", 1_764_892_800u64)
        );
    }
}
