//! WebAuthn relying-party verification (`tfa_core::crypto::webauthn`):
//! the W3C specification's published test vectors (tests/data/), and
//! registrations and assertions made by an authenticator of this test's own
//! (ES256 and EdDSA signing keys, CBOR written with `minicbor`) for every
//! refusal the issue lists; malformed input of every kind is an error, never
//! a panic.

use std::collections::HashMap;

use ed25519_dalek::Signer as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tfa_core::crypto::cose::{self, parse_cose_key, PublicKey};
use tfa_core::crypto::webauthn::{
    b64url_decode, b64url_encode, parse_attestation_object, parse_authenticator_data,
    parse_client_data, verify_authentication, verify_registration, AuthenticationResponse,
    Expected, RegistrationResponse, RelyingParty, StoredCredential, WebauthnError,
};

const RP_ID: &str = "example.org";
const ORIGIN: &str = "https://example.org";

fn rp() -> RelyingParty {
    RelyingParty::new(
        RP_ID,
        &[ORIGIN.to_string(), "http://localhost:3001".to_string()],
    )
}

fn expect(challenge: &[u8], uv: bool) -> Expected<'_> {
    Expected {
        challenge,
        user_verification: uv,
    }
}

fn hex(s: &str) -> Vec<u8> {
    tfa_core::signature::from_hex(s).expect("hex")
}

// ---------------------------------------------------------------------------
// W3C test vectors (Web Authentication Level 3, "Test Vectors")

fn vectors() -> HashMap<String, Vec<u8>> {
    let text = include_str!("data/webauthn-w3c-vectors.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once(" = ").expect("name = hex");
            (k.to_string(), hex(v))
        })
        .collect()
}

struct Vector {
    reg: RegistrationResponse,
    reg_challenge: Vec<u8>,
    aaguid: Vec<u8>,
    auth: AuthenticationResponse,
    auth_challenge: Vec<u8>,
}

fn vector(name: &str) -> Vector {
    let v = vectors();
    let get = |k: &str| {
        v.get(&format!("{name}.{k}"))
            .unwrap_or_else(|| panic!("{name}.{k}"))
            .clone()
    };
    let id = b64url_encode(&get("reg.credential_id"));
    let reg = json!({
        "id": id, "rawId": id, "type": "public-key",
        "response": {
            "clientDataJSON": b64url_encode(&get("reg.clientDataJSON")),
            "attestationObject": b64url_encode(&get("reg.attestationObject")),
            "transports": ["internal"],
        },
        "authenticatorAttachment": "platform",
        "clientExtensionResults": {},
    });
    let auth = json!({
        "id": id, "rawId": id, "type": "public-key",
        "response": {
            "clientDataJSON": b64url_encode(&get("auth.clientDataJSON")),
            "authenticatorData": b64url_encode(&get("auth.authenticatorData")),
            "signature": b64url_encode(&get("auth.signature")),
            "userHandle": null,
        },
        "clientExtensionResults": {},
    });
    Vector {
        reg: RegistrationResponse::from_json(&reg).expect("registration JSON"),
        reg_challenge: get("reg.challenge"),
        aaguid: get("reg.aaguid"),
        auth: AuthenticationResponse::from_json(&auth).expect("authentication JSON"),
        auth_challenge: get("auth.challenge"),
    }
}

/// Registration then authentication of one vector, with UV required as
/// `uv` says; the UV flag of the vector's authenticator data decides
/// whether a required UV fails.
fn run_vector(name: &str, alg: i64) {
    let v = vector(name);
    let rp = rp();
    let reg_flags = parse_attestation_object(&v.reg.attestation_object)
        .and_then(|a| parse_authenticator_data(a.auth_data).map(|d| d.flags.0))
        .expect("vector parses");
    let cred = verify_registration(&rp, &v.reg, &expect(&v.reg_challenge, false))
        .unwrap_or_else(|e| panic!("{name}: registration refused: {e}"));
    assert_eq!(cred.credential_id, v.reg.raw_id, "{name}");
    assert_eq!(cred.algorithm, alg, "{name}");
    assert_eq!(cred.aaguid.to_vec(), v.aaguid, "{name}");
    assert_eq!(cred.sign_count, 0, "{name}");
    assert_eq!(cred.transports, vec!["internal".to_string()]);
    assert_eq!(cred.authenticator_attachment.as_deref(), Some("platform"));
    assert_eq!(cred.user_verified, reg_flags & 0x04 != 0, "{name}");
    assert_eq!(cred.backup_eligible, reg_flags & 0x08 != 0, "{name}");
    assert_eq!(cred.backed_up, reg_flags & 0x10 != 0, "{name}");
    let uv_reg = verify_registration(&rp, &v.reg, &expect(&v.reg_challenge, true));
    if reg_flags & 0x04 == 0 {
        assert_eq!(uv_reg, Err(WebauthnError::UserNotVerified), "{name}");
    } else {
        assert!(uv_reg.is_ok(), "{name}");
    }

    let stored = StoredCredential {
        credential_id: &cred.credential_id,
        public_key: &cred.public_key,
        sign_count: cred.sign_count,
        backup_eligible: cred.backup_eligible,
        user_handle: b"user-1",
    };
    let a = verify_authentication(
        &rp,
        &v.auth,
        &expect(&v.auth_challenge, false),
        &stored,
        false,
    )
    .unwrap_or_else(|e| panic!("{name}: assertion refused: {e}"));
    assert_eq!(a.sign_count, 0);
    let auth_flags = v.auth.authenticator_data[32];
    assert_eq!(a.user_verified, auth_flags & 0x04 != 0, "{name}");
    let uv_auth = verify_authentication(
        &rp,
        &v.auth,
        &expect(&v.auth_challenge, true),
        &stored,
        false,
    );
    if auth_flags & 0x04 == 0 {
        assert_eq!(uv_auth, Err(WebauthnError::UserNotVerified), "{name}");
    } else {
        assert!(uv_auth.is_ok(), "{name}");
    }

    // The registration's challenge does not open the assertion (and the
    // reverse), nor does another origin or RP ID.
    assert_eq!(
        verify_authentication(
            &rp,
            &v.auth,
            &expect(&v.reg_challenge, false),
            &stored,
            false
        ),
        Err(WebauthnError::ChallengeMismatch)
    );
    assert_eq!(
        verify_registration(&rp, &v.reg, &expect(&v.auth_challenge, false)),
        Err(WebauthnError::ChallengeMismatch)
    );
    let other_origin = RelyingParty::new(RP_ID, &["https://example.com".to_string()]);
    assert_eq!(
        verify_registration(&other_origin, &v.reg, &expect(&v.reg_challenge, false)),
        Err(WebauthnError::OriginNotAllowed(ORIGIN.to_string()))
    );
    let other_rp = RelyingParty::new("example.com", &[ORIGIN.to_string()]);
    assert_eq!(
        verify_registration(&other_rp, &v.reg, &expect(&v.reg_challenge, false)),
        Err(WebauthnError::RpIdMismatch)
    );
    assert_eq!(
        verify_authentication(
            &other_rp,
            &v.auth,
            &expect(&v.auth_challenge, false),
            &stored,
            false
        ),
        Err(WebauthnError::RpIdMismatch)
    );
    // A registration is not an assertion.
    let mut as_get = v.auth.clone();
    as_get.client_data_json = v.reg.client_data_json.clone();
    assert_eq!(
        verify_authentication(
            &rp,
            &as_get,
            &expect(&v.reg_challenge, false),
            &stored,
            false
        ),
        Err(WebauthnError::WrongType {
            expected: "webauthn.get"
        })
    );
    // Tampered signature.
    let mut bad = v.auth.clone();
    let last = bad.signature.len() - 1;
    bad.signature[last] ^= 0x01;
    assert_eq!(
        verify_authentication(&rp, &bad, &expect(&v.auth_challenge, false), &stored, false),
        Err(WebauthnError::InvalidSignature)
    );
}

#[test]
fn w3c_none_es256() {
    run_vector("none-es256", cose::ES256);
}

#[test]
fn w3c_packed_self_attestation_es256_statement_ignored() {
    let v = vector("packed-self-es256");
    let att = parse_attestation_object(&v.reg.attestation_object).unwrap();
    assert_eq!(att.fmt, "packed");
    run_vector("packed-self-es256", cose::ES256);
}

#[test]
fn w3c_packed_es256_with_certificate_chain_statement_ignored() {
    run_vector("packed-es256", cose::ES256);
}

#[test]
fn w3c_packed_rs256() {
    run_vector("packed-rs256", cose::RS256);
}

#[test]
fn w3c_packed_eddsa() {
    run_vector("packed-eddsa", cose::EDDSA);
}

#[test]
fn w3c_longest_credential_id() {
    let v = vector("none-es256-long-credential-id");
    assert_eq!(v.reg.raw_id.len(), 1023);
    run_vector("none-es256-long-credential-id", cose::ES256);
}

#[test]
fn w3c_cross_origin_refused() {
    for name in ["none-es256-crossOrigin", "none-es256-topOrigin"] {
        let v = vector(name);
        assert_eq!(
            verify_registration(&rp(), &v.reg, &expect(&v.reg_challenge, false)),
            Err(WebauthnError::CrossOrigin),
            "{name}"
        );
    }
    let v = vector("none-es256-topOrigin");
    let cd = parse_client_data(&v.auth.client_data_json).unwrap();
    assert_eq!(cd.top_origin.as_deref(), Some("https://example.com"));
    assert!(cd.cross_origin);
}

#[test]
fn w3c_es384_is_an_unsupported_algorithm() {
    let v = vector("packed-es384");
    assert_eq!(
        verify_registration(&rp(), &v.reg, &expect(&v.reg_challenge, false)),
        Err(WebauthnError::UnsupportedAlgorithm(-35))
    );
}

// ---------------------------------------------------------------------------
// The test's own authenticator

enum Key {
    P256(p256::ecdsa::SigningKey),
    Ed(ed25519_dalek::SigningKey),
}

const UP: u8 = 0x01;
const UV: u8 = 0x04;
const BE: u8 = 0x08;
const BS: u8 = 0x10;
const AT: u8 = 0x40;
const ED: u8 = 0x80;

struct Authenticator {
    key: Key,
    id: Vec<u8>,
    rp_id: String,
    counter: u32,
}

fn enc() -> minicbor::Encoder<Vec<u8>> {
    minicbor::Encoder::new(Vec::new())
}

impl Authenticator {
    fn es256(seed: u8) -> Self {
        let key = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
        Authenticator {
            key: Key::P256(key),
            id: vec![seed; 16],
            rp_id: RP_ID.into(),
            counter: 0,
        }
    }

    fn eddsa(seed: u8) -> Self {
        Authenticator {
            key: Key::Ed(ed25519_dalek::SigningKey::from_bytes(&[seed; 32])),
            id: vec![seed; 20],
            rp_id: RP_ID.into(),
            counter: 0,
        }
    }

    fn cose_key(&self) -> Vec<u8> {
        let mut e = enc();
        match &self.key {
            Key::P256(k) => {
                let point = k.verifying_key().to_encoded_point(false);
                e.map(5).unwrap();
                e.i64(1).unwrap().i64(2).unwrap();
                e.i64(3).unwrap().i64(-7).unwrap();
                e.i64(-1).unwrap().i64(1).unwrap();
                e.i64(-2).unwrap().bytes(point.x().unwrap()).unwrap();
                e.i64(-3).unwrap().bytes(point.y().unwrap()).unwrap();
            }
            Key::Ed(k) => {
                e.map(4).unwrap();
                e.i64(1).unwrap().i64(1).unwrap();
                e.i64(3).unwrap().i64(-8).unwrap();
                e.i64(-1).unwrap().i64(6).unwrap();
                e.i64(-2)
                    .unwrap()
                    .bytes(k.verifying_key().as_bytes())
                    .unwrap();
            }
        }
        e.into_writer()
    }

    fn auth_data(&self, flags: u8, counter: u32, attested: Option<&[u8]>) -> Vec<u8> {
        let mut ad = Sha256::digest(self.rp_id.as_bytes()).to_vec();
        ad.push(flags);
        ad.extend_from_slice(&counter.to_be_bytes());
        if let Some(cose_key) = attested {
            ad.extend_from_slice(&[0xAA; 16]);
            ad.extend_from_slice(&u16::try_from(self.id.len()).unwrap().to_be_bytes());
            ad.extend_from_slice(&self.id);
            ad.extend_from_slice(cose_key);
        }
        ad
    }

    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        match &self.key {
            Key::P256(k) => {
                let sig: p256::ecdsa::Signature = k.sign(msg);
                sig.to_der().as_bytes().to_vec()
            }
            Key::Ed(k) => k.sign(msg).to_bytes().to_vec(),
        }
    }

    /// A registration response for `challenge` from `origin`, with `flags`
    /// (AT is added).
    fn register(&self, origin: &str, challenge: &[u8], flags: u8) -> Value {
        let cd = client_data("webauthn.create", challenge, origin);
        let ad = self.auth_data(flags | AT, 0, Some(&self.cose_key()));
        registration_json(&self.id, &cd, &attestation_object("none", &ad))
    }

    /// An assertion for `challenge` from `origin`, with `flags`; the counter
    /// goes up by one.
    fn assert(&mut self, origin: &str, challenge: &[u8], flags: u8) -> Value {
        self.counter += 1;
        let cd = client_data("webauthn.get", challenge, origin);
        let ad = self.auth_data(flags, self.counter, None);
        self.signed_assertion(&cd, &ad, Some(b"user-1"))
    }

    fn signed_assertion(&self, cd: &[u8], ad: &[u8], user: Option<&[u8]>) -> Value {
        let mut msg = ad.to_vec();
        msg.extend_from_slice(&Sha256::digest(cd));
        assertion_json(&self.id, cd, ad, &self.sign(&msg), user)
    }
}

fn client_data(typ: &str, challenge: &[u8], origin: &str) -> Vec<u8> {
    format!(
        r#"{{"type":"{typ}","challenge":"{}","origin":"{origin}","crossOrigin":false}}"#,
        b64url_encode(challenge)
    )
    .into_bytes()
}

fn attestation_object(fmt: &str, auth_data: &[u8]) -> Vec<u8> {
    let mut e = enc();
    e.map(3).unwrap();
    e.str("fmt").unwrap().str(fmt).unwrap();
    e.str("attStmt").unwrap().map(0).unwrap();
    e.str("authData").unwrap().bytes(auth_data).unwrap();
    e.into_writer()
}

fn registration_json(id: &[u8], cd: &[u8], att: &[u8]) -> Value {
    json!({
        "id": b64url_encode(id), "rawId": b64url_encode(id), "type": "public-key",
        "response": {
            "clientDataJSON": b64url_encode(cd),
            "attestationObject": b64url_encode(att),
            "transports": ["internal", "hybrid"],
        },
        "authenticatorAttachment": "platform",
        "clientExtensionResults": { "credProps": { "rk": true } },
    })
}

fn assertion_json(id: &[u8], cd: &[u8], ad: &[u8], sig: &[u8], user: Option<&[u8]>) -> Value {
    json!({
        "id": b64url_encode(id), "rawId": b64url_encode(id), "type": "public-key",
        "response": {
            "clientDataJSON": b64url_encode(cd),
            "authenticatorData": b64url_encode(ad),
            "signature": b64url_encode(sig),
            "userHandle": user.map(b64url_encode),
        },
        "authenticatorAttachment": "platform",
        "clientExtensionResults": {},
    })
}

fn reg(
    v: &Value,
    challenge: &[u8],
    uv: bool,
) -> Result<tfa_core::crypto::webauthn::NewCredential, WebauthnError> {
    verify_registration(
        &rp(),
        &RegistrationResponse::from_json(v)?,
        &expect(challenge, uv),
    )
}

struct Saved {
    id: Vec<u8>,
    key: Vec<u8>,
    count: u32,
    be: bool,
}

impl Saved {
    fn stored(&self) -> StoredCredential<'_> {
        StoredCredential {
            credential_id: &self.id,
            public_key: &self.key,
            sign_count: self.count,
            backup_eligible: self.be,
            user_handle: b"user-1",
        }
    }
}

fn enrol(a: &Authenticator, flags: u8) -> Saved {
    let c = reg(
        &a.register(ORIGIN, b"challenge-reg-0123456789abcdef!!", flags),
        b"challenge-reg-0123456789abcdef!!",
        false,
    )
    .expect("registration");
    Saved {
        id: c.credential_id,
        key: c.public_key,
        count: c.sign_count,
        be: c.backup_eligible,
    }
}

fn login(
    v: &Value,
    saved: &Saved,
    challenge: &[u8],
    uv: bool,
) -> Result<tfa_core::crypto::webauthn::Assertion, WebauthnError> {
    verify_authentication(
        &rp(),
        &AuthenticationResponse::from_json(v)?,
        &expect(challenge, uv),
        &saved.stored(),
        false,
    )
}

fn both() -> [Authenticator; 2] {
    [Authenticator::es256(7), Authenticator::eddsa(9)]
}

const CH: &[u8] = b"challenge-login-0123456789abcdef";

#[test]
fn own_authenticator_happy_path_and_counter() {
    for (mut a, alg) in both().into_iter().zip([cose::ES256, cose::EDDSA]) {
        let c = reg(&a.register(ORIGIN, b"c1", UP | UV | BE), b"c1", true).unwrap();
        assert_eq!(c.algorithm, alg);
        assert_eq!(c.credential_id, a.id);
        assert_eq!(c.public_key, a.cose_key());
        assert!(c.user_verified && c.backup_eligible && !c.backed_up);
        assert_eq!(c.attestation_format, "none");
        assert_eq!(c.transports, ["internal", "hybrid"]);
        assert_eq!(c.resident_key, Some(true));
        let mut saved = enrol(&a, UP | UV | BE);
        for n in 1..=3 {
            let r = login(&a.assert(ORIGIN, CH, UP | UV | BE | BS), &saved, CH, true).unwrap();
            assert_eq!(r.sign_count, n);
            assert!(r.user_verified && r.backed_up);
            saved.count = r.sign_count;
        }
        // The second allowed origin works too; UV not required, not given.
        login(
            &a.assert("http://localhost:3001", CH, UP | BE),
            &saved,
            CH,
            false,
        )
        .unwrap();
    }
}

#[test]
fn wrong_origin_rp_id_type_and_challenge() {
    for mut a in both() {
        let saved = enrol(&a, UP);
        assert_eq!(
            reg(&a.register("https://evil.example", b"c", UP), b"c", false),
            Err(WebauthnError::OriginNotAllowed(
                "https://evil.example".into()
            ))
        );
        assert_eq!(
            login(
                &a.assert("https://example.org.evil.example", CH, UP),
                &saved,
                CH,
                false
            ),
            Err(WebauthnError::OriginNotAllowed(
                "https://example.org.evil.example".into()
            ))
        );
        // The origin must match exactly (no trailing slash, no other port).
        for o in [
            "https://example.org/",
            "https://example.org:8443",
            "http://example.org",
        ] {
            assert!(matches!(
                login(&a.assert(o, CH, UP), &saved, CH, false),
                Err(WebauthnError::OriginNotAllowed(_))
            ));
        }
        // Challenge issued for another ceremony (or one already spent).
        assert_eq!(
            login(&a.assert(ORIGIN, b"old-challenge", UP), &saved, CH, false),
            Err(WebauthnError::ChallengeMismatch)
        );
        assert_eq!(
            reg(&a.register(ORIGIN, b"old", UP), b"new", false),
            Err(WebauthnError::ChallengeMismatch)
        );
        // A challenge that differs only in length (prefix) is refused.
        assert_eq!(
            login(&a.assert(ORIGIN, &CH[..31], UP), &saved, CH, false),
            Err(WebauthnError::ChallengeMismatch)
        );
        // Registration client data in an assertion.
        let cd = client_data("webauthn.create", CH, ORIGIN);
        let ad = a.auth_data(UP, 50, None);
        assert_eq!(
            login(&a.signed_assertion(&cd, &ad, None), &saved, CH, false),
            Err(WebauthnError::WrongType {
                expected: "webauthn.get"
            })
        );
        // Scoped to another RP ID.
        let mut other = Authenticator::es256(3);
        other.rp_id = "example.com".into();
        assert_eq!(
            reg(&other.register(ORIGIN, b"c", UP), b"c", false),
            Err(WebauthnError::RpIdMismatch)
        );
        a.rp_id = "evil.example".into();
        assert_eq!(
            login(&a.assert(ORIGIN, CH, UP), &saved, CH, false),
            Err(WebauthnError::RpIdMismatch)
        );
    }
}

#[test]
fn user_presence_and_verification() {
    for mut a in both() {
        assert_eq!(
            reg(&a.register(ORIGIN, b"c", 0), b"c", false),
            Err(WebauthnError::UserNotPresent)
        );
        assert_eq!(
            reg(&a.register(ORIGIN, b"c", UP), b"c", true),
            Err(WebauthnError::UserNotVerified)
        );
        let saved = enrol(&a, UP);
        assert_eq!(
            login(&a.assert(ORIGIN, CH, UV), &saved, CH, false),
            Err(WebauthnError::UserNotPresent)
        );
        assert_eq!(
            login(&a.assert(ORIGIN, CH, UP), &saved, CH, true),
            Err(WebauthnError::UserNotVerified)
        );
        assert!(
            !login(&a.assert(ORIGIN, CH, UP), &saved, CH, false)
                .unwrap()
                .user_verified
        );
    }
}

#[test]
fn backup_flags() {
    for mut a in both() {
        assert!(matches!(
            reg(&a.register(ORIGIN, b"c", UP | BS), b"c", false),
            Err(WebauthnError::InvalidBackupFlags(_))
        ));
        let single_device = enrol(&a, UP);
        assert!(matches!(
            login(&a.assert(ORIGIN, CH, UP | BE), &single_device, CH, false),
            Err(WebauthnError::InvalidBackupFlags(_))
        ));
        let synced = enrol(&a, UP | BE);
        assert!(matches!(
            login(&a.assert(ORIGIN, CH, UP), &synced, CH, false),
            Err(WebauthnError::InvalidBackupFlags(_))
        ));
        login(&a.assert(ORIGIN, CH, UP | BE), &synced, CH, false).unwrap();
    }
}

/// Decodes a base64url field of a JSON credential, changes it, encodes it.
fn tamper(v: &Value, field: &str, f: impl FnOnce(&mut Vec<u8>)) -> Value {
    let mut v = v.clone();
    let mut bytes = b64url_decode(v["response"][field].as_str().unwrap()).unwrap();
    f(&mut bytes);
    v["response"][field] = json!(b64url_encode(&bytes));
    v
}

#[test]
fn tampered_assertions_refused() {
    for mut a in both() {
        let saved = enrol(&a, UP);
        let good = a.assert(ORIGIN, CH, UP);
        login(&good, &saved, CH, false).unwrap();
        // authenticatorData: the counter, the flags (UV added), the RP hash.
        for i in [33usize, 36, 32, 0] {
            let v = tamper(&good, "authenticatorData", |b| {
                b[i] ^= if i == 32 { UV } else { 0x01 }
            });
            let r = login(&v, &saved, CH, false);
            if i == 0 {
                assert_eq!(r, Err(WebauthnError::RpIdMismatch));
            } else {
                assert_eq!(r, Err(WebauthnError::InvalidSignature), "byte {i}");
            }
        }
        // clientDataJSON: still valid JSON with the right challenge and origin.
        let v = tamper(&good, "clientDataJSON", |b| {
            let s = String::from_utf8(b.clone()).unwrap();
            *b = s
                .replace("\"crossOrigin\":false", "\"crossOrigin\":false,\"x\":1")
                .into_bytes();
        });
        assert_eq!(
            login(&v, &saved, CH, false),
            Err(WebauthnError::InvalidSignature)
        );
        // signature: a flipped bit, truncated, extended, empty.
        let v = tamper(&good, "signature", |b| {
            let n = b.len() / 2;
            b[n] ^= 0x10;
        });
        assert_eq!(
            login(&v, &saved, CH, false),
            Err(WebauthnError::InvalidSignature)
        );
        for f in [
            (|b: &mut Vec<u8>| b.truncate(b.len() - 1)) as fn(&mut Vec<u8>),
            |b| b.push(0),
            |b| b.clear(),
        ] {
            let v = tamper(&good, "signature", f);
            assert_eq!(
                login(&v, &saved, CH, false),
                Err(WebauthnError::InvalidSignature)
            );
        }
        // Signed by another key of the same algorithm.
        let mut thief = match a.key {
            Key::P256(_) => Authenticator::es256(8),
            Key::Ed(_) => Authenticator::eddsa(10),
        };
        thief.id = a.id.clone();
        assert_eq!(
            login(&thief.assert(ORIGIN, CH, UP), &saved, CH, false),
            Err(WebauthnError::InvalidSignature)
        );
    }
}

#[test]
fn another_credential_or_user_refused() {
    for mut a in both() {
        let saved = enrol(&a, UP);
        let other = Authenticator::es256(42);
        let other_saved = enrol(&other, UP);
        // An assertion of credential A checked against credential B.
        assert!(matches!(
            login(&a.assert(ORIGIN, CH, UP), &other_saved, CH, false),
            Err(WebauthnError::CredentialMismatch(_))
        ));
        // userHandle of someone else.
        let cd = client_data("webauthn.get", CH, ORIGIN);
        let ad = a.auth_data(UP, 77, None);
        let v = a.signed_assertion(&cd, &ad, Some(b"user-2"));
        assert!(matches!(
            login(&v, &saved, CH, false),
            Err(WebauthnError::CredentialMismatch(_))
        ));
        // Passwordless needs the userHandle.
        let v = a.signed_assertion(&cd, &ad, None);
        login(&v, &saved, CH, false).unwrap();
        let r = verify_authentication(
            &rp(),
            &AuthenticationResponse::from_json(&v).unwrap(),
            &expect(CH, false),
            &saved.stored(),
            true,
        );
        assert!(matches!(r, Err(WebauthnError::Malformed(m)) if m.contains("userHandle")));
        let v = a.signed_assertion(&cd, &ad, Some(b"user-1"));
        let r = verify_authentication(
            &rp(),
            &AuthenticationResponse::from_json(&v).unwrap(),
            &expect(CH, false),
            &saved.stored(),
            true,
        );
        assert_eq!(r.unwrap().sign_count, 77);
    }
}

#[test]
fn counter_regression() {
    for a in both() {
        let mut saved = enrol(&a, UP);
        let cd = client_data("webauthn.get", CH, ORIGIN);
        let at = |n: u32| a.signed_assertion(&cd, &a.auth_data(UP, n, None), None);
        saved.count = 5;
        for n in [5, 4, 1] {
            assert_eq!(
                login(&at(n), &saved, CH, false),
                Err(WebauthnError::CounterRegression {
                    stored: 5,
                    received: n
                })
            );
        }
        assert_eq!(login(&at(6), &saved, CH, false).unwrap().sign_count, 6);
        // An authenticator without a counter (0): accepted, the stored count kept.
        assert_eq!(login(&at(0), &saved, CH, false).unwrap().sign_count, 5);
        saved.count = 0;
        assert_eq!(login(&at(0), &saved, CH, false).unwrap().sign_count, 0);
        assert_eq!(login(&at(1), &saved, CH, false).unwrap().sign_count, 1);
        // The regression is only reported for a valid signature.
        saved.count = 5;
        let forged = tamper(&at(3), "signature", |b| b[10] ^= 1);
        assert_eq!(
            login(&forged, &saved, CH, false),
            Err(WebauthnError::InvalidSignature)
        );
        let msg = WebauthnError::CounterRegression {
            stored: 5,
            received: 3,
        }
        .to_string();
        assert!(msg.contains("counter") && msg.contains('5') && msg.contains('3'));
    }
}

#[test]
fn high_s_es256_signature_accepted() {
    // Both (r, s) and (r, n - s) verify under ECDSA; WebAuthn does not ask
    // for low S, so both are accepted (one of the two is the high-S form).
    let mut a = Authenticator::es256(5);
    let saved = enrol(&a, UP);
    let good = a.assert(ORIGIN, CH, UP);
    login(&good, &saved, CH, false).unwrap();
    let mut highs = 0;
    let flipped = tamper(&good, "signature", |b| {
        let sig = p256::ecdsa::Signature::from_der(b).unwrap();
        let (r, s) = sig.split_scalars();
        let other = p256::ecdsa::Signature::from_scalars(r, -*s).unwrap();
        highs =
            usize::from(sig.normalize_s().is_some()) + usize::from(other.normalize_s().is_some());
        *b = other.to_der().as_bytes().to_vec();
    });
    assert_eq!(highs, 1, "exactly one of s and n - s is high");
    assert_ne!(flipped, good);
    login(&flipped, &saved, CH, false).unwrap();
}

#[test]
fn extensions_tolerated_and_checked() {
    for mut a in both() {
        let saved = enrol(&a, UP);
        let mut ext = enc();
        ext.map(1)
            .unwrap()
            .str("credProtect")
            .unwrap()
            .u8(2)
            .unwrap();
        let ext = ext.into_writer();
        let cd = client_data("webauthn.get", CH, ORIGIN);
        let mut ad = a.auth_data(UP | ED, 3, None);
        ad.extend_from_slice(&ext);
        login(&a.signed_assertion(&cd, &ad, None), &saved, CH, false).unwrap();
        let parsed = parse_authenticator_data(&ad).unwrap();
        assert_eq!(parsed.extensions, Some(ext.as_slice()));
        // Registration with extensions after the key.
        let cdr = client_data("webauthn.create", b"c", ORIGIN);
        let mut adr = a.auth_data(UP | AT | ED, 0, Some(&a.cose_key()));
        adr.extend_from_slice(&ext);
        let v = registration_json(&a.id, &cdr, &attestation_object("none", &adr));
        reg(&v, b"c", false).unwrap();
        // ED without a map, and bytes after the data, are refused.
        let ad = a.auth_data(UP | ED, 4, None);
        assert!(matches!(
            login(&a.signed_assertion(&cd, &ad, None), &saved, CH, false),
            Err(WebauthnError::Malformed(_))
        ));
        a.counter = 10;
        let mut ad = a.auth_data(UP, 11, None);
        ad.push(0xa0);
        assert!(matches!(
            login(&a.signed_assertion(&cd, &ad, None), &saved, CH, false),
            Err(WebauthnError::Malformed(m)) if m.contains("trailing")
        ));
    }
}

// ---------------------------------------------------------------------------
// COSE keys

fn cose(entries: &[(i64, CborVal)]) -> Vec<u8> {
    let mut e = enc();
    e.map(entries.len() as u64).unwrap();
    for (k, v) in entries {
        e.i64(*k).unwrap();
        match v {
            CborVal::I(i) => e.i64(*i).unwrap(),
            CborVal::B(b) => e.bytes(b).unwrap(),
        };
    }
    e.into_writer()
}

enum CborVal {
    I(i64),
    B(Vec<u8>),
}
use CborVal::{B, I};

fn registration_with_key(
    cose_key: &[u8],
) -> Result<tfa_core::crypto::webauthn::NewCredential, WebauthnError> {
    let a = Authenticator::es256(1);
    let cd = client_data("webauthn.create", b"c", ORIGIN);
    let ad = a.auth_data(UP | AT, 0, Some(cose_key));
    reg(
        &registration_json(&a.id, &cd, &attestation_object("none", &ad)),
        b"c",
        false,
    )
}

#[test]
fn unsupported_algorithms_and_keys() {
    let a = Authenticator::es256(1);
    let point = match &a.key {
        Key::P256(k) => k.verifying_key().to_encoded_point(false),
        Key::Ed(_) => unreachable!(),
    };
    let (x, y) = (point.x().unwrap().to_vec(), point.y().unwrap().to_vec());
    // ES384, ES512, PS256, Ed448 (-53), RS1 (-65535): not offered.
    for alg in [-35, -36, -37, -53, -65535, 0, 7] {
        let key = cose(&[
            (1, I(2)),
            (3, I(alg)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ]);
        assert_eq!(
            registration_with_key(&key),
            Err(WebauthnError::UnsupportedAlgorithm(alg)),
            "alg {alg}"
        );
        assert!(WebauthnError::UnsupportedAlgorithm(alg)
            .to_string()
            .contains(&alg.to_string()));
    }
    let unsupported_key = |entries: &[(i64, CborVal)], why: &str| {
        let r = registration_with_key(&cose(entries));
        assert!(
            matches!(&r, Err(WebauthnError::UnsupportedKey(_))),
            "{why}: {r:?}"
        );
    };
    unsupported_key(
        &[
            (1, I(1)),
            (3, I(-7)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ],
        "ES256 as OKP",
    );
    unsupported_key(
        &[
            (1, I(2)),
            (3, I(-7)),
            (-1, I(2)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ],
        "P-384 curve",
    );
    unsupported_key(
        &[
            (1, I(2)),
            (3, I(-7)),
            (-1, I(1)),
            (-2, B(x[1..].to_vec())),
            (-3, B(y.clone())),
        ],
        "short x",
    );
    let mut off = y.clone();
    off[31] ^= 1;
    unsupported_key(
        &[
            (1, I(2)),
            (3, I(-7)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(off)),
        ],
        "not on the curve",
    );
    unsupported_key(
        &[(1, I(1)), (3, I(-8)), (-1, I(7)), (-2, B(vec![9; 57]))],
        "Ed448 curve",
    );
    let mut identity = vec![0u8; 32];
    identity[0] = 1;
    unsupported_key(
        &[(1, I(1)), (3, I(-8)), (-1, I(6)), (-2, B(identity))],
        "small-order Ed25519",
    );
    // A 1024-bit RSA modulus.
    let mut n = vec![0xC5u8; 128];
    n[127] |= 1;
    unsupported_key(
        &[(1, I(3)), (3, I(-257)), (-1, B(n)), (-2, B(vec![1, 0, 1]))],
        "RSA-1024",
    );
    // Structure errors.
    let malformed = |bytes: Vec<u8>, why: &str| {
        let r = registration_with_key(&bytes);
        assert!(
            matches!(&r, Err(WebauthnError::Malformed(_))),
            "{why}: {r:?}"
        );
    };
    malformed(
        cose(&[
            (1, I(2)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ]),
        "no alg",
    );
    malformed(
        cose(&[
            (3, I(-7)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ]),
        "no kty",
    );
    malformed(
        cose(&[
            (1, I(2)),
            (3, I(-7)),
            (3, I(-7)),
            (-1, I(1)),
            (-2, B(x.clone())),
            (-3, B(y.clone())),
        ]),
        "alg twice",
    );
    malformed(
        cose(&[
            (1, I(2)),
            (3, I(-7)),
            (-1, I(1)),
            (-2, I(4)),
            (-3, B(y.clone())),
        ]),
        "x not bytes",
    );
    malformed(vec![0xa5, 0x01, 0x02], "truncated map");
    malformed(vec![0x80], "an array");
    malformed(vec![], "nothing");
    let mut indefinite = vec![0xbf];
    indefinite.extend_from_slice(&cose(&[(1, I(2))])[1..]);
    indefinite.push(0xff);
    malformed(indefinite, "indefinite map");
    // The stored key is parsed again for assertions and must be exact.
    let good = a.cose_key();
    assert!(matches!(parse_cose_key(&good), Ok(PublicKey::Es256(_))));
    let mut longer = good.clone();
    longer.push(0);
    assert!(matches!(
        parse_cose_key(&longer),
        Err(WebauthnError::Malformed(_))
    ));
}

// ---------------------------------------------------------------------------
// Malformed input: an error with a message, never a panic

#[test]
fn malformed_json_and_base64() {
    let a = Authenticator::es256(2);
    let good = a.register(ORIGIN, b"c", UP);
    reg(&good, b"c", false).unwrap();
    let cases: Vec<(Value, &str)> = vec![
        (json!(null), "object"),
        (json!([]), "object"),
        (json!("x"), "object"),
        (
            {
                let mut v = good.clone();
                v["type"] = json!("password");
                v
            },
            "type",
        ),
        (
            {
                let mut v = good.clone();
                v.as_object_mut().unwrap().remove("type");
                v
            },
            "type",
        ),
        (
            {
                let mut v = good.clone();
                v["id"] = json!("not base64!");
                v
            },
            "credential.id",
        ),
        (
            {
                let mut v = good.clone();
                v["id"] = json!(12);
                v
            },
            "credential.id",
        ),
        (
            {
                let mut v = good.clone();
                v["rawId"] = json!("AAAA");
                v
            },
            "rawId",
        ),
        (
            {
                let mut v = good.clone();
                v["id"] = json!("");
                v["rawId"] = json!("");
                v
            },
            "credential.id",
        ),
        (
            {
                let mut v = good.clone();
                v["id"] = json!(b64url_encode(&[0; 1024]));
                v["rawId"] = v["id"].clone();
                v
            },
            "credential.id",
        ),
        (
            {
                let mut v = good.clone();
                v["response"] = json!("x");
                v
            },
            "response",
        ),
        (
            {
                let mut v = good.clone();
                v["response"]["clientDataJSON"] = json!("a+b/");
                v
            },
            "clientDataJSON",
        ),
        (
            {
                let mut v = good.clone();
                v["response"]
                    .as_object_mut()
                    .unwrap()
                    .remove("attestationObject");
                v
            },
            "attestationObject",
        ),
        (
            {
                let mut v = good.clone();
                v["response"]["transports"] = json!("usb");
                v
            },
            "transports",
        ),
        (
            {
                let mut v = good.clone();
                v["response"]["transports"] = json!([1]);
                v
            },
            "transports",
        ),
        (
            {
                let mut v = good.clone();
                v["authenticatorAttachment"] = json!(5);
                v
            },
            "authenticatorAttachment",
        ),
        (
            {
                let mut v = good.clone();
                v["clientExtensionResults"] = json!([]);
                v
            },
            "clientExtensionResults",
        ),
        (
            {
                let mut v = good.clone();
                v["response"]["clientDataJSON"] = json!("x".repeat(70_000));
                v
            },
            "too long",
        ),
    ];
    for (v, what) in cases {
        match RegistrationResponse::from_json(&v) {
            Err(WebauthnError::Malformed(m)) => {
                assert!(m.contains(what), "{m:?} should name {what}")
            }
            other => panic!("{v}: {other:?}"),
        }
    }
    // Padded base64url is accepted (some clients pad).
    let mut padded = good.clone();
    let cd = padded["response"]["clientDataJSON"]
        .as_str()
        .unwrap()
        .to_string();
    let pad = "=".repeat((4 - cd.len() % 4) % 4);
    padded["response"]["clientDataJSON"] = json!(format!("{cd}{pad}"));
    reg(&padded, b"c", false).unwrap();
    // Assertion JSON.
    let mut bad = json!({"id": "AA", "rawId": "AA", "type": "public-key",
        "response": {"clientDataJSON": "e30", "authenticatorData": "AA", "signature": "AA", "userHandle": 5}});
    assert!(
        matches!(AuthenticationResponse::from_json(&bad), Err(WebauthnError::Malformed(m)) if m.contains("userHandle"))
    );
    bad["response"]["userHandle"] = json!(null);
    bad["response"].as_object_mut().unwrap().remove("signature");
    assert!(
        matches!(AuthenticationResponse::from_json(&bad), Err(WebauthnError::Malformed(m)) if m.contains("signature"))
    );
}

#[test]
fn malformed_client_data() {
    for (cd, what) in [
        (&b"not json"[..], "not JSON"),
        (b"[]", "object"),
        (b"{\"type\":\"webauthn.get\"}", "challenge"),
        (b"{\"type\":1,\"challenge\":\"AA\",\"origin\":\"x\"}", "type"),
        (b"{\"type\":\"webauthn.get\",\"challenge\":\"%%\",\"origin\":\"x\"}", "challenge"),
        (b"{\"type\":\"webauthn.get\",\"challenge\":\"AA\"}", "origin"),
        (b"{\"type\":\"webauthn.get\",\"challenge\":\"AA\",\"origin\":\"x\",\"crossOrigin\":\"no\"}", "crossOrigin"),
        (b"\xff\xfe", "not JSON"),
    ] {
        match parse_client_data(cd) {
            Err(WebauthnError::Malformed(m)) => assert!(m.contains(what), "{m:?} should name {what}"),
            other => panic!("{cd:?}: {other:?}"),
        }
    }
}

#[test]
fn malformed_attestation_objects() {
    let a = Authenticator::eddsa(4);
    let ad = a.auth_data(UP | AT, 0, Some(&a.cose_key()));
    let good = attestation_object("none", &ad);
    parse_attestation_object(&good).unwrap();
    let mut e = enc();
    e.map(2)
        .unwrap()
        .str("fmt")
        .unwrap()
        .str("none")
        .unwrap()
        .str("authData")
        .unwrap()
        .bytes(&ad)
        .unwrap();
    let no_stmt = e.into_writer();
    let mut e = enc();
    e.map(3)
        .unwrap()
        .str("fmt")
        .unwrap()
        .str("none")
        .unwrap()
        .str("attStmt")
        .unwrap()
        .u8(0)
        .unwrap()
        .str("authData")
        .unwrap()
        .bytes(&ad)
        .unwrap();
    let stmt_not_map = e.into_writer();
    let mut e = enc();
    e.map(4)
        .unwrap()
        .str("fmt")
        .unwrap()
        .str("none")
        .unwrap()
        .str("fmt")
        .unwrap()
        .str("none")
        .unwrap()
        .str("attStmt")
        .unwrap()
        .map(0)
        .unwrap()
        .str("authData")
        .unwrap()
        .bytes(&ad)
        .unwrap();
    let dup = e.into_writer();
    let mut trailing = good.clone();
    trailing.push(0);
    for (bytes, what) in [
        (vec![], "map"),
        (vec![0xff], "map"),
        (b"\x83\x01\x02\x03".to_vec(), "map"),
        (no_stmt, "attStmt"),
        (stmt_not_map, "attStmt"),
        (dup, "twice"),
        (trailing, "trailing"),
    ] {
        match parse_attestation_object(&bytes) {
            Err(WebauthnError::Malformed(m)) => {
                assert!(m.contains(what), "{m:?} should name {what}")
            }
            other => panic!("{bytes:?}: {other:?}"),
        }
    }
    // Every truncation of a good object, and of its authenticator data, is
    // an error (never a panic).
    for n in 0..good.len() {
        assert!(parse_attestation_object(&good[..n]).is_err(), "prefix {n}");
    }
    for n in 0..ad.len() {
        assert!(
            parse_authenticator_data(&ad[..n]).is_err(),
            "authData prefix {n}"
        );
    }
    // A credential ID length past the data, zero, or above 1023.
    for len in [0u16, 1024, 0xffff, 500] {
        let mut bad = ad.clone();
        bad[53..55].copy_from_slice(&len.to_be_bytes());
        assert!(
            matches!(
                parse_authenticator_data(&bad),
                Err(WebauthnError::Malformed(_))
            ),
            "len {len}"
        );
    }
}

/// Every single-byte change of a valid registration and assertion is either
/// refused with an error or (where the byte is not covered by any check,
/// like the AAGUID) accepted; nothing panics.
#[test]
fn byte_mutations_never_panic() {
    let mut a = Authenticator::es256(6);
    let v = a.register(ORIGIN, b"c", UP);
    let r = RegistrationResponse::from_json(&v).unwrap();
    for i in 0..r.attestation_object.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut m = r.clone();
            m.attestation_object[i] ^= x;
            let _ = verify_registration(&rp(), &m, &expect(b"c", false));
        }
    }
    let saved = enrol(&a, UP);
    let v = a.assert(ORIGIN, CH, UP);
    let r = AuthenticationResponse::from_json(&v).unwrap();
    for i in 0..r.authenticator_data.len() {
        let mut m = r.clone();
        m.authenticator_data[i] ^= 0x01;
        assert!(
            verify_authentication(&rp(), &m, &expect(CH, false), &saved.stored(), false).is_err()
        );
    }
    for i in 0..r.client_data_json.len() {
        let mut m = r.clone();
        m.client_data_json[i] ^= 0x01;
        assert!(
            verify_authentication(&rp(), &m, &expect(CH, false), &saved.stored(), false).is_err()
        );
    }
}

#[test]
fn error_messages_are_clear() {
    let all = [
        WebauthnError::Malformed("authenticatorData is truncated".into()),
        WebauthnError::WrongType {
            expected: "webauthn.get",
        },
        WebauthnError::ChallengeMismatch,
        WebauthnError::OriginNotAllowed("https://evil.example".into()),
        WebauthnError::CrossOrigin,
        WebauthnError::RpIdMismatch,
        WebauthnError::UserNotPresent,
        WebauthnError::UserNotVerified,
        WebauthnError::InvalidBackupFlags("x"),
        WebauthnError::CredentialMismatch("x"),
        WebauthnError::UnsupportedAlgorithm(-35),
        WebauthnError::UnsupportedKey("x".into()),
        WebauthnError::InvalidSignature,
        WebauthnError::CounterRegression {
            stored: 2,
            received: 1,
        },
    ];
    let msgs: Vec<String> = all.iter().map(ToString::to_string).collect();
    for m in &msgs {
        assert!(m.len() > 10 && !m.contains('{'), "{m}");
    }
    let mut unique = msgs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), msgs.len());
}

proptest::proptest! {
    /// The fuzz target's invariants (`testing::fuzzing::webauthn_parse`) on
    /// random inputs, on every `cargo test` (the fuzzer itself needs
    /// nightly: scripts/fuzz.sh).
    #[test]
    fn fuzz_target_invariants_hold(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        tfa_core::testing::fuzzing::webauthn_parse(&data);
    }
}
