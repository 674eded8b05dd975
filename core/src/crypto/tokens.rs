//! JSON Web Tokens of the four kinds the service hands out (access, refresh,
//! temporary and device tokens): issuing them and verifying them, HS256
//! only, with `jsonwebtoken`.
//!
//! Each kind has its own secret and its own `typ` claim, so a token of one
//! kind is never accepted as another. [`TokenKeys`] issues and verifies all
//! four for the service; [`Verifier`] verifies one kind for a gateway, with
//! several secrets (key rotation) and a clock-skew leeway. Both share one
//! verification routine.
//!
//! Verification is strict: the header's `alg` must be exactly `HS256`;
//! headers naming a key or requiring extensions (`jku`, `jwk`, `x5u`, `x5c`,
//! `crit`) are refused; `iss` and `aud` must be exactly the configured
//! strings (an `aud` array is refused even if it contains the audience);
//! `exp` and `nbf` are checked against the `now_secs` argument.
//!
//! What this module does not do: it never reads the clock (jsonwebtoken's own
//! `exp`/`nbf` checks, which would, are switched off), keeps no revocation
//! list and no session state (`sid`/`jti` are checked against the store by
//! callers), and supports no algorithm but HS256.
//!
//! Building a [`TokenKeys`] or a [`Verifier`] installs jsonwebtoken's
//! RustCrypto provider as its process-wide default if no provider has been
//! installed yet, so that token operations cannot panic for want of one. A
//! host that wants another provider installs it before building either.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Map, Value};

/// Header parameters that make a token name its own key or demand
/// extensions: a token carrying any of them is refused.
const FORBIDDEN_HEADER_PARAMS: [&str; 5] = ["jku", "jwk", "x5u", "x5c", "crit"];

/// Length in bytes of an HS256 signature.
const HS256_LEN: usize = 32;

/// The kind of a token; each has its own secret, `typ` claim and lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Short-lived bearer token for API calls.
    Access,
    /// Long-lived token exchanged for new access tokens.
    Refresh,
    /// Token between the password step and the second factor.
    Temp,
    /// Token of a remembered ("trusted") device.
    Device,
}

impl TokenKind {
    /// "access" | "refresh" | "temp" | "device"
    ///
    /// The value of the `typ` claim of tokens of this kind.
    pub fn typ(self) -> &'static str {
        match self {
            TokenKind::Access => "access",
            TokenKind::Refresh => "refresh",
            TokenKind::Temp => "temp",
            TokenKind::Device => "device",
        }
    }

    /// 900, 604800, 300, 2592000
    ///
    /// Seconds from issue to expiry: 15 minutes, 7 days, 5 minutes, 30 days.
    pub fn lifetime_secs(self) -> u64 {
        match self {
            TokenKind::Access => 900,
            TokenKind::Refresh => 604_800,
            TokenKind::Temp => 300,
            TokenKind::Device => 2_592_000,
        }
    }
}

/// Claims of all four kinds; unused ones are None and omitted from the JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Claims {
    /// Subject: the user id.
    pub sub: String,
    /// Session id (access and refresh tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<String>,
    /// Token id (refresh and temporary tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// Device id (device tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub did: Option<String>,
    /// Whether the second factor was passed (access tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfa: Option<bool>,
    /// How the user signed in (access tokens; RFC 8176 values such as
    /// `pwd`, `otp`, `sms`, `mail`, `hwk`, `swk`, `user`, `mfa`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amr: Option<Vec<String>>,
    /// Token kind, as [`TokenKind::typ`].
    pub typ: String,
    /// Issuer.
    pub iss: String,
    /// Audience: a single string, never an array.
    pub aud: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expiry, Unix seconds: valid while `now < exp`.
    pub exp: u64,
    /// Not before, Unix seconds: valid once `now >= nbf`. Never set by
    /// [`TokenKeys::issue`]; honoured when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}

/// What goes into a new token besides sub/typ/iss/aud/iat/exp.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    /// Session id; required in access and refresh tokens.
    pub sid: Option<String>,
    /// Token id; required in refresh and temporary tokens.
    pub jti: Option<String>,
    /// Device id; required in device tokens.
    pub did: Option<String>,
    /// Second factor passed; required in access tokens.
    pub mfa: Option<bool>,
    /// Authentication methods (access tokens), RFC 8176.
    pub amr: Option<Vec<String>>,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Not three dot-separated parts, a header or payload that is not
    /// base64url-encoded JSON, or a claim of the wrong JSON type.
    Malformed,
    /// The header's `alg` is not exactly `HS256`, or the header carries a
    /// refused parameter (`jku`, `jwk`, `x5u`, `x5c`, `crit`).
    Algorithm,
    /// The signature is not a valid HS256 tag of the token under (any of)
    /// the secret(s).
    BadSignature,
    /// `now` is at or past `exp` (plus leeway).
    Expired,
    /// `now` (plus leeway) is before `nbf`.
    NotYetValid,
    /// The `typ` claim is not the expected kind's.
    WrongType,
    /// The `iss` claim is not exactly the configured issuer.
    WrongIssuer,
    /// The `aud` claim is not exactly the configured audience.
    WrongAudience,
    /// A claim required for every token (`sub`, `typ`, `iss`, `aud`, `iat`,
    /// `exp`) or for this kind (see [`TokenKeys::verify`]) is missing or null.
    MissingClaim,
}

/// The signing and verifying key of one kind.
#[derive(Clone)]
struct KindKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl KindKeys {
    fn new(secret: &[u8]) -> Self {
        KindKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
        }
    }
}

/// Signs and verifies the four kinds, each with its own secret.
#[derive(Clone)]
pub struct TokenKeys {
    access: KindKeys,
    refresh: KindKeys,
    temp: KindKeys,
    device: KindKeys,
    issuer: String,
    audience: String,
}

impl TokenKeys {
    /// Keys for the four kinds, and the `iss` and `aud` every token carries.
    pub fn new(
        access: &[u8],
        refresh: &[u8],
        temp: &[u8],
        device: &[u8],
        issuer: &str,
        audience: &str,
    ) -> Self {
        ensure_crypto_provider();
        TokenKeys {
            access: KindKeys::new(access),
            refresh: KindKeys::new(refresh),
            temp: KindKeys::new(temp),
            device: KindKeys::new(device),
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        }
    }

    fn keys(&self, kind: TokenKind) -> &KindKeys {
        match kind {
            TokenKind::Access => &self.access,
            TokenKind::Refresh => &self.refresh,
            TokenKind::Temp => &self.temp,
            TokenKind::Device => &self.device,
        }
    }

    /// HS256 token of `kind` for `sub`, iat = now, exp = now + kind.lifetime_secs(). Panics never; returns String.
    ///
    /// The claims of `extra` are written as given (absent ones are omitted);
    /// no `nbf` is set. An `exp` past `u64::MAX` is clamped to `u64::MAX`.
    /// HS256 signing with an HMAC key cannot fail; were jsonwebtoken ever to
    /// report an error anyway, the result would be the empty string, which
    /// no verifier accepts.
    pub fn issue(&self, kind: TokenKind, sub: &str, extra: Extra, now_secs: u64) -> String {
        let claims = Claims {
            sub: sub.to_owned(),
            sid: extra.sid,
            jti: extra.jti,
            did: extra.did,
            mfa: extra.mfa,
            amr: extra.amr,
            typ: kind.typ().to_owned(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            iat: now_secs,
            // Saturating: an `exp` past `u64::MAX` is clamped, never wrapped.
            exp: now_secs.saturating_add(kind.lifetime_secs()),
            nbf: None,
        };
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &self.keys(kind).encoding,
        )
        .unwrap_or_default()
    }

    /// The claims of `token` if it is a valid token of `kind` at `now_secs`.
    ///
    /// Checks, in this order, returning the first failure:
    ///
    /// 1. three base64url parts with a JSON-object header, else
    ///    [`Malformed`](TokenError::Malformed);
    /// 2. header `alg` exactly `"HS256"` (`none`, `HS384`, `HS512`, `RS256`,
    ///    … are refused) and no `jku`, `jwk`, `x5u`, `x5c` or `crit` header
    ///    parameter, else [`Algorithm`](TokenError::Algorithm); `kid` and
    ///    other parameters are ignored;
    /// 3. the HS256 signature under `kind`'s secret, else
    ///    [`BadSignature`](TokenError::BadSignature); then a JSON-object
    ///    payload, else `Malformed`;
    /// 4. `typ == kind.typ()`, else [`WrongType`](TokenError::WrongType);
    /// 5. `iss` exactly the issuer, else [`WrongIssuer`](TokenError::WrongIssuer);
    /// 6. `aud` exactly the audience string (an array, even one containing
    ///    it, is refused), else [`WrongAudience`](TokenError::WrongAudience);
    /// 7. `now < exp`, else [`Expired`](TokenError::Expired);
    /// 8. if `nbf` is present, `now >= nbf`, else
    ///    [`NotYetValid`](TokenError::NotYetValid);
    /// 9. the claims every token needs (`sub`, `typ`, `iss`, `aud`, `iat`,
    ///    `exp`; missing or null) and those of the kind — access: `sid` and
    ///    `mfa`; refresh: `sid` and `jti`; temp: `jti`; device: `did` — else
    ///    [`MissingClaim`](TokenError::MissingClaim).
    ///
    /// A missing common claim is reported when its step is reached (a token
    /// without `iss` gets `MissingClaim` at step 5); a claim of the wrong
    /// JSON type is `Malformed`. `iat` is required but not compared with
    /// `now`.
    pub fn verify(
        &self,
        kind: TokenKind,
        token: &str,
        now_secs: u64,
    ) -> Result<Claims, TokenError> {
        let policy = Policy {
            kind,
            issuer: &self.issuer,
            audience: &self.audience,
            leeway_secs: 0,
        };
        verify_token(
            token,
            std::slice::from_ref(&self.keys(kind).decoding),
            &policy,
            now_secs,
        )
    }
}

/// Verification for gateways (the Envoy filter): several secrets (rotation: accept if any verifies), a clock-skew leeway applied to exp and nbf (now < exp + leeway, now + leeway >= nbf), same header/typ/iss/aud checks.
#[derive(Clone)]
pub struct Verifier {
    kind: TokenKind,
    keys: Vec<DecodingKey>,
    issuer: String,
    audience: String,
    leeway_secs: u64,
}

impl Verifier {
    /// A verifier of `kind` tokens signed with any of `secrets`, issued by
    /// `issuer` for `audience`, allowing `leeway_secs` of clock skew. With no
    /// secrets every token is refused with [`TokenError::BadSignature`].
    pub fn new(
        kind: TokenKind,
        secrets: &[Vec<u8>],
        issuer: &str,
        audience: &str,
        leeway_secs: u64,
    ) -> Self {
        ensure_crypto_provider();
        Verifier {
            kind,
            keys: secrets
                .iter()
                .map(|s| DecodingKey::from_secret(s))
                .collect(),
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            leeway_secs,
        }
    }

    /// The claims of `token` if it passes every check of
    /// [`TokenKeys::verify`] for this verifier's kind, under any of its
    /// secrets, with the leeway applied to `exp` and `nbf`: valid while
    /// `now < exp + leeway` and once `now + leeway >= nbf` (a sum past
    /// `u64::MAX` counts as satisfied). Secrets are tried in order; a token
    /// that verifies under none is [`BadSignature`](TokenError::BadSignature).
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, TokenError> {
        let policy = Policy {
            kind: self.kind,
            issuer: &self.issuer,
            audience: &self.audience,
            leeway_secs: self.leeway_secs,
        };
        verify_token(token, &self.keys, &policy, now_secs)
    }
}

/// Installs core's HMAC-only provider ([`crate::crypto::jwt_hmac`]) as
/// jsonwebtoken's process default unless one is installed already (then
/// this does nothing).
fn ensure_crypto_provider() {
    // `Err` only means a provider is already installed: keep that one.
    let _ =
        jsonwebtoken::crypto::CryptoProvider::install_default(&crate::crypto::jwt_hmac::PROVIDER);
}

/// What a token must satisfy besides its signature.
struct Policy<'a> {
    kind: TokenKind,
    issuer: &'a str,
    audience: &'a str,
    leeway_secs: u64,
}

/// The one verification routine behind [`TokenKeys::verify`] and
/// [`Verifier::verify`].
fn verify_token(
    token: &str,
    keys: &[DecodingKey],
    policy: &Policy<'_>,
    now_secs: u64,
) -> Result<Claims, TokenError> {
    check_shape_and_header(token)?;

    // Signature only: every claim check below is ours, against `now_secs`.
    let mut validation = Validation::new(Algorithm::HS256);
    validation.algorithms = vec![Algorithm::HS256];
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.leeway = 0;

    let mut payload = None;
    for key in keys {
        match jsonwebtoken::decode::<Value>(token, key, &validation) {
            Ok(data) => {
                payload = Some(data.claims);
                break;
            }
            Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
            Err(e) => return Err(map_jwt_error(e.kind())),
        }
    }
    let payload = payload.ok_or(TokenError::BadSignature)?;
    check_claims(payload, policy, now_secs)
}

/// Structure and header checks, before any key is used: three parts, a
/// base64url JSON object header with `alg` exactly `"HS256"` and none of the
/// refused parameters, and a signature part that decodes to 32 bytes.
fn check_shape_and_header(token: &str) -> Result<(), TokenError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| TokenError::Malformed)?;
    let header: Map<String, Value> =
        serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
    if header.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err(TokenError::Algorithm);
    }
    if FORBIDDEN_HEADER_PARAMS
        .iter()
        .any(|p| header.contains_key(*p))
    {
        return Err(TokenError::Algorithm);
    }
    match URL_SAFE_NO_PAD.decode(signature) {
        Ok(sig) if sig.len() == HS256_LEN => Ok(()),
        _ => Err(TokenError::BadSignature),
    }
}

/// Maps a jsonwebtoken error (other than a bad signature, which the caller
/// handles) to ours.
fn map_jwt_error(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::InvalidAlgorithm
        | ErrorKind::MissingAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::UnsupportedAlgorithm => TokenError::Algorithm,
        _ => TokenError::Malformed,
    }
}

/// A required string claim: missing or null is `MissingClaim`, another JSON
/// type is `Malformed`.
fn string_claim<'a>(claims: &'a Map<String, Value>, name: &str) -> Result<&'a str, TokenError> {
    match claims.get(name) {
        None | Some(Value::Null) => Err(TokenError::MissingClaim),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(TokenError::Malformed),
    }
}

/// A time claim: `Ok(None)` if missing or null, `Malformed` unless a
/// non-negative integer that fits in `u64`.
fn time_claim(claims: &Map<String, Value>, name: &str) -> Result<Option<u64>, TokenError> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(TokenError::Malformed),
    }
}

/// The checks on a payload whose signature has been verified, in the order
/// [`TokenKeys::verify`] documents.
fn check_claims(payload: Value, policy: &Policy<'_>, now: u64) -> Result<Claims, TokenError> {
    let Value::Object(map) = payload else {
        return Err(TokenError::Malformed);
    };

    if string_claim(&map, "typ")? != policy.kind.typ() {
        return Err(TokenError::WrongType);
    }
    // `iss` and `aud` must be exactly the configured strings: an array (even
    // one holding the right value) or any other type is refused.
    match map.get("iss") {
        None | Some(Value::Null) => return Err(TokenError::MissingClaim),
        Some(Value::String(s)) if s == policy.issuer => {}
        Some(_) => return Err(TokenError::WrongIssuer),
    }
    match map.get("aud") {
        None | Some(Value::Null) => return Err(TokenError::MissingClaim),
        Some(Value::String(s)) if s == policy.audience => {}
        Some(_) => return Err(TokenError::WrongAudience),
    }

    let exp = time_claim(&map, "exp")?.ok_or(TokenError::MissingClaim)?;
    time_claim(&map, "iat")?.ok_or(TokenError::MissingClaim)?;
    let nbf = time_claim(&map, "nbf")?;

    // Valid while now < exp + leeway; past u64::MAX that always holds.
    if let Some(limit) = exp.checked_add(policy.leeway_secs) {
        if now >= limit {
            return Err(TokenError::Expired);
        }
    }
    // Valid once now + leeway >= nbf; past u64::MAX that always holds.
    if let (Some(nbf), Some(shifted)) = (nbf, now.checked_add(policy.leeway_secs)) {
        if shifted < nbf {
            return Err(TokenError::NotYetValid);
        }
    }

    string_claim(&map, "sub")?;
    let claims: Claims =
        serde_json::from_value(Value::Object(map)).map_err(|_| TokenError::Malformed)?;

    let complete = match policy.kind {
        TokenKind::Access => claims.sid.is_some() && claims.mfa.is_some(),
        TokenKind::Refresh => claims.sid.is_some() && claims.jti.is_some(),
        TokenKind::Temp => claims.jti.is_some(),
        TokenKind::Device => claims.did.is_some(),
    };
    if complete {
        Ok(claims)
    } else {
        Err(TokenError::MissingClaim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::signature::hmac_sha256;
    use proptest::prelude::*;
    use serde_json::json;

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

    /// A token with the given header and payload JSON, HS256-signed by hand.
    fn sign_raw(header: &Value, payload: &Value, secret: &[u8]) -> String {
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

    fn hs256_header() -> Value {
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
}
