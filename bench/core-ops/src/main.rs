//! Times tfa-core's hot operations and prints one JSON object.
//!
//! The same source builds natively and for `wasm32-wasip2` (with
//! `-C target-feature=+simd128`); `tfa-bench wasm-core` runs the wasm build
//! under wasmtime, so the two sets of figures compare the same code.
//!
//! Every input is fixed (core takes time and random bytes as parameters, so
//! no clock or random source is needed for the operations themselves); only
//! the timing reads the monotonic clock. Each operation is first calibrated
//! to a batch of iterations lasting at least `--batch-ms`, then timed for
//! `--runs` batches; the figure is the median time per iteration.
//!
//! Usage: `core-ops [--runs N] [--batch-ms M] [--only NAME]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use tfa_core::crypto::{codes, password, totp};
use tfa_core::signature;
use tfa_core::tokens::{Extra, TokenKeys, TokenKind};

/// A fixed "now" for token and TOTP checks (core takes the time as a parameter).
const NOW: u64 = 1_750_000_000;
const PASSWORD: &str = "Str0ng!Passw0rd";

#[allow(clippy::disallowed_methods)] // the benchmark reads the clock to time core; core itself never does
fn now() -> Instant {
    Instant::now()
}

struct Options {
    runs: usize,
    batch: Duration,
    only: Option<String>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        runs: 11,
        batch: Duration::from_millis(50),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--runs" => o.runs = value()?.parse().map_err(|_| "--runs: a number")?,
            "--batch-ms" => {
                o.batch =
                    Duration::from_millis(value()?.parse().map_err(|_| "--batch-ms: a number")?)
            }
            "--only" => o.only = Some(value()?),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    Ok(o)
}

/// Median, minimum and maximum nanoseconds per iteration of `f`.
struct Timing {
    iters: u64,
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
}

fn time(o: &Options, mut f: impl FnMut()) -> Timing {
    // Warm-up, then double the batch until it lasts long enough.
    f();
    let mut iters: u64 = 1;
    loop {
        let start = now();
        for _ in 0..iters {
            f();
        }
        if start.elapsed() >= o.batch || iters >= 1 << 24 {
            break;
        }
        iters *= 2;
    }
    let mut per_iter: Vec<f64> = (0..o.runs)
        .map(|_| {
            let start = now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    per_iter.sort_by(f64::total_cmp);
    let n = per_iter.len();
    let median_ns = if n % 2 == 1 {
        per_iter[n / 2]
    } else {
        (per_iter[n / 2 - 1] + per_iter[n / 2]) / 2.0
    };
    Timing {
        iters,
        median_ns,
        min_ns: per_iter[0],
        max_ns: per_iter[n - 1],
    }
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("core-ops: {e}");
            std::process::exit(2);
        }
    };

    // Inputs, all fixed.
    let params = password::Argon2Params::default();
    let salt = *b"bench-salt-16byt";
    let phc = password::hash_password(PASSWORD, &salt, &params).expect("argon2 hash");
    assert!(password::verify_password(PASSWORD, &phc));

    let totp_secret: Vec<u8> = (0u8..20).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let good_code = totp::code_at_step(
        &totp_secret,
        totp::step_of(NOW),
        totp::TotpAlgorithm::Sha1,
        totp::DIGITS,
    );
    // A code that matches none of the three candidate steps.
    let bad_code = (0..1_000_000u32)
        .map(|n| format!("{n:06}"))
        .find(|c| totp::verify_code(&totp_secret, c, NOW, None).is_none())
        .expect("some code misses");
    assert!(totp::verify_code(&totp_secret, &good_code, NOW, None).is_some());

    let keys = TokenKeys::new(
        b"bench-access-secret-bench-access-secret-01",
        b"bench-refresh-secret-bench-refresh-secret-02",
        b"bench-temp-secret-bench-temp-secret-bench-03",
        b"bench-device-secret-bench-device-secret-be-04",
        "two-factor-auth",
        "two-factor-auth-api",
    );
    let extra = || Extra {
        sid: Some("s_0123456789abcdef0123456789abcdef".into()),
        jti: None,
        did: None,
        mfa: Some(true),
        amr: None,
    };
    let token = keys.issue(
        TokenKind::Access,
        "u_0123456789abcdef0123456789abcdef",
        extra(),
        NOW,
    );
    assert!(keys.verify(TokenKind::Access, &token, NOW + 1).is_ok());

    // Backup codes: the stored set is ten keyed hashes; a check normalises
    // the input, hashes it and compares it with every slot (what
    // `tfa_core::api::backup::check` does, without the store).
    let backup_key = codes::derive_key(b"bench-server-secret-bench-server-secret", "backup");
    let user_id = "u_0123456789abcdef0123456789abcdef";
    let plain: Vec<String> = (0..10).map(|i| format!("ABCDE{:05}", i * 7919)).collect();
    let stored: Vec<String> = plain
        .iter()
        .map(|c| codes::keyed_hash(&backup_key, user_id, c))
        .collect();
    let typed = format!("{}-{}", &plain[7][..5], &plain[7][5..]).to_lowercase();
    let backup_check = |input: &str| -> bool {
        let Some(code) = codes::normalize_backup_code(input) else {
            return false;
        };
        let hash = codes::keyed_hash(&backup_key, user_id, &code);
        let mut found = false;
        for s in &stored {
            found |= codes::ct_eq(s.as_bytes(), hash.as_bytes());
        }
        found
    };
    assert!(backup_check(&typed));

    // A webhook body of a typical size (~300 bytes of JSON).
    let webhook_secret = b"whsec_bench_0123456789abcdef0123456789abcdef";
    let body = br#"{"id":"evt_0123456789abcdef","type":"user.login","createdAt":"2025-06-15T12:00:00.000Z","data":{"userId":"u_0123456789abcdef0123456789abcdef","ip":"203.0.113.7","userAgent":"Mozilla/5.0 (X11; Linux x86_64) bench","method":"totp","success":true}}"#;
    let header = signature::sign_payload(webhook_secret, body);
    assert!(signature::verify_signature(webhook_secret, body, &header));

    type Op<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let ops: Vec<Op> = vec![
        (
            "argon2id_hash",
            Box::new(|| {
                black_box(password::hash_password(
                    black_box(PASSWORD),
                    black_box(&salt),
                    &params,
                ))
                .ok();
            }),
        ),
        (
            "argon2id_verify",
            Box::new(|| {
                assert!(black_box(password::verify_password(
                    black_box(PASSWORD),
                    black_box(&phc)
                )));
            }),
        ),
        (
            "totp_verify_hit",
            Box::new(|| {
                assert!(black_box(totp::verify_code(
                    black_box(&totp_secret),
                    black_box(&good_code),
                    NOW,
                    None
                ))
                .is_some());
            }),
        ),
        (
            "totp_verify_miss",
            Box::new(|| {
                assert!(black_box(totp::verify_code(
                    black_box(&totp_secret),
                    black_box(&bad_code),
                    NOW,
                    None
                ))
                .is_none());
            }),
        ),
        (
            "jwt_issue",
            Box::new(|| {
                black_box(keys.issue(
                    TokenKind::Access,
                    black_box("u_0123456789abcdef0123456789abcdef"),
                    extra(),
                    NOW,
                ));
            }),
        ),
        (
            "jwt_verify",
            Box::new(|| {
                assert!(
                    black_box(keys.verify(TokenKind::Access, black_box(&token), NOW + 1)).is_ok()
                );
            }),
        ),
        (
            "backup_code_check",
            Box::new(|| {
                assert!(black_box(backup_check(black_box(&typed))));
            }),
        ),
        (
            "webhook_sign",
            Box::new(|| {
                black_box(signature::sign_payload(
                    black_box(webhook_secret),
                    black_box(body),
                ));
            }),
        ),
        (
            "webhook_verify",
            Box::new(|| {
                assert!(black_box(signature::verify_signature(
                    black_box(webhook_secret),
                    black_box(body),
                    black_box(&header)
                )));
            }),
        ),
    ];

    let target = if cfg!(target_arch = "wasm32") {
        "wasm32"
    } else {
        std::env::consts::ARCH
    };
    let simd = cfg!(target_feature = "simd128");
    let mut lines = Vec::new();
    for (name, mut f) in ops {
        if o.only.as_deref().is_some_and(|only| only != name) {
            continue;
        }
        let t = time(&o, &mut f);
        eprintln!("core-ops: {name}: {:.0} ns", t.median_ns);
        lines.push(format!(
            r#"{{"name":"{name}","median_ns":{:.1},"min_ns":{:.1},"max_ns":{:.1},"iters_per_run":{},"runs":{}}}"#,
            t.median_ns, t.min_ns, t.max_ns, t.iters, o.runs
        ));
    }
    println!(
        r#"{{"target":"{target}","simd128":{simd},"argon2":{{"memory_kib":{},"iterations":{},"parallelism":{}}},"ops":[{}]}}"#,
        params.memory_kib,
        params.iterations,
        params.parallelism,
        lines.join(",")
    );
}
