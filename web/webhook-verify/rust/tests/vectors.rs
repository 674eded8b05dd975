//! The committed `test/vectors.json` (used by the JS tests) is exactly what
//! core computes today, so the JS tests cannot drift from the service.

#[path = "support/vectors.rs"]
mod vectors;

use tfa_core::signature::{from_hex, sign_payload, verify_signature};

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../test/vectors.json");
    std::fs::read_to_string(path).expect("test/vectors.json is committed")
}

#[test]
fn committed_vectors_are_current() {
    assert!(
        committed() == vectors::vectors_json(),
        "web/webhook-verify/test/vectors.json differs from what core computes; regenerate with \
         cargo run -q -p webhook-verify-wasm --example gen_vectors > web/webhook-verify/test/vectors.json"
    );
}

#[test]
fn committed_vectors_agree_with_core() {
    let doc: serde_json::Value = serde_json::from_str(&committed()).expect("valid JSON");
    let list = doc["vectors"].as_array().expect("vectors array");
    assert!(list.len() >= 30, "only {} vectors", list.len());
    for v in list {
        let note = v["note"].as_str().expect("note");
        let secret = v["secret"].as_str().expect("secret");
        let body = from_hex(v["bodyHex"].as_str().expect("bodyHex")).expect("hex body");
        if let Some(text) = v.get("body") {
            assert_eq!(text.as_str().expect("body").as_bytes(), body, "{note}");
        } else {
            assert!(
                std::str::from_utf8(&body).is_err(),
                "{note}: text form missing"
            );
        }
        let sig = v["signature"].as_str().expect("signature");
        assert_eq!(sign_payload(secret.as_bytes(), &body), sig, "{note}");
        assert!(verify_signature(secret.as_bytes(), &body, sig), "{note}");
    }
}
