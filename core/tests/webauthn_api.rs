//! Passkey enrolment and management through the API (in-memory harness):
//! options, verify (single-use, 5-minute challenges), the first method's
//! backup codes, the credential list, rename, removal, `/2fa/methods`, and
//! two simultaneous verifications of one challenge.

mod common;

use std::sync::Arc;

use common::*;
use ed25519_dalek::Signer as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tfa_core::crypto::webauthn::{b64url_decode, b64url_encode};
use tfa_core::testing::{test_config, Harness, InterleavingStore, MemoryStore};
use tfa_core::{Request, Response, Service, Store};

const ORIGIN: &str = "http://localhost:3001";
const RP_ID: &str = "localhost";

/// An authenticator of the test's own: an Ed25519 or P-256 key and a
/// credential ID.
struct Authenticator {
    ed: Option<ed25519_dalek::SigningKey>,
    p256: Option<p256::ecdsa::SigningKey>,
    id: Vec<u8>,
}

impl Authenticator {
    fn eddsa(seed: u8) -> Self {
        Authenticator {
            ed: Some(ed25519_dalek::SigningKey::from_bytes(&[seed; 32])),
            p256: None,
            id: vec![seed; 16],
        }
    }

    fn es256(seed: u8) -> Self {
        Authenticator {
            ed: None,
            p256: Some(p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap()),
            id: vec![seed; 24],
        }
    }

    fn cose_key(&self) -> Vec<u8> {
        let mut e = minicbor::Encoder::new(Vec::new());
        if let Some(k) = &self.ed {
            e.map(4).unwrap();
            e.i64(1).unwrap().i64(1).unwrap();
            e.i64(3).unwrap().i64(-8).unwrap();
            e.i64(-1).unwrap().i64(6).unwrap();
            e.i64(-2)
                .unwrap()
                .bytes(k.verifying_key().as_bytes())
                .unwrap();
        } else if let Some(k) = &self.p256 {
            let p = k.verifying_key().to_encoded_point(false);
            e.map(5).unwrap();
            e.i64(1).unwrap().i64(2).unwrap();
            e.i64(3).unwrap().i64(-7).unwrap();
            e.i64(-1).unwrap().i64(1).unwrap();
            e.i64(-2).unwrap().bytes(p.x().unwrap()).unwrap();
            e.i64(-3).unwrap().bytes(p.y().unwrap()).unwrap();
        }
        e.into_writer()
    }

    /// The toJSON() form of a registration for `challenge` (base64url).
    fn register(&self, challenge: &str, origin: &str, flags: u8) -> Value {
        let cd = format!(
            r#"{{"type":"webauthn.create","challenge":"{challenge}","origin":"{origin}","crossOrigin":false}}"#
        );
        let mut ad = Sha256::digest(RP_ID.as_bytes()).to_vec();
        ad.push(flags | 0x40);
        ad.extend_from_slice(&0u32.to_be_bytes());
        ad.extend_from_slice(&[0; 16]);
        ad.extend_from_slice(&u16::try_from(self.id.len()).unwrap().to_be_bytes());
        ad.extend_from_slice(&self.id);
        ad.extend_from_slice(&self.cose_key());
        let mut e = minicbor::Encoder::new(Vec::new());
        e.map(3).unwrap();
        e.str("fmt").unwrap().str("none").unwrap();
        e.str("attStmt").unwrap().map(0).unwrap();
        e.str("authData").unwrap().bytes(&ad).unwrap();
        let att = e.into_writer();
        json!({
            "id": b64url_encode(&self.id), "rawId": b64url_encode(&self.id), "type": "public-key",
            "response": {
                "clientDataJSON": b64url_encode(cd.as_bytes()),
                "attestationObject": b64url_encode(&att),
                "transports": ["internal"],
            },
            "authenticatorAttachment": "platform",
            "clientExtensionResults": { "credProps": { "rk": true } },
        })
    }

    /// The toJSON() form of an assertion.
    fn assertion(
        &self,
        challenge: &str,
        origin: &str,
        flags: u8,
        counter: u32,
        user: &str,
    ) -> Value {
        let cd = format!(
            r#"{{"type":"webauthn.get","challenge":"{challenge}","origin":"{origin}","crossOrigin":false}}"#
        );
        let mut ad = Sha256::digest(RP_ID.as_bytes()).to_vec();
        ad.push(flags);
        ad.extend_from_slice(&counter.to_be_bytes());
        let mut msg = ad.clone();
        msg.extend_from_slice(&Sha256::digest(cd.as_bytes()));
        json!({
            "id": b64url_encode(&self.id), "rawId": b64url_encode(&self.id), "type": "public-key",
            "response": {
                "clientDataJSON": b64url_encode(cd.as_bytes()),
                "authenticatorData": b64url_encode(&ad),
                "signature": b64url_encode(&self.sign(&msg)),
                "userHandle": b64url_encode(user.as_bytes()),
            },
            "clientExtensionResults": {},
        })
    }

    /// A signature with the credential's key.
    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        match (&self.ed, &self.p256) {
            (Some(k), _) => k.sign(msg).to_bytes().to_vec(),
            (_, Some(k)) => {
                let sig: p256::ecdsa::Signature = k.sign(msg);
                sig.to_der().as_bytes().to_vec()
            }
            _ => unreachable!(),
        }
    }
}

fn options<S: Store>(h: &mut Harness<S>, u: &User) -> Value {
    let resp = h.call(bearer(
        post("/2fa/webauthn/register/options", json!({})),
        &u.access,
    ));
    assert_eq!(resp.status, 200);
    data(&resp)
}

fn verify<S: Store>(
    h: &mut Harness<S>,
    u: &User,
    credential: &Value,
    name: Option<&str>,
) -> Response {
    let mut body = json!({ "credential": credential });
    if let Some(n) = name {
        body["name"] = json!(n);
    }
    h.call(bearer(
        post("/2fa/webauthn/register/verify", body),
        &u.access,
    ))
}

fn enrol<S: Store>(h: &mut Harness<S>, u: &User, a: &Authenticator) -> Value {
    let o = options(h, u);
    let resp = verify(
        h,
        u,
        &a.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x05),
        None,
    );
    assert_eq!(resp.status, 201, "{}", String::from_utf8_lossy(&resp.body));
    data(&resp)
}

const CHALLENGE_ERROR: &str = "Invalid or expired passkey challenge";

#[test]
fn options_are_creation_options_in_json_form() {
    let mut h = Harness::new();
    let u = register(&mut h, "alice");
    let o = options(&mut h, &u);
    assert_eq!(
        o["rp"],
        json!({ "id": "localhost", "name": "TwoFactorAuth" })
    );
    assert_eq!(o["user"]["id"], json!(b64url_encode(u.id.as_bytes())));
    assert_eq!(o["user"]["name"], json!(u.email));
    let challenge = b64url_decode(o["challenge"].as_str().unwrap()).unwrap();
    assert_eq!(challenge.len(), 32);
    let algs: Vec<i64> = o["pubKeyCredParams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["type"], "public-key");
            p["alg"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(algs, [-7, -8, -257]);
    assert_eq!(o["attestation"], "none");
    assert_eq!(o["authenticatorSelection"]["residentKey"], "preferred");
    assert_eq!(o["authenticatorSelection"]["userVerification"], "preferred");
    assert_eq!(o["excludeCredentials"], json!([]));
    assert_eq!(o["timeout"], 300_000);
    // A fresh challenge every time.
    assert_ne!(options(&mut h, &u)["challenge"], o["challenge"]);
    // Bearer token required.
    let resp = h.call(post("/2fa/webauthn/register/options", json!({})));
    assert_error(&resp, 401, "Invalid or expired token");
}

#[test]
fn enrolment_turns_2fa_on_with_backup_codes_once() {
    let mut h = Harness::new();
    let u = register(&mut h, "bob");
    let a = Authenticator::eddsa(3);
    let d = enrol(&mut h, &u, &a);
    let c = &d["credential"];
    assert_eq!(c["credentialId"], json!(b64url_encode(&a.id)));
    assert_eq!(c["algorithm"], "EdDSA");
    assert_eq!(c["name"], "Passkey 1");
    assert_eq!(c["transports"], json!(["internal"]));
    assert_eq!(c["lastUsedAt"], Value::Null);
    assert_eq!(d["backupCodes"].as_array().unwrap().len(), 10);
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["twoFactorEnabled"], true);
    let count = data(&h.call(bearer(get("/2fa/backup-codes/count"), &u.access)));
    assert_eq!(count["remaining"], 10);
    // A second passkey: no new codes, the options now exclude the first.
    let o = options(&mut h, &u);
    assert_eq!(
        o["excludeCredentials"],
        json!([{ "type": "public-key", "id": b64url_encode(&a.id), "transports": ["internal"] }])
    );
    let b = Authenticator::es256(4);
    let resp = verify(
        &mut h,
        &u,
        &b.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x01),
        Some("  YubiKey  "),
    );
    assert_eq!(resp.status, 201);
    let d = data(&resp);
    assert_eq!(d["credential"]["name"], "YubiKey");
    assert_eq!(d["credential"]["algorithm"], "ES256");
    assert!(d.get("backupCodes").is_none());
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &u.access)));
    assert_eq!(list["credentials"].as_array().unwrap().len(), 2);
    let methods = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    let w: Vec<&Value> = methods["methods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "webauthn")
        .collect();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0]["credentialCount"], 2);
    // Login now offers webauthn.
    let resp = login(&mut h, "bob@example.com", "203.0.113.9");
    let d = data(&resp);
    assert!(d["availableMethods"]
        .as_array()
        .unwrap()
        .contains(&json!("webauthn")));
    // The test key signs for real (sanity of the fixture).
    assert!(!a.sign(b"x").is_empty() && !b.sign(b"x").is_empty());
}

#[test]
fn challenges_are_single_use_expire_and_belong_to_their_user() {
    let mut h = Harness::new();
    let u = register(&mut h, "carol");
    let v = register(&mut h, "victor");
    let a = Authenticator::eddsa(5);
    // Replay of a verified registration.
    let o = options(&mut h, &u);
    let cred = a.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x01);
    assert_eq!(verify(&mut h, &u, &cred, None).status, 201);
    assert_error(&verify(&mut h, &u, &cred, None), 400, CHALLENGE_ERROR);
    // A challenge never issued.
    let b = Authenticator::eddsa(6);
    let cred = b.register(&b64url_encode(&[7; 32]), ORIGIN, 0x01);
    assert_error(&verify(&mut h, &u, &cred, None), 400, CHALLENGE_ERROR);
    // Expired after 5 minutes.
    let o = options(&mut h, &u);
    h.advance_secs(301);
    let cred = b.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x01);
    assert_error(&verify(&mut h, &u, &cred, None), 400, CHALLENGE_ERROR);
    // Issued to another user.
    let o = options(&mut h, &v);
    let cred = b.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x01);
    assert_error(&verify(&mut h, &u, &cred, None), 400, CHALLENGE_ERROR);
    // ... and spent by that attempt: its owner cannot use it either.
    assert_error(&verify(&mut h, &v, &cred, None), 400, CHALLENGE_ERROR);
}

#[test]
fn refusals_are_400_with_the_failed_check() {
    let mut h = Harness::new();
    let u = register(&mut h, "dave");
    let a = Authenticator::es256(8);
    let cases: Vec<(Value, &str)> = vec![
        (
            a.register(
                options(&mut h, &u)["challenge"].as_str().unwrap(),
                "https://evil.example",
                0x01,
            ),
            "Validation error: passkey: origin \"https://evil.example\" is not allowed",
        ),
        (
            a.register(
                options(&mut h, &u)["challenge"].as_str().unwrap(),
                ORIGIN,
                0x00,
            ),
            "Validation error: passkey: user presence (UP) is required",
        ),
    ];
    for (cred, msg) in cases {
        assert_error(&verify(&mut h, &u, &cred, None), 400, msg);
    }
    let good = a.register(
        options(&mut h, &u)["challenge"].as_str().unwrap(),
        ORIGIN,
        0x01,
    );
    let mut bad = good.clone();
    bad["response"]["attestationObject"] = json!("!!");
    assert_error(
        &verify(&mut h, &u, &bad, None),
        400,
        "Validation error: passkey: malformed credential: credential.response.attestationObject is not valid base64url",
    );
    let mut bad = good.clone();
    bad["response"]["attestationObject"] = json!(b64url_encode(b"\xa1\x01"));
    let resp = verify(&mut h, &u, &bad, None);
    assert_eq!(resp.status, 400);
    assert!(resp.json()["error"]
        .as_str()
        .unwrap()
        .contains("attestationObject"));
    let resp = h.call(bearer(
        post(
            "/2fa/webauthn/register/verify",
            json!({ "credential": "x" }),
        ),
        &u.access,
    ));
    assert_error(&resp, 400, "Validation error: credential must be an object");
    let resp = verify(&mut h, &u, &good, Some("\u{7}bell"));
    assert_error(
        &resp,
        400,
        "Validation error: name must not contain control characters",
    );
    // Nothing was stored by any of these.
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &u.access)));
    assert_eq!(list["credentials"], json!([]));
}

#[test]
fn one_credential_id_is_registered_once() {
    let mut h = Harness::new();
    let u = register(&mut h, "erin");
    let w = register(&mut h, "walter");
    let a = Authenticator::eddsa(9);
    enrol(&mut h, &u, &a);
    let o = options(&mut h, &w);
    let resp = verify(
        &mut h,
        &w,
        &a.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x01),
        None,
    );
    assert_error(&resp, 409, "Passkey already registered");
    // Removed, it can be registered again.
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &u.access)));
    let id = list["credentials"][0]["id"].as_str().unwrap().to_string();
    let resp = h.call(bearer(
        delete(&format!("/2fa/webauthn/credentials/{id}")),
        &u.access,
    ));
    assert_eq!(data(&resp)["twoFactorEnabled"], false);
    enrol(&mut h, &w, &a);
}

#[test]
fn rename_and_remove() {
    let mut h = Harness::new();
    let u = register(&mut h, "frank");
    let d = enrol(&mut h, &u, &Authenticator::eddsa(10));
    let id = d["credential"]["id"].as_str().unwrap().to_string();
    let path = format!("/2fa/webauthn/credentials/{id}");
    let patch = |name: Value| {
        Request::new("PATCH", &format!("/api{path}")).json(&json!({ "name": name }).to_string())
    };
    let resp = h.call(bearer(patch(json!("Laptop")), &u.access));
    assert_eq!(data(&resp)["credential"]["name"], "Laptop");
    assert_error(
        &h.call(bearer(patch(json!("")), &u.access)),
        400,
        "Validation error: name is required",
    );
    assert_error(
        &h.call(bearer(patch(json!("x".repeat(65))), &u.access)),
        400,
        "Validation error: name must be 1 to 64 characters",
    );
    let other = format!(
        "/api/2fa/webauthn/credentials/{}",
        "0b7e4f3c-1111-4a2b-8c3d-123456789abc"
    );
    assert_error(
        &h.call(bearer(
            Request::new("PATCH", &other).json(r#"{"name":"x"}"#),
            &u.access,
        )),
        404,
        "Resource not found",
    );
    // Another user cannot touch it.
    let g = register(&mut h, "grace");
    assert_error(
        &h.call(bearer(delete(&path), &g.access)),
        404,
        "Resource not found",
    );
    // The last method: 2FA off, backup codes void, the method gone.
    let resp = h.call(bearer(delete(&path), &u.access));
    assert_eq!(
        data(&resp),
        json!({ "message": "Passkey removed", "twoFactorEnabled": false })
    );
    let me = data(&h.call(bearer(get("/auth/me"), &u.access)));
    assert_eq!(me["twoFactorEnabled"], false);
    let methods = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    assert_eq!(methods["methods"], json!([]));
    assert_error(
        &h.call(bearer(delete(&path), &u.access)),
        404,
        "Resource not found",
    );
}

#[test]
fn removing_the_webauthn_method_removes_every_passkey() {
    let mut h = Harness::new();
    let u = register(&mut h, "heidi");
    let a = Authenticator::eddsa(11);
    enrol(&mut h, &u, &a);
    enrol(&mut h, &u, &Authenticator::es256(12));
    let (_secret, _) = enable_totp(&mut h, &u);
    let methods = data(&h.call(bearer(get("/2fa/methods"), &u.access)));
    let id = methods["methods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "webauthn")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = h.call(bearer(delete(&format!("/2fa/methods/{id}")), &u.access));
    assert_eq!(resp.status, 200);
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &u.access)));
    assert_eq!(list["credentials"], json!([]));
    // The credential IDs are free again.
    enrol(&mut h, &u, &a);
}

#[test]
fn two_simultaneous_verifications_of_one_challenge_one_succeeds() {
    let store = Arc::new(InterleavingStore::new(MemoryStore::new()));
    let mut h = Harness::with(test_config(&[]), store.clone());
    let service = Arc::new(Service::new(test_config(&[])));
    let u = register(&mut h, "ivan");
    for round in 0..5u8 {
        let o = options(&mut h, &u);
        let challenge = o["challenge"].as_str().unwrap().to_string();
        // Two different authenticators answer the same challenge.
        let creds = [
            Authenticator::eddsa(20 + 2 * round).register(&challenge, ORIGIN, 0x01),
            Authenticator::es256(21 + 2 * round).register(&challenge, ORIGIN, 0x01),
        ];
        let reqs = creds
            .into_iter()
            .map(|cred| {
                bearer(
                    post(
                        "/2fa/webauthn/register/verify",
                        json!({ "credential": cred }),
                    ),
                    &u.access,
                )
            })
            .collect();
        let statuses: Vec<u16> = concurrently(&service, &store, h.now_ms, reqs)
            .iter()
            .map(|r| r.status)
            .collect();
        let ok = statuses.iter().filter(|s| **s == 201).count();
        assert_eq!(ok, 1, "round {round}: {statuses:?}");
        assert!(statuses.contains(&400), "round {round}: {statuses:?}");
    }
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &u.access)));
    assert_eq!(list["credentials"].as_array().unwrap().len(), 5);
}

#[test]
fn replayed_request_bodies_never_panic() {
    // Malformed credentials of every shape: a 400, never a 500.
    let mut h = Harness::new();
    let u = register(&mut h, "judy");
    for cred in [
        json!({}),
        json!({ "type": "public-key" }),
        json!({ "type": "public-key", "id": "AA", "response": {} }),
        json!({ "type": "public-key", "id": "AA", "response": { "clientDataJSON": "e30", "attestationObject": "oA" } }),
        json!({ "type": "public-key", "id": "AA", "response": { "clientDataJSON": b64url_encode(b"{\"type\":\"webauthn.create\",\"challenge\":\"AA\",\"origin\":\"x\"}"), "attestationObject": "oA" } }),
    ] {
        let resp = verify(&mut h, &u, &cred, None);
        assert_eq!(
            resp.status,
            400,
            "{cred}: {}",
            String::from_utf8_lossy(&resp.body)
        );
    }
}

/// Password login, then the passkey options of the second step; returns the
/// temp token and the challenge.
fn second_step<S: Store>(h: &mut Harness<S>, u: &User, _ip: &str) -> (String, String) {
    // Each login from its own address: the per-IP limits stay out of the way.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ip = &format!("10.77.{}.{}", n / 200, n % 200 + 1);
    let temp = temp_token(h, u, ip);
    let resp = h.call(post("/2fa/webauthn/options", json!({ "tempToken": temp })).peer(ip));
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let o = data(&resp);
    assert_eq!(o["rpId"], RP_ID);
    (temp, o["challenge"].as_str().unwrap().to_string())
}

/// An IP of its own for each verification call.
fn fresh_ip() -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("10.88.{}.{}", n / 200, n % 200 + 1)
}

fn verify_webauthn<S: Store>(h: &mut Harness<S>, temp: &str, cred: &Value, _ip: &str) -> Response {
    h.call(
        post(
            "/2fa/verify-webauthn",
            json!({ "tempToken": temp, "credential": cred }),
        )
        .peer(&fresh_ip()),
    )
}

#[test]
fn login_second_step_with_a_passkey() {
    let mut h = Harness::new();
    let u = register(&mut h, "kim");
    let a = Authenticator::eddsa(30);
    enrol(&mut h, &u, &a);
    let ip = "203.0.113.20";
    let temp = temp_token(&mut h, &u, ip);
    let o = data(&h.call(post("/2fa/webauthn/options", json!({ "tempToken": temp })).peer(ip)));
    assert_eq!(
        o["allowCredentials"],
        json!([{ "type": "public-key", "id": b64url_encode(&a.id), "transports": ["internal"] }])
    );
    assert_eq!(o["userVerification"], "preferred");
    let cred = a.assertion(o["challenge"].as_str().unwrap(), ORIGIN, 0x01, 7, &u.id);
    let resp = verify_webauthn(&mut h, &temp, &cred, ip);
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let d = data(&resp);
    assert_eq!(d["user"]["id"], json!(u.id));
    let access = d["accessToken"].as_str().unwrap().to_string();
    let me = data(&h.call(bearer(get("/auth/me"), &access)));
    assert_eq!(me["id"], json!(u.id));
    let list = data(&h.call(bearer(get("/2fa/webauthn/credentials"), &access)));
    assert!(list["credentials"][0]["lastUsedAt"].is_string());
    // The same assertion again (new temp token): its challenge is spent.
    let temp2 = temp_token(&mut h, &u, ip);
    assert_error(
        &verify_webauthn(&mut h, &temp2, &cred, ip),
        400,
        CHALLENGE_ERROR,
    );
    // The temp token of the success is used up.
    let (_, ch) = second_step(&mut h, &u, ip);
    let cred = a.assertion(&ch, ORIGIN, 0x01, 8, &u.id);
    assert_error(
        &verify_webauthn(&mut h, &temp, &cred, ip),
        400,
        "Invalid temp token",
    );
}

#[test]
fn login_second_step_refusals_and_counter_regression() {
    let mut h = Harness::new();
    let u = register(&mut h, "lena");
    let m = register(&mut h, "mallory");
    let a = Authenticator::es256(31);
    let b = Authenticator::eddsa(32);
    enrol(&mut h, &u, &a);
    enrol(&mut h, &m, &b);
    let ip = "203.0.113.30";
    // Counter 10 accepted, then 10 again and 9: regression, audited.
    let (temp, ch) = second_step(&mut h, &u, ip);
    assert_eq!(
        verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, 10, &u.id), ip).status,
        200
    );
    for n in [10, 9] {
        let (temp, ch) = second_step(&mut h, &u, ip);
        let resp = verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, n, &u.id), ip);
        assert_error(
            &resp,
            400,
            &format!("Validation error: passkey: signature counter did not increase (stored 10, received {n}): possible cloned authenticator"),
        );
    }
    let log = data(&h.call(bearer(get("/audit-log?limit=100"), &u.access)));
    let n = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "webauthn_counter_regression" && e["success"] == false)
        .count();
    assert_eq!(n, 2, "{log}");
    // Another user's passkey, an unregistered one, a bad signature, another origin.
    let (temp, ch) = second_step(&mut h, &u, ip);
    let resp = verify_webauthn(&mut h, &temp, &b.assertion(&ch, ORIGIN, 1, 1, &m.id), ip);
    assert_error(&resp, 400, "Validation error: passkey: credential mismatch: the credential is not one of this user's passkeys");
    let (temp, ch) = second_step(&mut h, &u, ip);
    let stranger = Authenticator::es256(33);
    let resp = verify_webauthn(
        &mut h,
        &temp,
        &stranger.assertion(&ch, ORIGIN, 1, 1, &u.id),
        ip,
    );
    assert_eq!(resp.status, 400);
    let (temp, ch) = second_step(&mut h, &u, ip);
    let mut cred = a.assertion(&ch, ORIGIN, 1, 20, &u.id);
    let mut sig = b64url_decode(cred["response"]["signature"].as_str().unwrap()).unwrap();
    let last = sig.len() - 1;
    sig[last] ^= 1;
    cred["response"]["signature"] = json!(b64url_encode(&sig));
    assert_error(
        &verify_webauthn(&mut h, &temp, &cred, ip),
        400,
        "Validation error: passkey: the signature is not valid",
    );
    let (temp, ch) = second_step(&mut h, &u, ip);
    let resp = verify_webauthn(
        &mut h,
        &temp,
        &a.assertion(&ch, "https://evil.example", 1, 21, &u.id),
        ip,
    );
    assert_error(
        &resp,
        400,
        "Validation error: passkey: origin \"https://evil.example\" is not allowed",
    );
    // UP missing.
    let (temp, ch) = second_step(&mut h, &u, ip);
    let resp = verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 0, 22, &u.id), ip);
    assert_error(
        &resp,
        400,
        "Validation error: passkey: user presence (UP) is required",
    );
    // Expired challenge.
    let (temp, ch) = second_step(&mut h, &u, ip);
    h.advance_secs(301);
    let resp = verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, 23, &u.id), ip);
    assert_eq!(resp.status, 400);
    // A user without passkeys gets no options.
    let n = register(&mut h, "nobody");
    enable_totp(&mut h, &n);
    let temp = temp_token(&mut h, &n, "203.0.113.31");
    let resp =
        h.call(post("/2fa/webauthn/options", json!({ "tempToken": temp })).peer("203.0.113.31"));
    assert_error(&resp, 400, "No 2FA method available");
}

#[test]
fn passwordless_sign_in_with_a_discoverable_credential() {
    let mut h = Harness::new();
    let u = register(&mut h, "olga");
    let a = Authenticator::eddsa(40);
    enrol(&mut h, &u, &a);
    let options = |h: &mut Harness| {
        let resp = h.call(post("/auth/passkey/options", json!({})).peer(&fresh_ip()));
        assert_eq!(resp.status, 200);
        let o = data(&resp);
        assert_eq!(o["allowCredentials"], json!([]));
        assert_eq!(o["userVerification"], "required");
        o["challenge"].as_str().unwrap().to_string()
    };
    let verify = |h: &mut Harness, cred: &Value| {
        h.call(post("/auth/passkey/verify", json!({ "credential": cred })).peer(&fresh_ip()))
    };
    // UP + UV: a full session.
    let ch = options(&mut h);
    let cred = a.assertion(&ch, ORIGIN, 0x05, 3, &u.id);
    let resp = verify(&mut h, &cred);
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let d = data(&resp);
    assert_eq!(d["user"]["id"], json!(u.id));
    let access = d["accessToken"].as_str().unwrap();
    let me = data(&h.call(bearer(get("/auth/me"), access)));
    assert_eq!(me["id"], json!(u.id));
    // The session counts as multi-factor.
    let payload = b64url_decode(access.split('.').nth(1).unwrap()).unwrap();
    let claims: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(claims["mfa"], true, "{claims}");
    // Replayed: the challenge is spent.
    assert_error(&verify(&mut h, &cred), 400, CHALLENGE_ERROR);
    // UV missing.
    let ch = options(&mut h);
    assert_error(
        &verify(&mut h, &a.assertion(&ch, ORIGIN, 0x01, 4, &u.id)),
        400,
        "Validation error: passkey: user verification (UV) is required",
    );
    // No userHandle, or one naming nobody, or another user.
    let ch = options(&mut h);
    let mut cred = a.assertion(&ch, ORIGIN, 0x05, 5, &u.id);
    cred["response"]["userHandle"] = Value::Null;
    let resp = verify(&mut h, &cred);
    assert_eq!(resp.status, 400);
    assert!(resp.json()["error"]
        .as_str()
        .unwrap()
        .contains("userHandle"));
    let ch = options(&mut h);
    let nobody = "0b7e4f3c-1111-4a2b-8c3d-123456789abc";
    assert_error(
        &verify(&mut h, &a.assertion(&ch, ORIGIN, 0x05, 6, nobody)),
        400,
        "Validation error: passkey: credential mismatch: the credential is not registered",
    );
    let p = register(&mut h, "peter");
    let ch = options(&mut h);
    assert_error(
        &verify(&mut h, &a.assertion(&ch, ORIGIN, 0x05, 7, &p.id)),
        400,
        "Validation error: passkey: credential mismatch: the credential is not one of this user's passkeys",
    );
    // A challenge of the login second step is not one for passwordless.
    let (_temp, ch) = second_step(&mut h, &u, "");
    assert_error(
        &verify(&mut h, &a.assertion(&ch, ORIGIN, 0x05, 8, &u.id)),
        400,
        CHALLENGE_ERROR,
    );
    // Still fine with a fresh challenge and a higher counter.
    let ch = options(&mut h);
    assert_eq!(
        verify(&mut h, &a.assertion(&ch, ORIGIN, 0x05, 9, &u.id)).status,
        200
    );
}

#[test]
fn webhook_events_for_passkeys() {
    let mut h = Harness::new();
    let u = register(&mut h, "quinn");
    let resp = h.call(bearer(
        post(
            "/webhooks",
            json!({ "url": "https://hooks.example.com/tfa",
                    "events": ["passkey.registered", "passkey.removed", "passkey.counter_regression", "2fa.enabled"] }),
        ),
        &u.access,
    ));
    assert_eq!(resp.status, 201);
    let events = |h: &Harness| -> Vec<String> {
        h.webhook_calls
            .iter()
            .filter_map(|c| {
                c.call
                    .headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("x-webhook-event"))
                    .map(|(_, v)| v.clone())
            })
            .collect()
    };
    let a = Authenticator::es256(50);
    let d = enrol(&mut h, &u, &a);
    assert_eq!(events(&h), ["passkey.registered", "2fa.enabled"]);
    // A counter regression is announced too.
    let (temp, ch) = second_step(&mut h, &u, "");
    assert_eq!(
        verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, 5, &u.id), "").status,
        200
    );
    let (temp, ch) = second_step(&mut h, &u, "");
    assert_eq!(
        verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, 5, &u.id), "").status,
        400
    );
    let id = d["credential"]["id"].as_str().unwrap();
    let resp = h.call(bearer(
        delete(&format!("/2fa/webauthn/credentials/{id}")),
        &u.access,
    ));
    assert_eq!(resp.status, 200);
    assert_eq!(
        events(&h),
        [
            "passkey.registered",
            "2fa.enabled",
            "passkey.counter_regression",
            "passkey.removed"
        ]
    );
}

#[test]
fn passkey_ceremonies_without_a_session_are_limited_per_address() {
    let mut h = Harness::new();
    for i in 0..20 {
        let resp = h.call(post("/auth/passkey/options", json!({})).peer("192.0.2.99"));
        assert_eq!(resp.status, 200, "request {i}");
    }
    let resp = h.call(post("/auth/passkey/verify", json!({ "credential": {} })).peer("192.0.2.99"));
    assert_error(&resp, 429, "Too many requests. Please try again later.");
    // Another address is not affected.
    let resp = h.call(post("/auth/passkey/options", json!({})).peer("192.0.2.100"));
    assert_eq!(resp.status, 200);
}

/// The `amr` claim of an access token.
fn amr_of(access: &str) -> Value {
    let payload = b64url_decode(access.split('.').nth(1).unwrap()).unwrap();
    serde_json::from_slice::<Value>(&payload).unwrap()["amr"].clone()
}

#[test]
fn access_tokens_and_introspection_say_how_the_user_signed_in() {
    let mut h = Harness::new();
    let u = register(&mut h, "rita");
    assert_eq!(amr_of(&u.access), json!(["pwd"]));
    // A device-bound passkey (BE not set) as second step: pwd + hwk.
    let a = Authenticator::es256(60);
    enrol(&mut h, &u, &a);
    let (temp, ch) = second_step(&mut h, &u, "");
    let resp = verify_webauthn(&mut h, &temp, &a.assertion(&ch, ORIGIN, 1, 1, &u.id), "");
    let access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    assert_eq!(amr_of(&access), json!(["pwd", "hwk", "mfa"]));
    // Refresh keeps it.
    let refresh = data(&resp)["refreshToken"].as_str().unwrap().to_string();
    let resp = h.call(post("/auth/refresh", json!({ "refreshToken": refresh })));
    let refreshed = data(&resp)["accessToken"].as_str().unwrap().to_string();
    assert_eq!(amr_of(&refreshed), json!(["pwd", "hwk", "mfa"]));
    // TOTP as second step: pwd + otp.
    let t = register(&mut h, "sam");
    let (secret, _) = enable_totp(&mut h, &t);
    let temp = temp_token(&mut h, &t, "192.0.2.150");
    h.advance_secs(30);
    let resp = h.call(post(
        "/2fa/verify",
        json!({ "tempToken": temp, "code": totp_code(&secret, h.now_ms / 1000) }),
    ));
    let totp_access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    assert_eq!(amr_of(&totp_access), json!(["pwd", "otp", "mfa"]));
    // A synced passkey (BE set) without a password: swk.
    let v = register(&mut h, "uma");
    let b = Authenticator::eddsa(61);
    let o = options(&mut h, &v);
    let resp = verify(
        &mut h,
        &v,
        &b.register(o["challenge"].as_str().unwrap(), ORIGIN, 0x0d),
        None,
    );
    assert_eq!(resp.status, 201);
    let resp = h.call(post("/auth/passkey/options", json!({})).peer(&fresh_ip()));
    let ch = data(&resp)["challenge"].as_str().unwrap().to_string();
    let resp = h.call(
        post(
            "/auth/passkey/verify",
            json!({ "credential": b.assertion(&ch, ORIGIN, 0x0d, 1, &v.id) }),
        )
        .peer(&fresh_ip()),
    );
    let pk_access = data(&resp)["accessToken"].as_str().unwrap().to_string();
    assert_eq!(amr_of(&pk_access), json!(["swk", "mfa"]));
    // Introspection returns it.
    let resp = h.call(bearer(
        post("/auth/introspect", json!({ "token": pk_access })),
        &v.access,
    ));
    let d = data(&resp);
    assert_eq!(d["active"], true);
    assert_eq!(d["amr"], json!(["swk", "mfa"]));
}
