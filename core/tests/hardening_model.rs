//! The login state machines as random operation sequences checked against a
//! model: log in, verify with the current / previous / next / a replayed
//! TOTP step, use backup code i, regenerate backup codes, refresh with the
//! current or a rotated-out token, log out, revoke all, let time pass. The
//! model predicts every outcome; the service must agree, and in particular:
//! a replayed TOTP step never succeeds, a used backup code never succeeds, a
//! rotated-out refresh token never succeeds and ends its session, tokens of
//! ended sessions are refused, and the remaining backup-code count matches.

mod common;

use common::*;
use proptest::prelude::*;
use serde_json::json;
use tfa_core::testing::{test_config, Harness, MemoryStore};

#[derive(Debug, Clone, Copy)]
enum Step {
    Previous,
    Current,
    Next,
    Replay,
}

#[derive(Debug, Clone)]
enum Op {
    Login,
    VerifyTotp(Step),
    UseBackup(usize),
    Regenerate(usize),
    Refresh { session: usize, old: bool },
    Logout(usize),
    RevokeAll(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Login),
        3 => prop_oneof![
            Just(Step::Previous),
            Just(Step::Current),
            Just(Step::Next),
            Just(Step::Replay)
        ]
        .prop_map(Op::VerifyTotp),
        3 => (0usize..10).prop_map(Op::UseBackup),
        1 => any::<usize>().prop_map(Op::Regenerate),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(session, old)| Op::Refresh { session, old }),
        1 => any::<usize>().prop_map(Op::Logout),
        1 => any::<usize>().prop_map(Op::RevokeAll),
        3 => prop::sample::select(vec![1u64, 29, 30, 61, 299, 301, 899, 901, 3600, 259_200, 604_800])
            .prop_map(Op::Advance),
    ]
}

struct Session {
    access: String,
    access_exp: u64,
    refresh: String,
    old_refresh: Vec<String>,
    exp_ms: u64,
    alive: bool,
}

struct Temp {
    token: String,
    exp: u64,
    attempts: u32,
    used: bool,
}

struct Model {
    secret: String,
    codes: Vec<String>,
    used: Vec<bool>,
    last_step: u64,
    sessions: Vec<Session>,
    temp: Option<Temp>,
    failures: u32,
    lock_until_ms: u64,
}

const WEEK_MS: u64 = 7 * 24 * 3600 * 1000;

impl Model {
    fn live(&self, now_ms: u64) -> Vec<usize> {
        (0..self.sessions.len())
            .filter(|i| self.sessions[*i].alive && self.sessions[*i].exp_ms > now_ms)
            .collect()
    }
    /// A session whose access token works now.
    fn usable(&self, now_ms: u64, pick: usize) -> Option<usize> {
        let ok: Vec<usize> = self
            .live(now_ms)
            .into_iter()
            .filter(|i| now_ms / 1000 < self.sessions[*i].access_exp)
            .collect();
        (!ok.is_empty()).then(|| ok[pick % ok.len()])
    }
    fn new_session(&mut self, h: &Harness, d: &serde_json::Value) {
        self.sessions.push(Session {
            access: d["accessToken"].as_str().unwrap().to_string(),
            access_exp: h.now_ms / 1000 + 900,
            refresh: d["refreshToken"].as_str().unwrap().to_string(),
            old_refresh: vec![],
            exp_ms: h.now_ms + WEEK_MS,
            alive: true,
        });
    }
    fn fail(&mut self, now_ms: u64) {
        self.failures += 1;
        if self.failures >= 20 {
            self.failures = 0;
            self.lock_until_ms = now_ms + 15 * 60 * 1000;
        }
    }
}

/// What a second-factor attempt with the current temp token leads to
/// before the code is looked at.
enum Gate {
    BadTemp,
    Locked,
    Open,
}

fn gate(m: &mut Model, now_ms: u64) -> Gate {
    let now = now_ms / 1000;
    match &mut m.temp {
        Some(t) if now < t.exp && !t.used && t.attempts < 5 => {
            if now_ms < m.lock_until_ms {
                return Gate::Locked;
            }
            t.attempts += 1;
            Gate::Open
        }
        _ => Gate::BadTemp,
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::with(
        test_config(&[("RATE_LIMIT_ENABLED", "false")]),
        MemoryStore::new(),
    );
    let u = register(&mut h, "alice");
    let (secret, codes) = enable_totp(&mut h, &u);
    let mut m = Model {
        secret,
        used: vec![false; codes.len()],
        codes,
        last_step: (h.now_ms / 1000 - 30) / 30,
        sessions: vec![Session {
            access: u.access.clone(),
            access_exp: (h.now_ms / 1000 - 30) + 900,
            refresh: u.refresh.clone(),
            old_refresh: vec![],
            exp_ms: h.now_ms - 30_000 + WEEK_MS,
            alive: true,
        }],
        temp: None,
        failures: 0,
        lock_until_ms: 0,
    };
    for (n, op) in ops.iter().enumerate() {
        let now_ms = h.now_ms;
        let what = format!("op {n} {op:?}");
        match op {
            Op::Login => {
                let d = data(&login(&mut h, "alice", "192.0.2.1"));
                prop_assert_eq!(&d["requiresTwoFactor"], &json!(true));
                m.temp = Some(Temp {
                    token: d["tempToken"].as_str().unwrap().to_string(),
                    exp: now_ms / 1000 + 300,
                    attempts: 0,
                    used: false,
                });
            }
            Op::VerifyTotp(which) => {
                let now_step = now_ms / 1000 / 30;
                let step = match which {
                    Step::Previous => now_step - 1,
                    Step::Current => now_step,
                    Step::Next => now_step + 1,
                    Step::Replay => m.last_step,
                };
                let token = m.temp.as_ref().map(|t| t.token.clone()).unwrap_or_default();
                let code = totp_code(&m.secret, step * 30);
                let resp = h.call(post(
                    "/2fa/verify",
                    json!({ "tempToken": token, "code": code }),
                ));
                match gate(&mut m, now_ms) {
                    Gate::BadTemp => prop_assert_eq!(resp.status, 400, "{}: {}", what, resp.json()),
                    Gate::Locked => prop_assert_eq!(resp.status, 429, "{}", what),
                    Gate::Open if step > m.last_step => {
                        prop_assert_eq!(resp.status, 200, "{}: {}", what, resp.json());
                        m.last_step = step;
                        m.failures = 0;
                        if let Some(t) = &mut m.temp {
                            t.used = true;
                        }
                        m.new_session(&h, &data(&resp));
                    }
                    Gate::Open => {
                        // A step at or before the last accepted one: replay.
                        assert_error(&resp, 400, "Invalid verification code");
                        m.fail(now_ms);
                    }
                }
            }
            Op::UseBackup(i) => {
                let token = m.temp.as_ref().map(|t| t.token.clone()).unwrap_or_default();
                let resp = h.call(post(
                    "/2fa/verify-backup-code",
                    json!({ "tempToken": token, "backupCode": m.codes[*i] }),
                ));
                match gate(&mut m, now_ms) {
                    Gate::BadTemp => prop_assert_eq!(resp.status, 400, "{}: {}", what, resp.json()),
                    Gate::Locked => prop_assert_eq!(resp.status, 429, "{}", what),
                    Gate::Open if m.used[*i] => {
                        assert_error(&resp, 400, "This backup code has already been used");
                        m.fail(now_ms);
                    }
                    Gate::Open => {
                        prop_assert_eq!(resp.status, 200, "{}: {}", what, resp.json());
                        m.used[*i] = true;
                        m.failures = 0;
                        if let Some(t) = &mut m.temp {
                            t.used = true;
                        }
                        let d = data(&resp);
                        let left = m.used.iter().filter(|u| !**u).count();
                        prop_assert_eq!(&d["remainingCodes"], &json!(left));
                        m.new_session(&h, &d);
                    }
                }
            }
            Op::Regenerate(pick) => {
                let Some(s) = m.usable(now_ms, *pick) else {
                    continue;
                };
                let resp = h.call(bearer(
                    post("/2fa/backup-codes/generate", json!({})),
                    &m.sessions[s].access,
                ));
                let d = data(&resp);
                m.codes = d["backupCodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.as_str().unwrap().to_string())
                    .collect();
                m.used = vec![false; m.codes.len()];
            }
            Op::Refresh { session, old } => {
                let i = session % m.sessions.len();
                let token = if *old {
                    match m.sessions[i].old_refresh.last() {
                        Some(t) => t.clone(),
                        None => continue,
                    }
                } else {
                    m.sessions[i].refresh.clone()
                };
                let resp = h.call(post("/auth/refresh", json!({ "refreshToken": token })));
                let s = &mut m.sessions[i];
                let live = s.alive && s.exp_ms > now_ms;
                if live && !*old {
                    prop_assert_eq!(resp.status, 200, "{}: {}", what, resp.json());
                    let d = data(&resp);
                    s.old_refresh.push(std::mem::replace(
                        &mut s.refresh,
                        d["refreshToken"].as_str().unwrap().to_string(),
                    ));
                    s.access = d["accessToken"].as_str().unwrap().to_string();
                    s.access_exp = now_ms / 1000 + 900;
                    s.exp_ms = now_ms + WEEK_MS;
                } else {
                    // Rotated out (reuse: the session ends) or ended already.
                    assert_error(&resp, 401, "Invalid refresh token");
                    s.alive = false;
                }
            }
            Op::Logout(pick) => {
                let Some(s) = m.usable(now_ms, *pick) else {
                    continue;
                };
                let resp = h.call(bearer(
                    post("/auth/logout", json!({})),
                    &m.sessions[s].access,
                ));
                prop_assert_eq!(resp.status, 200, "{}", what);
                m.sessions[s].alive = false;
            }
            Op::RevokeAll(pick) => {
                let Some(s) = m.usable(now_ms, *pick) else {
                    continue;
                };
                let live = m.live(now_ms).len();
                let resp = h.call(bearer(
                    post("/auth/revoke-sessions", json!({})),
                    &m.sessions[s].access,
                ));
                prop_assert_eq!(&data(&resp)["revokedCount"], &json!(live), "{}", what);
                for s in &mut m.sessions {
                    s.alive = false;
                }
            }
            Op::Advance(secs) => h.advance_secs(*secs),
        }

        // After every operation: exactly the model's sessions are usable,
        // and the remaining count is the model's.
        let now_ms = h.now_ms;
        for (i, s) in m.sessions.iter().enumerate() {
            let usable = s.alive && s.exp_ms > now_ms && now_ms / 1000 < s.access_exp;
            let status = h.call(bearer(get("/auth/me"), &s.access)).status;
            prop_assert_eq!(
                status,
                if usable { 200 } else { 401 },
                "{}: session {}",
                what,
                i
            );
        }
        if let Some(s) = m.usable(now_ms, 0) {
            let d = data(&h.call(bearer(
                get("/2fa/backup-codes/count"),
                &m.sessions[s].access,
            )));
            let left = m.used.iter().filter(|u| !**u).count();
            prop_assert_eq!(
                d,
                json!({ "remaining": left, "total": m.codes.len() }),
                "{}",
                what
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    })]

    #[test]
    fn login_state_machines_follow_the_model(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops)?;
    }
}
