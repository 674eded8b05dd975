//! Tests of the token formats: every kind, its claims, the signature and the
//! refusals.

use super::*;
use crate::crypto::signature::hmac_sha256;
use proptest::prelude::*;
use serde_json::{json, Value};

const ALL: [TokenKind; 4] = [
    TokenKind::Access,
    TokenKind::Refresh,
    TokenKind::Temp,
    TokenKind::Device,
];
const ISS: &str = "https://auth.example.test";
const AUD: &str = "tfa-api";
const NOW: u64 = 1_700_000_000;

fn secret(kind: TokenKind) -> &'static [u8] {
    match kind {
        TokenKind::Access => b"access-secret-0123456789abcdef!!",
        TokenKind::Refresh => b"refresh-secret-0123456789abcdef!",
        TokenKind::Temp => b"temp-secret-0123456789abcdef!!!!",
        TokenKind::Device => b"device-secret-0123456789abcdef!!",
    }
}

fn keys() -> TokenKeys {
    TokenKeys::new(
        secret(TokenKind::Access),
        secret(TokenKind::Refresh),
        secret(TokenKind::Temp),
        secret(TokenKind::Device),
        ISS,
        AUD,
    )
}

fn same_secret_keys() -> TokenKeys {
    let s = b"one secret for all four kinds!!!";
    TokenKeys::new(s, s, s, s, ISS, AUD)
}

fn full_extra() -> Extra {
    Extra {
        sid: Some("sess-1".into()),
        jti: Some("jti-1".into()),
        did: Some("dev-1".into()),
        mfa: Some(true),
        amr: Some(vec!["pwd".into(), "otp".into(), "mfa".into()]),
    }
}

/// Just the claims `kind` requires.
fn minimal_extra(kind: TokenKind) -> Extra {
    match kind {
        TokenKind::Access => Extra {
            sid: Some("s".into()),
            mfa: Some(false),
            ..Extra::default()
        },
        TokenKind::Refresh => Extra {
            sid: Some("s".into()),
            jti: Some("j".into()),
            ..Extra::default()
        },
        TokenKind::Temp => Extra {
            jti: Some("j".into()),
            ..Extra::default()
        },
        TokenKind::Device => Extra {
            did: Some("d".into()),
            ..Extra::default()
        },
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token with the given header and payload JSON, HS256-signed by hand
/// (also used by `token_memo`'s tests).
pub(crate) fn sign_raw(header: &Value, payload: &Value, secret: &[u8]) -> String {
    let msg = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(payload.to_string().as_bytes())
    );
    let sig = hmac_sha256(secret, msg.as_bytes());
    format!("{msg}.{}", b64(&sig))
}

/// A complete, valid access-token payload.
fn access_payload() -> Value {
    json!({
        "sub": "user-1", "sid": "sess-1", "mfa": true, "typ": "access",
        "iss": ISS, "aud": AUD, "iat": NOW, "exp": NOW + 900
    })
}

pub(crate) fn hs256_header() -> Value {
    json!({"alg": "HS256", "typ": "JWT"})
}

fn decode_part(part: &str) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("b64")).expect("json")
}

#[test]
fn kind_constants() {
    let typs: Vec<_> = ALL.iter().map(|k| k.typ()).collect();
    assert_eq!(typs, ["access", "refresh", "temp", "device"]);
    let lifetimes: Vec<_> = ALL.iter().map(|k| k.lifetime_secs()).collect();
    assert_eq!(lifetimes, [900, 604_800, 300, 2_592_000]);
}

#[test]
fn round_trip_each_kind_with_every_claim() {
    let k = keys();
    for kind in ALL {
        let token = k.issue(kind, "user-1", full_extra(), NOW);
        let claims = k.verify(kind, &token, NOW).expect("valid");
        assert_eq!(
            claims,
            Claims {
                sub: "user-1".into(),
                sid: Some("sess-1".into()),
                jti: Some("jti-1".into()),
                did: Some("dev-1".into()),
                mfa: Some(true),
                amr: Some(vec!["pwd".into(), "otp".into(), "mfa".into()]),
                typ: kind.typ().into(),
                iss: ISS.into(),
                aud: AUD.into(),
                iat: NOW,
                exp: NOW + kind.lifetime_secs(),
                nbf: None,
            }
        );
    }
}

#[test]
fn round_trip_each_kind_with_minimal_claims() {
    let k = keys();
    for kind in ALL {
        let extra = minimal_extra(kind);
        let token = k.issue(kind, "u", extra.clone(), NOW);
        let c = k.verify(kind, &token, NOW).expect("valid");
        assert_eq!(
            (c.sid, c.jti, c.did, c.mfa),
            (extra.sid, extra.jti, extra.did, extra.mfa)
        );
    }
}

#[test]
fn header_and_payload_layout() {
    let k = keys();
    let token = k.issue(TokenKind::Temp, "u", minimal_extra(TokenKind::Temp), NOW);
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3);
    assert_eq!(decode_part(parts[0]), json!({"typ": "JWT", "alg": "HS256"}));
    // None claims are omitted, not null.
    assert_eq!(
        decode_part(parts[1]),
        json!({"sub": "u", "jti": "j", "typ": "temp", "iss": ISS, "aud": AUD,
               "iat": NOW, "exp": NOW + 300})
    );
    // The hand-built signer agrees with jsonwebtoken's output.
    let again = sign_raw(
        &decode_part(parts[0]),
        &decode_part(parts[1]),
        secret(TokenKind::Temp),
    );
    assert_eq!(
        k.verify(TokenKind::Temp, &again, NOW),
        k.verify(TokenKind::Temp, &token, NOW)
    );
}

#[test]
fn missing_required_claims_per_kind() {
    let k = keys();
    let required: [(TokenKind, &[&str]); 4] = [
        (TokenKind::Access, &["sid", "mfa"]),
        (TokenKind::Refresh, &["sid", "jti"]),
        (TokenKind::Temp, &["jti"]),
        (TokenKind::Device, &["did"]),
    ];
    for (kind, names) in required {
        let token = k.issue(kind, "u", Extra::default(), NOW);
        assert_eq!(k.verify(kind, &token, NOW), Err(TokenError::MissingClaim));
        for name in names {
            let mut extra = full_extra();
            match *name {
                "sid" => extra.sid = None,
                "jti" => extra.jti = None,
                "did" => extra.did = None,
                "mfa" => extra.mfa = None,
                _ => unreachable!(),
            }
            let token = k.issue(kind, "u", extra, NOW);
            assert_eq!(
                k.verify(kind, &token, NOW),
                Err(TokenError::MissingClaim),
                "{kind:?} without {name}"
            );
        }
    }
    // Null counts as missing.
    let mut p = access_payload();
    p["sid"] = Value::Null;
    let t = sign_raw(&hs256_header(), &p, secret(TokenKind::Access));
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::MissingClaim)
    );
}

#[test]
fn missing_or_mistyped_standard_claims() {
    let k = keys();
    let s = secret(TokenKind::Access);
    let sanity = sign_raw(&hs256_header(), &access_payload(), s);
    assert!(k.verify(TokenKind::Access, &sanity, NOW).is_ok());
    for name in ["sub", "typ", "iss", "aud", "iat", "exp"] {
        let mut p = access_payload();
        p.as_object_mut().expect("object").remove(name);
        let t = sign_raw(&hs256_header(), &p, s);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::MissingClaim),
            "without {name}"
        );
    }
    let mistyped = [
        ("sub", json!(5)),
        ("typ", json!(["access"])),
        ("exp", json!("1700000900")),
        ("exp", json!(-1)),
        ("exp", json!(1.7e9)),
        ("iat", json!("now")),
        ("nbf", json!("later")),
        ("sid", json!(7)),
        ("mfa", json!("yes")),
        ("jti", json!({})),
        ("amr", json!("pwd")),
        ("amr", json!(["pwd", 1])),
    ];
    for (name, value) in mistyped {
        let mut p = access_payload();
        p[name] = value.clone();
        let t = sign_raw(&hs256_header(), &p, s);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Malformed),
            "{name} = {value}"
        );
    }
    // A signed payload that is not a JSON object.
    for payload in [json!([1, 2]), json!("x"), json!(null)] {
        let t = sign_raw(&hs256_header(), &payload, s);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Malformed)
        );
    }
    // A signed payload that is not JSON at all.
    let msg = format!(
        "{}.{}",
        b64(hs256_header().to_string().as_bytes()),
        b64(b"not json")
    );
    let t = format!("{msg}.{}", b64(&hmac_sha256(s, msg.as_bytes())));
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::Malformed)
    );
}

/// Both parts must be UTF-8 throughout, in the members the checks
/// ignore too (serde_json does not check the strings it skips).
#[test]
fn invalid_utf8_in_an_ignored_member_is_malformed() {
    let k = keys();
    let s = secret(TokenKind::Access);
    let payload = access_payload().to_string();
    let header = br#"{"alg":"HS256","typ":"JWT"}"#.to_vec();
    let bad_header = b"{\"alg\":\"HS256\",\"x\":\"JW\xd4\"}".to_vec();
    let mut bad_payload = payload.clone().into_bytes();
    bad_payload.pop();
    bad_payload.extend_from_slice(b",\"note\":\"\xff\"}");
    let signed = |h: &[u8], p: &[u8]| {
        let msg = format!("{}.{}", b64(h), b64(p));
        format!("{msg}.{}", b64(&hmac_sha256(s, msg.as_bytes())))
    };
    assert!(k
        .verify(TokenKind::Access, &signed(&header, payload.as_bytes()), NOW)
        .is_ok());
    for t in [
        signed(&bad_header, payload.as_bytes()),
        signed(&header, &bad_payload),
    ] {
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Malformed)
        );
    }
}

#[test]
fn each_kind_rejected_as_every_other_kind() {
    let distinct = keys();
    let same = same_secret_keys();
    for issued in ALL {
        for checked in ALL {
            let t1 = distinct.issue(issued, "u", full_extra(), NOW);
            let t2 = same.issue(issued, "u", full_extra(), NOW);
            if issued == checked {
                assert!(distinct.verify(checked, &t1, NOW).is_ok());
                assert!(same.verify(checked, &t2, NOW).is_ok());
            } else {
                assert_eq!(
                    distinct.verify(checked, &t1, NOW),
                    Err(TokenError::BadSignature),
                    "{issued:?} as {checked:?}, distinct secrets"
                );
                assert_eq!(
                    same.verify(checked, &t2, NOW),
                    Err(TokenError::WrongType),
                    "{issued:?} as {checked:?}, same secret"
                );
            }
        }
    }
}

#[test]
fn alg_none_rejected() {
    let k = keys();
    let payload = b64(access_payload().to_string().as_bytes());
    for alg in ["none", "None", "NONE", "nOnE", ""] {
        let header = b64(json!({"alg": alg, "typ": "JWT"}).to_string().as_bytes());
        let unsigned = format!("{header}.{payload}.");
        assert_eq!(
            k.verify(TokenKind::Access, &unsigned, NOW),
            Err(TokenError::Algorithm),
            "alg {alg:?}"
        );
        // Even with a valid HS256 tag over the same bytes.
        let msg = format!("{header}.{payload}");
        let sig = b64(&hmac_sha256(secret(TokenKind::Access), msg.as_bytes()));
        assert_eq!(
            k.verify(TokenKind::Access, &format!("{msg}.{sig}"), NOW),
            Err(TokenError::Algorithm)
        );
    }
    // The exact classic form: {"alg":"none","typ":"JWT"}, payload, empty signature.
    let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let t = format!("{header}.{payload}.");
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::Algorithm)
    );
    let v = Verifier::new(
        TokenKind::Access,
        &[secret(TokenKind::Access).to_vec()],
        ISS,
        AUD,
        60,
    );
    assert_eq!(v.verify(&t, NOW), Err(TokenError::Algorithm));
}

#[test]
fn other_hmac_algorithms_rejected() {
    let k = keys();
    let claims: Claims = serde_json::from_value(access_payload()).expect("claims");
    for alg in [Algorithm::HS384, Algorithm::HS512] {
        let t = jsonwebtoken::encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret(TokenKind::Access)),
        )
        .expect("encode");
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Algorithm),
            "{alg:?}"
        );
    }
    // And the same claims under HS256 do verify.
    let t = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret(TokenKind::Access)),
    )
    .expect("encode");
    assert_eq!(k.verify(TokenKind::Access, &t, NOW), Ok(claims));
}

#[test]
fn other_alg_labels_rejected() {
    let k = keys();
    let s = secret(TokenKind::Access);
    let headers = [
        json!({"alg": "RS256", "typ": "JWT"}),
        json!({"alg": "ES256", "typ": "JWT"}),
        json!({"alg": "PS256", "typ": "JWT"}),
        json!({"alg": "EdDSA", "typ": "JWT"}),
        json!({"alg": "hs256", "typ": "JWT"}),
        json!({"alg": "HS256 ", "typ": "JWT"}),
        json!({"alg": ["HS256"], "typ": "JWT"}),
        json!({"alg": 256, "typ": "JWT"}),
        json!({"alg": null, "typ": "JWT"}),
        json!({"typ": "JWT"}),
    ];
    for h in headers {
        let t = sign_raw(&h, &access_payload(), s);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Algorithm),
            "{h}"
        );
    }
}

#[test]
fn key_bearing_headers_rejected() {
    let k = keys();
    let s = secret(TokenKind::Access);
    // Sanity: hand-signed plain HS256 and a bare kid are accepted.
    for h in [
        hs256_header(),
        json!({"alg": "HS256", "kid": "k1"}),
        json!({"alg": "HS256"}),
    ] {
        let t = sign_raw(&h, &access_payload(), s);
        assert!(k.verify(TokenKind::Access, &t, NOW).is_ok(), "{h}");
    }
    let headers = [
        json!({"alg": "HS256", "typ": "JWT", "jku": "https://evil.test/jwks.json"}),
        json!({"alg": "HS256", "typ": "JWT", "x5u": "https://evil.test/cert.pem"}),
        json!({"alg": "HS256", "typ": "JWT", "jwk": {"kty": "oct", "k": "c2VjcmV0"}}),
        json!({"alg": "HS256", "typ": "JWT", "x5c": ["MIIB"]}),
        json!({"alg": "HS256", "typ": "JWT", "crit": ["exp"]}),
        json!({"alg": "HS256", "typ": "JWT", "kid": "k1", "jku": "https://evil.test/k"}),
        json!({"alg": "HS256", "typ": "JWT", "jku": null}),
        json!({"alg": "HS256", "crit": []}),
    ];
    for h in headers {
        let t = sign_raw(&h, &access_payload(), s);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Algorithm),
            "{h}"
        );
    }
    // Duplicate alg members: refused whichever comes last.
    let payload = b64(access_payload().to_string().as_bytes());
    for raw in [
        r#"{"alg":"none","alg":"HS256"}"#,
        r#"{"alg":"HS256","alg":"none"}"#,
    ] {
        let msg = format!("{}.{payload}", b64(raw.as_bytes()));
        let t = format!("{msg}.{}", b64(&hmac_sha256(s, msg.as_bytes())));
        assert!(k.verify(TokenKind::Access, &t, NOW).is_err(), "{raw}");
    }
}

#[test]
fn expiry_edges() {
    let k = keys();
    for kind in ALL {
        let t = k.issue(kind, "u", full_extra(), NOW);
        let exp = NOW + kind.lifetime_secs();
        assert!(k.verify(kind, &t, exp - 1).is_ok());
        assert_eq!(k.verify(kind, &t, exp), Err(TokenError::Expired));
        assert_eq!(k.verify(kind, &t, exp + 1), Err(TokenError::Expired));
        assert_eq!(k.verify(kind, &t, u64::MAX), Err(TokenError::Expired));
        // Before iat is not an error (only nbf says "not before").
        assert!(k.verify(kind, &t, 0).is_ok());
    }
}

#[test]
fn not_before() {
    let k = keys();
    let mut p = access_payload();
    p["nbf"] = json!(NOW + 10);
    let t = sign_raw(&hs256_header(), &p, secret(TokenKind::Access));
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::NotYetValid)
    );
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW + 9),
        Err(TokenError::NotYetValid)
    );
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW + 10).map(|c| c.nbf),
        Ok(Some(NOW + 10))
    );
    // Expiry wins when both fail (exp is checked first).
    p["nbf"] = json!(NOW + 10_000);
    let t = sign_raw(&hs256_header(), &p, secret(TokenKind::Access));
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW + 900),
        Err(TokenError::Expired)
    );
}

#[test]
fn wrong_issuer_or_audience() {
    let s = b"shared";
    let good = TokenKeys::new(s, s, s, s, ISS, AUD);
    let other_iss = TokenKeys::new(s, s, s, s, "https://evil.test", AUD);
    let other_aud = TokenKeys::new(s, s, s, s, ISS, "other-api");
    for kind in ALL {
        let t = good.issue(kind, "u", full_extra(), NOW);
        assert!(good.verify(kind, &t, NOW).is_ok());
        assert_eq!(
            other_iss.verify(kind, &t, NOW),
            Err(TokenError::WrongIssuer)
        );
        assert_eq!(
            other_aud.verify(kind, &t, NOW),
            Err(TokenError::WrongAudience)
        );
    }
    let k = keys();
    let sa = secret(TokenKind::Access);
    let cases = [
        ("aud", json!([AUD]), TokenError::WrongAudience),
        ("aud", json!([AUD, "other"]), TokenError::WrongAudience),
        ("aud", json!(format!("{AUD} ")), TokenError::WrongAudience),
        ("aud", json!("TFA-API"), TokenError::WrongAudience),
        ("aud", json!(1), TokenError::WrongAudience),
        ("iss", json!([ISS]), TokenError::WrongIssuer),
        ("iss", json!(""), TokenError::WrongIssuer),
        ("iss", json!({"iss": ISS}), TokenError::WrongIssuer),
    ];
    for (name, value, want) in cases {
        let mut p = access_payload();
        p[name] = value.clone();
        let t = sign_raw(&hs256_header(), &p, sa);
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(want),
            "{name} = {value}"
        );
    }
}

#[test]
fn tampering_detected() {
    let k = keys();
    let kind = TokenKind::Access;
    let t = k.issue(kind, "user-1", full_extra(), NOW);
    let (msg, sig) = t.rsplit_once('.').expect("three parts");
    assert_eq!(sig.len(), 43);
    // Truncated signature, extra character, empty signature.
    for bad_sig in [
        &sig[..42],
        &sig[..1],
        "",
        &format!("{sig}A"),
        &format!("{sig}AAAA"),
    ] {
        let tt = format!("{msg}.{bad_sig}");
        assert_eq!(
            k.verify(kind, &tt, NOW),
            Err(TokenError::BadSignature),
            "{bad_sig}"
        );
    }
    // Every character of the signature replaced.
    for i in 0..sig.len() {
        let mut b = sig.as_bytes().to_vec();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        let tt = format!("{msg}.{}", String::from_utf8(b).expect("ascii"));
        assert_eq!(
            k.verify(kind, &tt, NOW),
            Err(TokenError::BadSignature),
            "sig char {i}"
        );
    }
    // Every character of the payload flipped.
    let (header, payload) = msg.split_once('.').expect("header.payload");
    for i in 0..payload.len() {
        let mut b = payload.as_bytes().to_vec();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        let tt = format!("{header}.{}.{sig}", String::from_utf8(b).expect("ascii"));
        assert_eq!(
            k.verify(kind, &tt, NOW),
            Err(TokenError::BadSignature),
            "payload {i}"
        );
    }
    // Every character of the header flipped: never accepted.
    for i in 0..header.len() {
        let mut b = header.as_bytes().to_vec();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        let tt = format!("{}.{payload}.{sig}", String::from_utf8(b).expect("ascii"));
        let r = k.verify(kind, &tt, NOW);
        assert!(
            matches!(
                r,
                Err(TokenError::Malformed | TokenError::Algorithm | TokenError::BadSignature)
            ),
            "header {i}: {r:?}"
        );
    }
    // Payload swapped for another valid token's payload.
    let other = k.issue(kind, "user-2", full_extra(), NOW);
    let other_payload = other.split('.').nth(1).expect("payload");
    let tt = format!("{header}.{other_payload}.{sig}");
    assert_eq!(k.verify(kind, &tt, NOW), Err(TokenError::BadSignature));
    // Padding or standard-alphabet signature.
    let tt = format!("{t}=");
    assert_eq!(k.verify(kind, &tt, NOW), Err(TokenError::BadSignature));
}

#[test]
fn duplicate_members_and_mistyped_header_params_refused() {
    let k = keys();
    let s = secret(TokenKind::Access);
    let header = b64(hs256_header().to_string().as_bytes());
    let sign = |msg: String| format!("{msg}.{}", b64(&hmac_sha256(s, msg.as_bytes())));
    // A claim given twice is refused, whichever value comes last.
    let p = access_payload();
    let body = p.to_string();
    for dup in [r#""sub":"other","#, r#""mfa":false,"#, r#""exp":1,"#] {
        let raw = body.replacen('{', &format!("{{{dup}"), 1);
        let t = sign(format!("{header}.{}", b64(raw.as_bytes())));
        assert_eq!(
            k.verify(TokenKind::Access, &t, NOW),
            Err(TokenError::Malformed),
            "{raw}"
        );
    }
    // typ, cty and kid must be strings when present; other members are
    // ignored, and escaped strings are read like plain ones.
    let payload = b64(body.as_bytes());
    for (h, ok) in [
        (r#"{"alg":"HS256","typ":5}"#, false),
        (r#"{"alg":"HS256","cty":[]}"#, false),
        (r#"{"alg":"HS256","kid":{}}"#, false),
        (r#"{"alg":"HS256","typ":null,"x-other":[1,{"a":2}]}"#, true),
        (r#"{"alg":"HS\u0032\u0035\u0036","typ":"J\nWT"}"#, true),
        (r#" {"alg":"HS256"}"#, true),
        (r#"["HS256"]"#, false),
    ] {
        let t = sign(format!("{}.{payload}", b64(h.as_bytes())));
        assert_eq!(k.verify(TokenKind::Access, &t, NOW).is_ok(), ok, "{h}");
    }
    // A payload that is an array is refused even if serde could read
    // the claims from it by position.
    let arr = b64(br#"["u","sess-1",null,null,true,"access"]"#);
    let t = sign(format!("{header}.{arr}"));
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::Malformed)
    );
}

#[test]
fn garbage_never_panics() {
    let k = keys();
    let v = Verifier::new(TokenKind::Access, &[b"x".to_vec()], ISS, AUD, 30);
    let exact = [
        ("", TokenError::Malformed),
        ("a", TokenError::Malformed),
        ("a.b", TokenError::Malformed),
        ("a.b.c.d", TokenError::Malformed),
        ("..", TokenError::Malformed),
        ("...", TokenError::Malformed),
        ("a.b.c", TokenError::Malformed),
        ("!!!.???.***", TokenError::Malformed),
        ("eyJ.eyJ.sig", TokenError::Malformed),
        ("e30.e30.", TokenError::Algorithm),
        ("W10.e30.", TokenError::Malformed),
    ];
    for (t, want) in exact {
        assert_eq!(k.verify(TokenKind::Access, t, NOW), Err(want), "{t:?}");
        assert_eq!(v.verify(t, NOW), Err(want), "{t:?}");
    }
    let header = b64(hs256_header().to_string().as_bytes());
    let fuzzy = [
        format!("{header}.."),
        format!("{header}.e30."),
        format!("{header}.e30.!!"),
        format!("{header}.%%%.{}", "A".repeat(43)),
        format!("{header}.e30.{}", "A".repeat(43)),
        format!(" {header}.e30.{}", "A".repeat(43)),
        "\u{0}.\u{0}.\u{0}".to_string(),
        "é.é.é".to_string(),
        ".".repeat(10_000),
        "A".repeat(10_000),
    ];
    for t in &fuzzy {
        let r = k.verify(TokenKind::Access, t, NOW);
        assert!(
            matches!(r, Err(TokenError::Malformed | TokenError::BadSignature)),
            "{t:?}: {r:?}"
        );
        let r = v.verify(t, NOW);
        assert!(matches!(
            r,
            Err(TokenError::Malformed | TokenError::BadSignature)
        ));
    }
}

#[test]
fn verifier_rotation() {
    let old = b"old secret".to_vec();
    let new = b"new secret".to_vec();
    let by_old = TokenKeys::new(&old, &old, &old, &old, ISS, AUD);
    let by_new = TokenKeys::new(&new, &new, &new, &new, ISS, AUD);
    let by_other = TokenKeys::new(b"other", b"other", b"other", b"other", ISS, AUD);
    for kind in ALL {
        let v = Verifier::new(kind, &[new.clone(), old.clone()], ISS, AUD, 0);
        let t_old = by_old.issue(kind, "u", full_extra(), NOW);
        let t_new = by_new.issue(kind, "u", full_extra(), NOW);
        let t_other = by_other.issue(kind, "u", full_extra(), NOW);
        assert_eq!(v.verify(&t_old, NOW), by_old.verify(kind, &t_old, NOW));
        assert!(v.verify(&t_old, NOW).is_ok());
        assert!(v.verify(&t_new, NOW).is_ok());
        assert_eq!(v.verify(&t_other, NOW), Err(TokenError::BadSignature));
        // Only the new secret: the old tokens stop verifying.
        let v_new = Verifier::new(kind, std::slice::from_ref(&new), ISS, AUD, 0);
        assert_eq!(v_new.verify(&t_old, NOW), Err(TokenError::BadSignature));
        // No secrets at all.
        let none = Verifier::new(kind, &[], ISS, AUD, 0);
        assert_eq!(none.verify(&t_new, NOW), Err(TokenError::BadSignature));
    }
}

#[test]
fn verifier_same_checks_as_token_keys() {
    let k = same_secret_keys();
    let s = b"one secret for all four kinds!!!".to_vec();
    let v = Verifier::new(TokenKind::Access, std::slice::from_ref(&s), ISS, AUD, 0);
    // typ.
    let refresh = k.issue(TokenKind::Refresh, "u", full_extra(), NOW);
    assert_eq!(v.verify(&refresh, NOW), Err(TokenError::WrongType));
    // iss / aud.
    let v_iss = Verifier::new(TokenKind::Access, std::slice::from_ref(&s), "x", AUD, 0);
    let v_aud = Verifier::new(TokenKind::Access, std::slice::from_ref(&s), ISS, "x", 0);
    let access = k.issue(TokenKind::Access, "u", full_extra(), NOW);
    assert_eq!(v_iss.verify(&access, NOW), Err(TokenError::WrongIssuer));
    assert_eq!(v_aud.verify(&access, NOW), Err(TokenError::WrongAudience));
    // Required claims.
    let bare = k.issue(TokenKind::Access, "u", Extra::default(), NOW);
    assert_eq!(v.verify(&bare, NOW), Err(TokenError::MissingClaim));
    // Header checks.
    let t = sign_raw(&json!({"alg": "HS256", "jku": "x"}), &access_payload(), &s);
    assert_eq!(v.verify(&t, NOW), Err(TokenError::Algorithm));
    let claims: Claims = serde_json::from_value(access_payload()).expect("claims");
    let t = jsonwebtoken::encode(
        &Header::new(Algorithm::HS512),
        &claims,
        &EncodingKey::from_secret(&s),
    )
    .expect("encode");
    assert_eq!(v.verify(&t, NOW), Err(TokenError::Algorithm));
    // Agreement on a valid token.
    assert_eq!(
        v.verify(&access, NOW),
        k.verify(TokenKind::Access, &access, NOW)
    );
}

#[test]
fn verifier_leeway_edges() {
    let leeway = 30;
    let k = keys();
    let v = Verifier::new(
        TokenKind::Access,
        &[secret(TokenKind::Access).to_vec()],
        ISS,
        AUD,
        leeway,
    );
    let t = k.issue(TokenKind::Access, "u", full_extra(), NOW);
    let exp = NOW + 900;
    assert!(v.verify(&t, exp).is_ok());
    assert!(v.verify(&t, exp + leeway - 1).is_ok());
    assert_eq!(v.verify(&t, exp + leeway), Err(TokenError::Expired));
    // TokenKeys has no leeway.
    assert_eq!(
        k.verify(TokenKind::Access, &t, exp),
        Err(TokenError::Expired)
    );

    // nbf: valid once now + leeway >= nbf.
    let nbf = NOW + 100;
    let mut p = access_payload();
    p["nbf"] = json!(nbf);
    let t = sign_raw(&hs256_header(), &p, secret(TokenKind::Access));
    assert!(v.verify(&t, nbf - leeway).is_ok());
    assert_eq!(v.verify(&t, nbf - leeway - 1), Err(TokenError::NotYetValid));
    assert_eq!(
        k.verify(TokenKind::Access, &t, nbf - 1),
        Err(TokenError::NotYetValid)
    );
    assert!(k.verify(TokenKind::Access, &t, nbf).is_ok());
}

#[test]
fn extreme_times_do_not_overflow() {
    let k = keys();
    // exp would pass u64::MAX: clamped.
    let t = k.issue(TokenKind::Device, "u", full_extra(), u64::MAX - 5);
    let c = k
        .verify(TokenKind::Device, &t, u64::MAX - 5)
        .expect("valid");
    assert_eq!((c.iat, c.exp), (u64::MAX - 5, u64::MAX));
    assert_eq!(
        k.verify(TokenKind::Device, &t, u64::MAX),
        Err(TokenError::Expired)
    );
    // Huge leeway: exp + leeway and now + leeway overflow without panicking.
    let v = Verifier::new(
        TokenKind::Device,
        &[secret(TokenKind::Device).to_vec()],
        ISS,
        AUD,
        u64::MAX,
    );
    assert!(v.verify(&t, u64::MAX).is_ok());
    let mut p = access_payload();
    p["nbf"] = json!(u64::MAX);
    p["exp"] = json!(u64::MAX);
    let t = sign_raw(&hs256_header(), &p, secret(TokenKind::Access));
    let v = Verifier::new(
        TokenKind::Access,
        &[secret(TokenKind::Access).to_vec()],
        ISS,
        AUD,
        u64::MAX,
    );
    assert!(v.verify(&t, 1).is_ok());
    assert_eq!(
        k.verify(TokenKind::Access, &t, 1),
        Err(TokenError::NotYetValid)
    );
    // A time claim beyond u64 is malformed.
    let raw = access_payload().to_string().replace(
        &format!("\"exp\":{}", NOW + 900),
        "\"exp\":18446744073709551616",
    );
    assert!(raw.contains("18446744073709551616"));
    let msg = format!(
        "{}.{}",
        b64(hs256_header().to_string().as_bytes()),
        b64(raw.as_bytes())
    );
    let t = format!(
        "{msg}.{}",
        b64(&hmac_sha256(secret(TokenKind::Access), msg.as_bytes()))
    );
    assert_eq!(
        k.verify(TokenKind::Access, &t, NOW),
        Err(TokenError::Malformed)
    );
}

#[test]
fn empty_and_unicode_inputs() {
    let k = TokenKeys::new(b"", b"", b"", b"", "", "");
    let extra = Extra {
        sid: Some("séance 🎟".into()),
        mfa: Some(true),
        ..Extra::default()
    };
    let t = k.issue(TokenKind::Access, "", extra, 0);
    let c = k.verify(TokenKind::Access, &t, 0).expect("valid");
    assert_eq!((c.sub.as_str(), c.sid.as_deref()), ("", Some("séance 🎟")));
}

proptest! {
    #[test]
    fn prop_issue_verify_round_trip(
        sub in "\\PC{0,40}",
        sid in "\\PC{0,40}",
        mfa in any::<bool>(),
        now in 0u64..=u64::MAX / 2,
    ) {
        let k = keys();
        let extra = Extra { sid: Some(sid.clone()), mfa: Some(mfa), ..Extra::default() };
        let t = k.issue(TokenKind::Access, &sub, extra, now);
        let c = k.verify(TokenKind::Access, &t, now).expect("valid");
        prop_assert_eq!(&c.sub, &sub);
        prop_assert_eq!(c.sid.as_deref(), Some(sid.as_str()));
        prop_assert_eq!(c.mfa, Some(mfa));
        prop_assert_eq!((c.iat, c.exp), (now, now + 900));
        prop_assert_eq!(k.verify(TokenKind::Access, &t, now + 900), Err(TokenError::Expired));
        prop_assert_eq!(k.verify(TokenKind::Refresh, &t, now), Err(TokenError::BadSignature));
    }

    #[test]
    fn prop_verify_never_panics(token in "[A-Za-z0-9_.=-]{0,120}|\\PC{0,60}") {
        let k = keys();
        for kind in ALL {
            prop_assert!(k.verify(kind, &token, NOW).is_err());
        }
    }
}
