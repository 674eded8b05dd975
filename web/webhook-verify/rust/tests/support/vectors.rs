//! Known webhook signatures computed by `tfa_core::signature::sign_payload`,
//! as the JSON committed at `web/webhook-verify/test/vectors.json`.
//!
//! Shared by `examples/gen_vectors.rs` (which prints the file) and
//! `tests/vectors.rs` (which checks the committed file still equals it and
//! agrees with core). Deterministic: a fixed list plus inputs from a seeded
//! SplitMix64, no clock, no OS randomness.

use tfa_core::signature::{sign_payload, to_hex};

/// One `(secret, body)` pair; the secret is a string because the JS API
/// takes it as one (its UTF-8 bytes are the key).
struct Case {
    note: String,
    secret: String,
    body: Vec<u8>,
}

/// SplitMix64: small, seedable, good enough to pick test inputs.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// A secret as the service issues them: 64 lower-case hex characters.
    fn service_secret(&mut self) -> String {
        to_hex(&self.bytes(32))
    }
}

fn cases() -> Vec<Case> {
    let mut rng = SplitMix64(0x7fa_5eed_0006);
    let mut out = Vec::new();
    let mut add = |note: &str, secret: String, body: Vec<u8>| {
        out.push(Case {
            note: note.to_string(),
            secret,
            body,
        })
    };

    let secret = rng.service_secret();
    add(
        "a delivery as the service sends it",
        secret.clone(),
        br#"{"id":"3f0c5a7e-2b1d-4c8e-9f00-1a2b3c4d5e6f","event":"user.login","timestamp":"2025-01-01T00:00:00.000Z","data":{"userId":"u_1","ipAddress":"203.0.113.7"}}"#.to_vec(),
    );
    add(
        "webhook.test delivery",
        secret,
        br#"{"id":"t1","event":"webhook.test","timestamp":"2025-01-01T00:00:00.000Z","data":{"message":"This is a test webhook"}}"#.to_vec(),
    );
    add("empty secret, empty body", String::new(), Vec::new());
    add("empty body", rng.service_secret(), Vec::new());
    add("empty secret", String::new(), b"body".to_vec());
    add(
        "non-ASCII body",
        "whsec_test".to_string(),
        "h\u{e9}llo \u{2713} \u{1d11e} \u{65e5}\u{672c}"
            .as_bytes()
            .to_vec(),
    );
    add(
        "non-ASCII secret",
        "cl\u{e9}-secr\u{e8}te-\u{1f511}".to_string(),
        b"{\"ok\":true}".to_vec(),
    );
    add(
        "secret longer than the SHA-256 block (hashed first)",
        "k".repeat(100),
        b"long key".to_vec(),
    );
    add(
        "body with NUL and control characters",
        "s".to_string(),
        b"a\0b\r\n\t\x1b\x7f".to_vec(),
    );
    add(
        "every byte value, not UTF-8",
        rng.service_secret(),
        (0..=255u8).collect(),
    );
    add(
        "invalid UTF-8 only",
        "s".to_string(),
        vec![0xff, 0xfe, 0xc0, 0x80, 0xed, 0xa0, 0x80],
    );
    for len in [55usize, 56, 63, 64, 65, 119, 120, 127, 128, 129] {
        add(
            &format!("{len}-byte body (block edges)"),
            rng.service_secret(),
            vec![b'x'; len],
        );
    }
    for len in [63usize, 64, 65] {
        add(
            &format!("{len}-byte secret (block edges)"),
            "a".repeat(len),
            b"edge".to_vec(),
        );
    }
    add(
        "8 KiB body",
        rng.service_secret(),
        (0..8192u32).map(|i| (i % 251) as u8).collect(),
    );
    for i in 0..16 {
        let secret = rng.service_secret();
        let len = rng.below(1000) as usize;
        let body = rng.bytes(len);
        add(&format!("random {i}"), secret, body);
    }
    out
}

/// `s` as a JSON string literal: quotes, backslashes and control
/// characters escaped, everything else as UTF-8.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The whole vectors file. Each vector has `note`, `secret` (the key's
/// text), `bodyHex` (the body bytes), `body` (the same bytes as text, only
/// when they are UTF-8) and `signature` (`sign_payload`'s output).
pub fn vectors_json() -> String {
    let mut out = String::from("{\n");
    out.push_str(
        "  \"about\": \"Webhook signatures computed by tfa_core::signature::sign_payload. \
         Generated by: cargo run -q -p webhook-verify-wasm --example gen_vectors; \
         checked against core by cargo test -p webhook-verify-wasm.\",\n",
    );
    out.push_str("  \"vectors\": [\n");
    let cases = cases();
    for (i, case) in cases.iter().enumerate() {
        let sig = sign_payload(case.secret.as_bytes(), &case.body);
        out.push_str("    {");
        out.push_str(&format!("\"note\": {}, ", json_string(&case.note)));
        out.push_str(&format!("\"secret\": {}, ", json_string(&case.secret)));
        if let Ok(text) = std::str::from_utf8(&case.body) {
            out.push_str(&format!("\"body\": {}, ", json_string(text)));
        }
        out.push_str(&format!("\"bodyHex\": \"{}\", ", to_hex(&case.body)));
        out.push_str(&format!("\"signature\": \"{sig}\"}}"));
        out.push_str(if i + 1 < cases.len() { ",\n" } else { "\n" });
    }
    out.push_str("  ]\n}\n");
    out
}
