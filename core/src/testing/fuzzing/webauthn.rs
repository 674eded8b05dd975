//! Fuzz target `webauthn_parse`: the WebAuthn parsers and ceremonies of
//! [`crate::crypto::webauthn`] on arbitrary and mutated input.
//!
//! The first byte picks a mode:
//! - 0: the rest as raw bytes into every parser (attestation object,
//!   authenticator data, COSE key, client data, both JSON readers);
//! - 1 / 2: the rest as a registration / authentication JSON, verified
//!   against a fixed relying party, challenge and stored credential;
//! - 3 / 4: a genuine assertion / registration (made here with a fixed
//!   ES256 key) whose fields the rest of the input mutates.
//!
//! Invariants: no panic; parsed authenticator data is consistent with its
//! flags; an accepted registration really carries our challenge and origin
//! and a key that parses; an accepted assertion is one whose signature,
//! challenge, origin, RP ID hash and UP flag an independent check (plain
//! `p256`, not the module's code) confirms.

use std::sync::OnceLock;

use p256::ecdsa::signature::{Signer, Verifier};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Bytes;
use crate::crypto::cose::parse_cose_key;
use crate::crypto::webauthn::{
    b64url_encode, parse_attestation_object, parse_authenticator_data, parse_client_data,
    verify_authentication, verify_registration, AuthenticationResponse, Expected, Flags,
    RegistrationResponse, RelyingParty, StoredCredential,
};

const RP_ID: &str = "fuzz.example";
const ORIGIN: &str = "https://fuzz.example";
const CHALLENGE: &[u8] = b"fuzz-challenge-0123456789abcdef!";
const CREDENTIAL_ID: &[u8] = b"fuzz-credential-id";
const USER: &[u8] = b"fuzz-user";

struct Fixture {
    key: p256::ecdsa::SigningKey,
    cose: Vec<u8>,
    registration: Value,
    assertion: Value,
}

fn b64(v: &[u8]) -> Value {
    json!(b64url_encode(v))
}

fn cbor_bytes(out: &mut Vec<u8>, major: u8, bytes: &[u8]) {
    // Definite lengths below 65536 are all the fixture needs.
    let len = bytes.len();
    if len < 24 {
        out.push(major | len as u8);
    } else if len < 256 {
        out.extend_from_slice(&[major | 24, len as u8]);
    } else {
        out.push(major | 25);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let key = p256::ecdsa::SigningKey::from_slice(&[0x42; 32]).expect("scalar in range");
        let point = key.verifying_key().to_encoded_point(false);
        // COSE_Key {1: 2, 3: -7, -1: 1, -2: x, -3: y}
        let mut cose = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21];
        cbor_bytes(&mut cose, 0x40, point.x().map(|x| &x[..]).unwrap_or(&[]));
        cose.push(0x22);
        cbor_bytes(&mut cose, 0x40, point.y().map(|y| &y[..]).unwrap_or(&[]));
        let rp_hash = Sha256::digest(RP_ID.as_bytes());

        let mut auth_data = rp_hash.to_vec();
        auth_data.push(Flags::UP | Flags::UV | Flags::AT);
        auth_data.extend_from_slice(&0u32.to_be_bytes());
        auth_data.extend_from_slice(&[0u8; 16]);
        auth_data.extend_from_slice(&(CREDENTIAL_ID.len() as u16).to_be_bytes());
        auth_data.extend_from_slice(CREDENTIAL_ID);
        auth_data.extend_from_slice(&cose);
        // {"fmt": "none", "attStmt": {}, "authData": h'..'}
        let mut att = vec![0xa3];
        cbor_bytes(&mut att, 0x60, b"fmt");
        cbor_bytes(&mut att, 0x60, b"none");
        cbor_bytes(&mut att, 0x60, b"attStmt");
        att.push(0xa0);
        cbor_bytes(&mut att, 0x60, b"authData");
        cbor_bytes(&mut att, 0x40, &auth_data);
        let client = |typ: &str| {
            format!(
                r#"{{"type":"{typ}","challenge":"{}","origin":"{ORIGIN}","crossOrigin":false}}"#,
                b64url_encode(CHALLENGE)
            )
            .into_bytes()
        };
        let registration = json!({
            "id": b64(CREDENTIAL_ID), "rawId": b64(CREDENTIAL_ID), "type": "public-key",
            "response": {
                "clientDataJSON": b64(&client("webauthn.create")),
                "attestationObject": b64(&att),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
        });

        let mut assertion_data = rp_hash.to_vec();
        assertion_data.push(Flags::UP | Flags::UV);
        assertion_data.extend_from_slice(&7u32.to_be_bytes());
        let cd = client("webauthn.get");
        let mut msg = assertion_data.clone();
        msg.extend_from_slice(&Sha256::digest(&cd));
        let sig: p256::ecdsa::Signature = key.sign(&msg);
        let assertion = json!({
            "id": b64(CREDENTIAL_ID), "rawId": b64(CREDENTIAL_ID), "type": "public-key",
            "response": {
                "clientDataJSON": b64(&cd),
                "authenticatorData": b64(&assertion_data),
                "signature": b64(sig.to_der().as_bytes()),
                "userHandle": b64(USER),
            },
            "clientExtensionResults": {},
        });
        Fixture {
            key,
            cose,
            registration,
            assertion,
        }
    })
}

fn rp() -> RelyingParty {
    RelyingParty::new(RP_ID, &[ORIGIN.to_string()])
}

const EXPECTED: Expected<'static> = Expected {
    challenge: CHALLENGE,
    user_verification: false,
};

fn stored(f: &Fixture, sign_count: u32) -> StoredCredential<'_> {
    StoredCredential {
        credential_id: CREDENTIAL_ID,
        public_key: &f.cose,
        sign_count,
        backup_eligible: false,
        user_handle: USER,
    }
}

/// Parsers on raw bytes: no panic, and parsed authenticator data agrees
/// with its flags.
fn raw(data: &[u8]) {
    let _ = parse_attestation_object(data);
    let _ = parse_cose_key(data);
    let _ = parse_client_data(data);
    if let Ok(ad) = parse_authenticator_data(data) {
        assert!(data.len() >= 37, "authenticator data shorter than 37 bytes");
        assert_eq!(ad.attested.is_some(), ad.flags.has(Flags::AT));
        assert_eq!(ad.extensions.is_some(), ad.flags.has(Flags::ED));
        if let Some(a) = ad.attested {
            assert!((1..=1023).contains(&a.credential_id.len()));
        }
    }
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        let _ = RegistrationResponse::from_json(&v);
        let _ = AuthenticationResponse::from_json(&v);
    }
}

fn check_registration(v: &Value) {
    let Ok(r) = RegistrationResponse::from_json(v) else {
        return;
    };
    if let Ok(c) = verify_registration(&rp(), &r, &EXPECTED) {
        let cd = parse_client_data(&r.client_data_json).expect("accepted client data parses");
        assert_eq!(cd.challenge, CHALLENGE, "accepted with another challenge");
        assert_eq!(cd.origin, ORIGIN, "accepted from another origin");
        assert_eq!(cd.typ, "webauthn.create");
        assert!(!cd.cross_origin);
        assert_eq!(c.credential_id, r.raw_id);
        assert!(
            parse_cose_key(&c.public_key).is_ok(),
            "stored key must parse"
        );
    }
}

fn check_assertion(v: &Value, sign_count: u32) {
    let f = fixture();
    let Ok(r) = AuthenticationResponse::from_json(v) else {
        return;
    };
    let Ok(a) = verify_authentication(&rp(), &r, &EXPECTED, &stored(f, sign_count), false) else {
        return;
    };
    // Independently: the signature, the client data and the RP hash.
    let mut msg = r.authenticator_data.clone();
    msg.extend_from_slice(&Sha256::digest(&r.client_data_json));
    let sig = p256::ecdsa::Signature::from_der(&r.signature).expect("accepted: DER signature");
    assert!(
        f.key.verifying_key().verify(&msg, &sig).is_ok(),
        "accepted a signature p256 refuses"
    );
    let cd: Value = serde_json::from_slice(&r.client_data_json).expect("accepted: JSON");
    assert_eq!(cd["type"], "webauthn.get");
    assert_eq!(cd["challenge"], b64(CHALLENGE));
    assert_eq!(cd["origin"], ORIGIN);
    assert_eq!(
        r.authenticator_data.get(..32),
        Some(&Sha256::digest(RP_ID.as_bytes())[..])
    );
    assert!(
        r.authenticator_data[32] & Flags::UP != 0,
        "accepted without UP"
    );
    let count = u32::from_be_bytes([
        r.authenticator_data[33],
        r.authenticator_data[34],
        r.authenticator_data[35],
        r.authenticator_data[36],
    ]);
    assert!(
        sign_count == 0 || count == 0 || count > sign_count,
        "counter regression accepted"
    );
    assert_eq!(a.sign_count, count.max(sign_count));
}

/// Applies the input's edits to one base64url field of `v`.
fn mutate(v: &Value, b: &mut Bytes<'_>) -> Value {
    let mut v = v.clone();
    let fields: Vec<String> = v["response"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let name = fields[usize::from(b.byte()) % fields.len()].clone();
    let mut bytes = v["response"][&name]
        .as_str()
        .and_then(crate::crypto::webauthn::b64url_decode)
        .unwrap_or_default();
    while !b.done() {
        let pos = usize::from(b.byte()) | (usize::from(b.byte()) << 8);
        let pos = pos % (bytes.len() + 1);
        let c = b.byte();
        match b.byte() % 5 {
            0 if pos < bytes.len() => bytes[pos] = c,
            1 => bytes.insert(pos, c),
            2 if pos < bytes.len() => {
                bytes.remove(pos);
            }
            3 => bytes.truncate(pos),
            _ => bytes.extend_from_slice(b.chunk()),
        }
    }
    v["response"][&name] = b64(&bytes);
    v
}

/// The fuzz target.
pub fn webauthn_parse(data: &[u8]) {
    let f = fixture();
    let mut b = Bytes::new(data);
    match b.byte() % 5 {
        0 => raw(b.rest()),
        1 => {
            if let Ok(v) = serde_json::from_slice::<Value>(b.rest()) {
                check_registration(&v);
            }
        }
        2 => {
            let count = u32::from(b.byte());
            if let Ok(v) = serde_json::from_slice::<Value>(b.rest()) {
                check_assertion(&v, count);
            }
        }
        3 => {
            let count = u32::from(b.byte() % 16);
            let v = mutate(&f.assertion, &mut b);
            check_assertion(&v, count);
        }
        _ => {
            let v = mutate(&f.registration, &mut b);
            check_registration(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_genuine_fixtures_are_accepted() {
        let f = fixture();
        let r = RegistrationResponse::from_json(&f.registration).unwrap();
        let c = verify_registration(&rp(), &r, &EXPECTED).unwrap();
        assert_eq!(c.public_key, f.cose);
        let a = AuthenticationResponse::from_json(&f.assertion).unwrap();
        assert_eq!(
            verify_authentication(&rp(), &a, &EXPECTED, &stored(f, 3), true)
                .unwrap()
                .sign_count,
            7
        );
        // Unmutated (an empty edit list) through the target's own paths.
        webauthn_parse(&[3, 3, 0]);
        webauthn_parse(&[4, 0]);
    }
}
