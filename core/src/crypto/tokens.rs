//! JSON Web Tokens of the four kinds the service hands out (access, refresh,
//! temporary and device tokens): issuing them with `jsonwebtoken` and
//! verifying them, HS256 only.
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
//! `exp` and `nbf` are checked against the `now_secs` argument; a header
//! member or claim given twice is refused.
//!
//! Verification is done here rather than by `jsonwebtoken::decode`, which
//! parses the header twice and the payload twice and derives the HMAC key
//! anew for every token: the edge filter runs it on every request (issue
//! #15). Each part is decoded and parsed once, straight into the members the
//! checks read, and each secret's HMAC key schedule is computed once when
//! the keys are built; the tag is compared in constant time
//! (`Mac::verify_slice`). Issuing stays with `jsonwebtoken`, on core's
//! HMAC-only provider.
//!
//! What this module does not do: it never reads the clock, keeps no
//! revocation list and no session state (`sid`/`jti` are checked against
//! the store by callers), and supports no algorithm but HS256.
//!
//! Building a [`TokenKeys`] installs core's HMAC-only provider as
//! jsonwebtoken's process-wide default if no provider has been installed
//! yet, so that issuing cannot panic for want of one. A [`Verifier`] needs
//! no provider.

use std::borrow::Cow;
use std::cell::OnceCell;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use sha2::Sha256;

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

/// The signing and verifying key of one kind, each made from the secret
/// the first time it is needed: a request issues or verifies one or two
/// kinds, and every HMAC key schedule is two SHA-256 blocks.
#[derive(Clone)]
struct KindKeys {
    secret: Vec<u8>,
    encoding: OnceCell<EncodingKey>,
    mac: OnceCell<Hmac<Sha256>>,
}

impl KindKeys {
    fn new(secret: &[u8]) -> Self {
        KindKeys {
            secret: secret.to_vec(),
            encoding: OnceCell::new(),
            mac: OnceCell::new(),
        }
    }

    fn encoding(&self) -> &EncodingKey {
        self.encoding
            .get_or_init(|| EncodingKey::from_secret(&self.secret))
    }

    fn mac(&self) -> &Hmac<Sha256> {
        self.mac.get_or_init(|| mac_of(&self.secret))
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

    /// The secret of `kind`, as given to [`TokenKeys::new`] (the temp
    /// secret also keys the code hashes, `plumbing::secrets::Keys`).
    pub(crate) fn secret(&self, kind: TokenKind) -> &[u8] {
        &self.keys(kind).secret
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
            self.keys(kind).encoding(),
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
            std::slice::from_ref(self.keys(kind).mac()),
            &policy,
            now_secs,
        )
    }
}

/// Verification for gateways (the Envoy filter): several secrets (rotation: accept if any verifies), a clock-skew leeway applied to exp and nbf (now < exp + leeway, now + leeway >= nbf), same header/typ/iss/aud checks.
#[derive(Clone)]
pub struct Verifier {
    kind: TokenKind,
    keys: Vec<Hmac<Sha256>>,
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
        Verifier {
            kind,
            keys: secrets.iter().map(|s| mac_of(s)).collect(),
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

    /// The clock-skew leeway applied to `exp` and `nbf`.
    pub fn leeway_secs(&self) -> u64 {
        self.leeway_secs
    }
}

/// Installs core's HMAC-only provider ([`crate::crypto::jwt_hmac`]) as
/// jsonwebtoken's process default unless one is installed already (then
/// this does nothing). Only issuing needs it: verification below computes
/// the MAC itself, from a key schedule prepared once per secret.
fn ensure_crypto_provider() {
    // `Err` only means a provider is already installed: keep that one.
    let _ =
        jsonwebtoken::crypto::CryptoProvider::install_default(&crate::crypto::jwt_hmac::PROVIDER);
}

/// HMAC-SHA256 keyed with one secret: the inner and outer pads are hashed
/// once, here, and every verification starts from a copy of that state.
fn mac_of(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length: this cannot fail.
    <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| <Hmac<Sha256> as KeyInit>::new(&Default::default()))
}

/// What a token must satisfy besides its signature.
struct Policy<'a> {
    kind: TokenKind,
    issuer: &'a str,
    audience: &'a str,
    leeway_secs: u64,
}

/// The one verification routine behind [`TokenKeys::verify`] and
/// [`Verifier::verify`], so the API and the edge filter cannot disagree
/// about a token.
///
/// It decodes and parses each part once, straight into the claims it
/// checks (no intermediate JSON tree), and checks the tag with each key's
/// precomputed HMAC state in constant time (`Mac::verify_slice`).
/// jsonwebtoken's `decode` would parse the header twice and the payload
/// twice and derive the HMAC key anew for every token: in the edge filter,
/// which runs this on every request, that was most of its cost.
fn verify_token(
    token: &str,
    keys: &[Hmac<Sha256>],
    policy: &Policy<'_>,
    now_secs: u64,
) -> Result<Claims, TokenError> {
    let (message, payload, signature) = check_shape_and_header(token)?;
    if !keys.iter().any(|mac| {
        mac.clone()
            .chain_update(message.as_bytes())
            .verify_slice(&signature)
            .is_ok()
    }) {
        return Err(TokenError::BadSignature);
    }
    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| TokenError::Malformed)?;
    if !is_json_object(&payload) {
        return Err(TokenError::Malformed);
    }
    check_utf8(&payload)?;
    let raw: RawClaims<'_> = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    check_claims(raw, policy, now_secs)
}

/// Structure and header checks, before any key is used: three parts, a
/// base64url JSON object header with `alg` exactly `"HS256"`, none of the
/// refused parameters, string `typ`, `cty` and `kid` if present, and a
/// signature part that decodes to 32 bytes. Returns the signed message
/// (`header.payload`), the payload part (still base64url) and the signature.
fn check_shape_and_header(token: &str) -> Result<(&str, &str, [u8; HS256_LEN]), TokenError> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let message = &token[..header.len() + 1 + payload.len()];
    let header = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| TokenError::Malformed)?;
    if !is_json_object(&header) {
        return Err(TokenError::Malformed);
    }
    check_utf8(&header)?;
    let header: RawHeader<'_> =
        serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
    if !matches!(header.alg, Some(Raw::Str(ref a)) if a == "HS256") {
        return Err(TokenError::Algorithm);
    }
    if header.jku || header.jwk || header.x5u || header.x5c || header.crit {
        return Err(TokenError::Algorithm);
    }
    for param in [&header.typ, &header.cty, &header.kid] {
        if matches!(param, Some(r) if !matches!(r, Raw::Str(_))) {
            return Err(TokenError::Malformed);
        }
    }
    // 43 base64url characters carry 32 bytes; the buffer leaves room for
    // the decoder's own length estimate, and the count is checked.
    let mut buf = [0u8; HS256_LEN + 3];
    match URL_SAFE_NO_PAD.decode_slice(signature, &mut buf) {
        Ok(HS256_LEN) => {
            let mut tag = [0u8; HS256_LEN];
            tag.copy_from_slice(&buf[..HS256_LEN]);
            Ok((message, payload, tag))
        }
        _ => Err(TokenError::BadSignature),
    }
}

/// RFC 7515 and 7519 make both parts UTF-8. Checked for the whole part
/// before parsing, because serde_json reads the members it ignores (unknown
/// header parameters and claims) without checking their strings' UTF-8:
/// without this, a header such as `{"alg":"HS256","x":"\xd4"}` would be
/// accepted (found by fuzzing, `core/fuzz/regressions/jwt_parse/crash-979216cb…`).
/// The part is then parsed as bytes (`from_slice`), the reader every other
/// JSON of the edge filter uses, so no second reader is linked into it.
fn check_utf8(part: &[u8]) -> Result<(), TokenError> {
    std::str::from_utf8(part)
        .map(|_| ())
        .map_err(|_| TokenError::Malformed)
}

/// Whether `json` starts (after JSON white space) with `{`: the parts of a
/// token must be objects, and serde would also read a struct from an array.
fn is_json_object(json: &[u8]) -> bool {
    json.iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|b| *b == b'{')
}

/// A JSON member's value as far as the checks care: a string (borrowed from
/// the decoded part when it has no escapes), a non-negative integer, a
/// boolean, or anything else. `null` is `None` around it, like a missing
/// member.
#[derive(Debug)]
enum Raw<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    Bool(bool),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Raw<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Raw<'a>, E> {
                Ok(Raw::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Raw<'a>, E> {
                Ok(Raw::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Raw<'a>, E> {
                Ok(Raw::Str(Cow::Owned(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Raw<'a>, E> {
                Ok(Raw::U64(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Raw<'a>, E> {
                Ok(u64::try_from(v).map_or(Raw::Other, Raw::U64))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Raw<'a>, E> {
                Ok(Raw::Other)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Raw<'a>, E> {
                Ok(Raw::Bool(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Raw<'a>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Raw::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Raw<'a>, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Raw::Other)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Deserialises any value, `null` included, as "present".
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

/// The header members the checks read; any other member is ignored. A
/// member given twice is an error (RFC 7515 allows refusing duplicates).
#[derive(Deserialize)]
struct RawHeader<'a> {
    #[serde(default, borrow)]
    alg: Option<Raw<'a>>,
    #[serde(default, borrow)]
    typ: Option<Raw<'a>>,
    #[serde(default, borrow)]
    cty: Option<Raw<'a>>,
    #[serde(default, borrow)]
    kid: Option<Raw<'a>>,
    #[serde(default, deserialize_with = "present")]
    jku: bool,
    #[serde(default, deserialize_with = "present")]
    jwk: bool,
    #[serde(default, deserialize_with = "present")]
    x5u: bool,
    #[serde(default, deserialize_with = "present")]
    x5c: bool,
    #[serde(default, deserialize_with = "present")]
    crit: bool,
}

/// The claims the checks read, as they stand in the payload; any other
/// claim is ignored. A claim given twice is an error (RFC 7519 allows
/// refusing duplicates).
#[derive(Deserialize)]
struct RawClaims<'a> {
    #[serde(default, borrow)]
    sub: Option<Raw<'a>>,
    #[serde(default, borrow)]
    sid: Option<Raw<'a>>,
    #[serde(default, borrow)]
    jti: Option<Raw<'a>>,
    #[serde(default, borrow)]
    did: Option<Raw<'a>>,
    #[serde(default, borrow)]
    mfa: Option<Raw<'a>>,
    /// An array of strings, or missing / null; anything else is malformed.
    #[serde(default)]
    amr: Option<Vec<String>>,
    #[serde(default, borrow)]
    typ: Option<Raw<'a>>,
    #[serde(default, borrow)]
    iss: Option<Raw<'a>>,
    #[serde(default, borrow)]
    aud: Option<Raw<'a>>,
    #[serde(default, borrow)]
    iat: Option<Raw<'a>>,
    #[serde(default, borrow)]
    exp: Option<Raw<'a>>,
    #[serde(default, borrow)]
    nbf: Option<Raw<'a>>,
}

/// A required string claim: missing or null is `MissingClaim`, another JSON
/// type is `Malformed`.
fn string_claim<'a>(claim: &'a Option<Raw<'_>>) -> Result<&'a str, TokenError> {
    match claim {
        None => Err(TokenError::MissingClaim),
        Some(Raw::Str(s)) => Ok(s),
        Some(_) => Err(TokenError::Malformed),
    }
}

/// An optional string claim: `Malformed` unless missing, null or a string.
fn optional_string(claim: &Option<Raw<'_>>) -> Result<Option<String>, TokenError> {
    match claim {
        None => Ok(None),
        Some(Raw::Str(s)) => Ok(Some(s.clone().into_owned())),
        Some(_) => Err(TokenError::Malformed),
    }
}

/// A time claim: `Ok(None)` if missing or null, `Malformed` unless a
/// non-negative integer that fits in `u64`.
fn time_claim(claim: &Option<Raw<'_>>) -> Result<Option<u64>, TokenError> {
    match claim {
        None => Ok(None),
        Some(Raw::U64(v)) => Ok(Some(*v)),
        Some(_) => Err(TokenError::Malformed),
    }
}

/// The only checks whose outcome depends on `now`: valid while
/// `now < exp + leeway` and once `now + leeway >= nbf` (a sum past
/// `u64::MAX` counts as satisfied).
pub(crate) fn check_time(
    exp: u64,
    nbf: Option<u64>,
    leeway_secs: u64,
    now: u64,
) -> Result<(), TokenError> {
    if let Some(limit) = exp.checked_add(leeway_secs) {
        if now >= limit {
            return Err(TokenError::Expired);
        }
    }
    if let (Some(nbf), Some(shifted)) = (nbf, now.checked_add(leeway_secs)) {
        if shifted < nbf {
            return Err(TokenError::NotYetValid);
        }
    }
    Ok(())
}

/// The checks on a payload whose signature has been verified, in the order
/// [`TokenKeys::verify`] documents.
fn check_claims(raw: RawClaims<'_>, policy: &Policy<'_>, now: u64) -> Result<Claims, TokenError> {
    let typ = string_claim(&raw.typ)?;
    if typ != policy.kind.typ() {
        return Err(TokenError::WrongType);
    }
    // `iss` and `aud` must be exactly the configured strings: an array (even
    // one holding the right value) or any other type is refused.
    let iss = match &raw.iss {
        None => return Err(TokenError::MissingClaim),
        Some(Raw::Str(s)) if s == policy.issuer => s,
        Some(_) => return Err(TokenError::WrongIssuer),
    };
    let aud = match &raw.aud {
        None => return Err(TokenError::MissingClaim),
        Some(Raw::Str(s)) if s == policy.audience => s,
        Some(_) => return Err(TokenError::WrongAudience),
    };

    let exp = time_claim(&raw.exp)?.ok_or(TokenError::MissingClaim)?;
    let iat = time_claim(&raw.iat)?.ok_or(TokenError::MissingClaim)?;
    let nbf = time_claim(&raw.nbf)?;

    check_time(exp, nbf, policy.leeway_secs, now)?;

    let sub = string_claim(&raw.sub)?;
    let mfa = match raw.mfa {
        None => None,
        Some(Raw::Bool(b)) => Some(b),
        Some(_) => return Err(TokenError::Malformed),
    };
    let claims = Claims {
        sub: sub.to_owned(),
        sid: optional_string(&raw.sid)?,
        jti: optional_string(&raw.jti)?,
        did: optional_string(&raw.did)?,
        mfa,
        amr: raw.amr,
        typ: typ.to_owned(),
        iss: iss.clone().into_owned(),
        aud: aud.clone().into_owned(),
        iat,
        exp,
        nbf,
    };

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
pub(crate) mod tests;
