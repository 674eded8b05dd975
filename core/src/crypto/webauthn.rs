//! WebAuthn (Level 2/3) relying-party verification of passkey registrations
//! and assertions: pure functions of the browser's JSON, the expected
//! challenge and the relying party's settings.
//!
//! What it does:
//! - Reads the `toJSON()` form (base64url fields) of a registration response
//!   ([`RegistrationResponse::from_json`]) and of an authentication response
//!   ([`AuthenticationResponse::from_json`]).
//! - [`verify_registration`]: `clientDataJSON` (type `webauthn.create`, the
//!   challenge compared in constant time, an allowed origin, `crossOrigin`
//!   not true), the attestation object (CBOR: `fmt`, `attStmt`, `authData`),
//!   the authenticator data (RP ID hash compared in constant time, UP, UV
//!   when required, BE/BS consistent, attested credential data with a
//!   credential ID of at most 1023 bytes that matches `rawId`, extensions
//!   tolerated) and the COSE public key ([`super::cose`]: ES256, EdDSA,
//!   RS256). The result, [`NewCredential`], is what to store.
//! - [`verify_authentication`]: the same client-data and authenticator-data
//!   checks for `webauthn.get`, the credential and user handle against the
//!   stored credential, BE unchanged, the signature over
//!   `authenticatorData ‖ SHA-256(clientDataJSON)`, and the signature
//!   counter: when the stored and the new count are both non-zero and the
//!   new one is not greater, [`WebauthnError::CounterRegression`] (a possible
//!   cloned authenticator; the caller refuses and audits it).
//!
//! Attestation: the service asks for attestation `none`, so it makes no
//! trust decision on the authenticator's make or model. Browsers normally
//! answer with `fmt: "none"`, but a client may pass the authenticator's own
//! statement through (e.g. `packed` self attestation). Any format is
//! accepted as long as the attestation object is well-formed CBOR with a map
//! as `attStmt`; the statement itself is not verified, which is exactly the
//! "None" attestation type of the specification (§6.5.3). `fmt` is returned
//! so that it can be recorded.
//!
//! What it does not do: no randomness (challenges are drawn by the caller),
//! no clock (challenge expiry is the store's TTL), no storage (single use of
//! a challenge is the caller's atomic delete), no attestation trust path, no
//! extension processing (extension outputs are skipped).
//!
//! Every malformed input yields a [`WebauthnError`] with a message naming
//! the field; nothing here panics on any input
//! (`tfa_core::testing::fuzzing::webauthn_parse` checks it).

use std::fmt;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use minicbor::data::Type;
use minicbor::Decoder;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::codes::ct_eq;
use super::cose::{parse_cose_key, parse_cose_key_prefix, PublicKey};

/// Longest credential ID accepted (WebAuthn Level 3, §5.8.1 / §7.1).
pub const MAX_CREDENTIAL_ID_LEN: usize = 1023;
/// Longest base64url field accepted, in characters (attestation objects with
/// certificate chains are a few KiB; this bounds the work on hostile input).
pub const MAX_FIELD_CHARS: usize = 64 * 1024;
/// Most transports kept from a registration response.
pub const MAX_TRANSPORTS: usize = 8;

/// Why a registration or assertion was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebauthnError {
    /// The input is not well-formed: base64url, JSON, CBOR, COSE, lengths,
    /// truncated authenticator data. The message names what is wrong.
    Malformed(String),
    /// `clientDataJSON.type` is not the ceremony's type.
    WrongType {
        /// The type the ceremony needs.
        expected: &'static str,
    },
    /// `clientDataJSON.challenge` is not the challenge that was issued.
    ChallengeMismatch,
    /// `clientDataJSON.origin` is not one of the allowed origins.
    OriginNotAllowed(String),
    /// `clientDataJSON.crossOrigin` is true (an embedded, cross-origin frame).
    CrossOrigin,
    /// The authenticator data's RP ID hash is not SHA-256 of our RP ID.
    RpIdMismatch,
    /// The UP (user present) flag is not set.
    UserNotPresent,
    /// The UV (user verified) flag is not set although it was required.
    UserNotVerified,
    /// BS (backed up) without BE (backup eligible), or BE differs from the
    /// value recorded at registration.
    InvalidBackupFlags(&'static str),
    /// The response is for another credential or another user.
    CredentialMismatch(&'static str),
    /// The credential's COSE algorithm is not ES256, EdDSA or RS256.
    UnsupportedAlgorithm(i64),
    /// The key's parameters do not fit its algorithm, or are too weak.
    UnsupportedKey(String),
    /// The assertion signature does not verify.
    InvalidSignature,
    /// The signature counter did not increase (both non-zero): a possible
    /// cloned authenticator.
    CounterRegression {
        /// The count stored for the credential.
        stored: u32,
        /// The count in this assertion.
        received: u32,
    },
}

impl fmt::Display for WebauthnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WebauthnError::Malformed(m) => write!(f, "malformed credential: {m}"),
            WebauthnError::WrongType { expected } => {
                write!(f, "clientDataJSON.type must be \"{expected}\"")
            }
            WebauthnError::ChallengeMismatch => {
                f.write_str("the challenge does not match the one issued")
            }
            WebauthnError::OriginNotAllowed(o) => write!(f, "origin {o:?} is not allowed"),
            WebauthnError::CrossOrigin => f.write_str("cross-origin requests are not allowed"),
            WebauthnError::RpIdMismatch => {
                f.write_str("the credential is not scoped to this relying party (RP ID hash)")
            }
            WebauthnError::UserNotPresent => f.write_str("user presence (UP) is required"),
            WebauthnError::UserNotVerified => f.write_str("user verification (UV) is required"),
            WebauthnError::InvalidBackupFlags(m) => write!(f, "invalid backup flags: {m}"),
            WebauthnError::CredentialMismatch(m) => write!(f, "credential mismatch: {m}"),
            WebauthnError::UnsupportedAlgorithm(a) => write!(
                f,
                "unsupported public key algorithm {a} (supported: ES256 -7, EdDSA -8, RS256 -257)"
            ),
            WebauthnError::UnsupportedKey(m) => write!(f, "unsupported public key: {m}"),
            WebauthnError::InvalidSignature => f.write_str("the signature is not valid"),
            WebauthnError::CounterRegression { stored, received } => write!(
                f,
                "signature counter did not increase (stored {stored}, received {received}): possible cloned authenticator"
            ),
        }
    }
}

impl std::error::Error for WebauthnError {}

fn malformed(what: impl fmt::Display) -> WebauthnError {
    WebauthnError::Malformed(what.to_string())
}

// ---------------------------------------------------------------------------
// base64url and JSON fields

/// base64url with or without `=` padding (`toJSON()` writes none).
const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes base64url (padding optional).
pub fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    B64URL.decode(s).ok()
}

/// Encodes base64url without padding.
#[must_use]
pub fn b64url_encode(bytes: &[u8]) -> String {
    B64URL.encode(bytes)
}

fn field<'a>(obj: &'a Value, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn b64_field(obj: &Value, path: &str, name: &str) -> Result<Vec<u8>, WebauthnError> {
    let v = field(obj, name).ok_or_else(|| malformed(format_args!("{path}{name} is missing")))?;
    decode_b64_value(v, &format!("{path}{name}"))
}

fn decode_b64_value(v: &Value, what: &str) -> Result<Vec<u8>, WebauthnError> {
    let s = v
        .as_str()
        .ok_or_else(|| malformed(format_args!("{what} must be a base64url string")))?;
    if s.len() > MAX_FIELD_CHARS {
        return Err(malformed(format_args!("{what} is too long")));
    }
    b64url_decode(s).ok_or_else(|| malformed(format_args!("{what} is not valid base64url")))
}

/// `id`, `rawId` and `type` of a `PublicKeyCredential` JSON: the credential
/// ID (the two must agree when both are present).
fn credential_id(v: &Value) -> Result<Vec<u8>, WebauthnError> {
    if !v.is_object() {
        return Err(malformed("the credential must be a JSON object"));
    }
    match field(v, "type") {
        Some(Value::String(t)) if t == "public-key" => {}
        _ => return Err(malformed("credential.type must be \"public-key\"")),
    }
    let id = b64_field(v, "credential.", "id")?;
    if let Some(raw) = field(v, "rawId") {
        if decode_b64_value(raw, "credential.rawId")? != id {
            return Err(malformed("credential.id and credential.rawId differ"));
        }
    }
    if id.is_empty() || id.len() > MAX_CREDENTIAL_ID_LEN {
        return Err(malformed(format_args!(
            "credential.id must be 1 to {MAX_CREDENTIAL_ID_LEN} bytes"
        )));
    }
    Ok(id)
}

fn response_object(v: &Value) -> Result<&Value, WebauthnError> {
    field(v, "response")
        .filter(|r| r.is_object())
        .ok_or_else(|| malformed("credential.response must be an object"))
}

/// A registration response (`PublicKeyCredential.toJSON()` after
/// `navigator.credentials.create`), decoded but not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationResponse {
    /// The credential ID (`rawId`).
    pub raw_id: Vec<u8>,
    /// `response.clientDataJSON`, as sent (its hash is what was signed).
    pub client_data_json: Vec<u8>,
    /// `response.attestationObject` (CBOR).
    pub attestation_object: Vec<u8>,
    /// `response.transports` (e.g. `internal`, `hybrid`, `usb`), unmodified.
    pub transports: Vec<String>,
    /// `authenticatorAttachment` (`platform` or `cross-platform`), if given.
    pub authenticator_attachment: Option<String>,
    /// `clientExtensionResults.credProps.rk`: whether the client reports the
    /// credential as discoverable, if it says.
    pub resident_key: Option<bool>,
}

impl RegistrationResponse {
    /// Reads the JSON form; every missing or ill-typed field is a
    /// [`WebauthnError::Malformed`] naming it.
    pub fn from_json(v: &Value) -> Result<Self, WebauthnError> {
        let raw_id = credential_id(v)?;
        let r = response_object(v)?;
        let client_data_json = b64_field(r, "credential.response.", "clientDataJSON")?;
        let attestation_object = b64_field(r, "credential.response.", "attestationObject")?;
        let transports = match field(r, "transports") {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() <= MAX_TRANSPORTS => items
                .iter()
                .map(|t| {
                    t.as_str()
                        .filter(|s| !s.is_empty() && s.len() <= 32 && s.is_ascii())
                        .map(str::to_string)
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    malformed("credential.response.transports must hold short ASCII strings")
                })?,
            Some(_) => {
                return Err(malformed(format_args!(
                    "credential.response.transports must be an array of at most {MAX_TRANSPORTS} strings"
                )))
            }
        };
        let authenticator_attachment = match field(v, "authenticatorAttachment") {
            None => None,
            Some(Value::String(s)) if s.len() <= 32 && s.is_ascii() => Some(s.clone()),
            Some(_) => {
                return Err(malformed(
                    "credential.authenticatorAttachment must be a short string",
                ))
            }
        };
        let resident_key = match field(v, "clientExtensionResults") {
            None => None,
            Some(Value::Object(ext)) => ext
                .get("credProps")
                .and_then(|p| p.get("rk"))
                .and_then(Value::as_bool),
            Some(_) => {
                return Err(malformed(
                    "credential.clientExtensionResults must be an object",
                ))
            }
        };
        Ok(RegistrationResponse {
            raw_id,
            client_data_json,
            attestation_object,
            transports,
            authenticator_attachment,
            resident_key,
        })
    }
}

/// An authentication response (`PublicKeyCredential.toJSON()` after
/// `navigator.credentials.get`), decoded but not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticationResponse {
    /// The credential ID (`rawId`): what to look the stored credential up by.
    pub raw_id: Vec<u8>,
    /// `response.clientDataJSON`, as sent.
    pub client_data_json: Vec<u8>,
    /// `response.authenticatorData`.
    pub authenticator_data: Vec<u8>,
    /// `response.signature`.
    pub signature: Vec<u8>,
    /// `response.userHandle` (the user ID given at registration), if any.
    pub user_handle: Option<Vec<u8>>,
}

impl AuthenticationResponse {
    /// Reads the JSON form; every missing or ill-typed field is a
    /// [`WebauthnError::Malformed`] naming it.
    pub fn from_json(v: &Value) -> Result<Self, WebauthnError> {
        let raw_id = credential_id(v)?;
        let r = response_object(v)?;
        let p = "credential.response.";
        let user_handle = match field(r, "userHandle") {
            None => None,
            Some(h) => Some(decode_b64_value(h, "credential.response.userHandle")?)
                .filter(|h| !h.is_empty()),
        };
        Ok(AuthenticationResponse {
            raw_id,
            client_data_json: b64_field(r, p, "clientDataJSON")?,
            authenticator_data: b64_field(r, p, "authenticatorData")?,
            signature: b64_field(r, p, "signature")?,
            user_handle,
        })
    }
}

// ---------------------------------------------------------------------------
// clientDataJSON

/// The fields of `clientDataJSON` that are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientData {
    /// `type`.
    pub typ: String,
    /// `challenge`, decoded.
    pub challenge: Vec<u8>,
    /// `origin`.
    pub origin: String,
    /// `crossOrigin` (absent = false).
    pub cross_origin: bool,
    /// `topOrigin`, if present.
    pub top_origin: Option<String>,
}

/// Parses `clientDataJSON` (UTF-8 JSON object).
pub fn parse_client_data(bytes: &[u8]) -> Result<ClientData, WebauthnError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format_args!("clientDataJSON is not JSON ({e})")))?;
    if !v.is_object() {
        return Err(malformed("clientDataJSON must be a JSON object"));
    }
    let text = |name: &str| -> Result<String, WebauthnError> {
        field(&v, name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| malformed(format_args!("clientDataJSON.{name} must be a string")))
    };
    let typ = text("type")?;
    let challenge = b64url_decode(&text("challenge")?)
        .ok_or_else(|| malformed("clientDataJSON.challenge is not valid base64url"))?;
    let origin = text("origin")?;
    let cross_origin = match field(&v, "crossOrigin") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(malformed("clientDataJSON.crossOrigin must be a boolean")),
    };
    let top_origin = match field(&v, "topOrigin") {
        None => None,
        Some(_) => Some(text("topOrigin")?),
    };
    Ok(ClientData {
        typ,
        challenge,
        origin,
        cross_origin,
        top_origin,
    })
}

// ---------------------------------------------------------------------------
// authenticatorData

/// The flags byte of authenticator data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags(pub u8);

impl Flags {
    /// UP: user present.
    pub const UP: u8 = 0x01;
    /// UV: user verified.
    pub const UV: u8 = 0x04;
    /// BE: backup eligible.
    pub const BE: u8 = 0x08;
    /// BS: backed up.
    pub const BS: u8 = 0x10;
    /// AT: attested credential data included.
    pub const AT: u8 = 0x40;
    /// ED: extension data included.
    pub const ED: u8 = 0x80;

    /// Whether every bit of `mask` is set.
    #[must_use]
    pub fn has(self, mask: u8) -> bool {
        self.0 & mask == mask
    }
}

/// Attested credential data (registration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestedCredential<'a> {
    /// The authenticator's model (all zero under attestation `none` in some
    /// browsers).
    pub aaguid: [u8; 16],
    /// The credential ID.
    pub credential_id: &'a [u8],
    /// The credential public key, as COSE bytes.
    pub public_key: &'a [u8],
}

/// Parsed authenticator data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatorData<'a> {
    /// SHA-256 of the RP ID the credential is scoped to.
    pub rp_id_hash: &'a [u8],
    /// The flags.
    pub flags: Flags,
    /// The signature counter (0 = the authenticator keeps none).
    pub sign_count: u32,
    /// Present when the AT flag is set.
    pub attested: Option<AttestedCredential<'a>>,
    /// The extension outputs (a CBOR map), present when the ED flag is set.
    pub extensions: Option<&'a [u8]>,
}

/// Parses authenticator data: 32-byte RP ID hash, flags, 4-byte counter,
/// then attested credential data (AT) and extensions (ED); nothing may
/// follow.
pub fn parse_authenticator_data(bytes: &[u8]) -> Result<AuthenticatorData<'_>, WebauthnError> {
    let short = || malformed("authenticatorData is truncated");
    if bytes.len() < 37 {
        return Err(short());
    }
    let (rp_id_hash, rest) = bytes.split_at(32);
    let flags = Flags(rest[0]);
    let sign_count = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
    let mut pos = 37;
    let attested = if flags.has(Flags::AT) {
        let head = bytes.get(pos..pos + 18).ok_or_else(short)?;
        let mut aaguid = [0u8; 16];
        aaguid.copy_from_slice(&head[..16]);
        let id_len = usize::from(u16::from_be_bytes([head[16], head[17]]));
        pos += 18;
        if id_len == 0 || id_len > MAX_CREDENTIAL_ID_LEN {
            return Err(malformed(format_args!(
                "the credential ID must be 1 to {MAX_CREDENTIAL_ID_LEN} bytes, not {id_len}"
            )));
        }
        let credential_id = bytes.get(pos..pos + id_len).ok_or_else(short)?;
        pos += id_len;
        let key_bytes = &bytes[pos..];
        // The key's extent; its content is checked by `parse_cose_key`.
        let mut d = Decoder::new(key_bytes);
        if !matches!(d.datatype(), Ok(Type::Map)) {
            return Err(malformed(
                "the credential public key is missing or not a CBOR map",
            ));
        }
        d.skip()
            .map_err(|e| malformed(format_args!("credential public key: {e}")))?;
        let used = d.position();
        pos += used;
        Some(AttestedCredential {
            aaguid,
            credential_id,
            public_key: &key_bytes[..used],
        })
    } else {
        None
    };
    let extensions = if flags.has(Flags::ED) {
        let ext = &bytes[pos..];
        let mut d = Decoder::new(ext);
        if !matches!(d.datatype(), Ok(Type::Map | Type::MapIndef)) {
            return Err(malformed("the ED flag is set but no extension map follows"));
        }
        d.skip()
            .map_err(|e| malformed(format_args!("extensions: {e}")))?;
        pos += d.position();
        Some(&ext[..d.position()])
    } else {
        None
    };
    if pos != bytes.len() {
        return Err(malformed("trailing bytes after authenticatorData"));
    }
    Ok(AuthenticatorData {
        rp_id_hash,
        flags,
        sign_count,
        attested,
        extensions,
    })
}

// ---------------------------------------------------------------------------
// attestationObject

/// The parts of an attestation object that are used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestationObject<'a> {
    /// The attestation statement format (`none`, `packed`, …).
    pub fmt: &'a str,
    /// The authenticator data.
    pub auth_data: &'a [u8],
}

/// Parses the attestation object: a CBOR map with `fmt` (text), `attStmt`
/// (a map, not verified: see the module documentation) and `authData`
/// (bytes); other keys are skipped, duplicates and trailing bytes refused.
pub fn parse_attestation_object(bytes: &[u8]) -> Result<AttestationObject<'_>, WebauthnError> {
    let bad = |what: &str, e: minicbor::decode::Error| {
        malformed(format_args!("attestationObject: {what} ({e})"))
    };
    let mut d = Decoder::new(bytes);
    let n = match d.map() {
        Ok(Some(n)) => n,
        Ok(None) => return Err(malformed("attestationObject: an indefinite-length map")),
        Err(e) => return Err(bad("not a CBOR map", e)),
    };
    let mut fmt: Option<&str> = None;
    let mut auth_data: Option<&[u8]> = None;
    let mut att_stmt = false;
    for _ in 0..n {
        let key = d.str().map_err(|e| bad("a key is not a text string", e))?;
        let twice = || malformed(format_args!("attestationObject: {key} appears twice"));
        match key {
            "fmt" => {
                if fmt.is_some() {
                    return Err(twice());
                }
                fmt = Some(d.str().map_err(|e| bad("fmt is not a text string", e))?);
            }
            "authData" => {
                if auth_data.is_some() {
                    return Err(twice());
                }
                auth_data = Some(
                    d.bytes()
                        .map_err(|e| bad("authData is not a byte string", e))?,
                );
            }
            "attStmt" => {
                if att_stmt {
                    return Err(twice());
                }
                if !matches!(d.datatype(), Ok(Type::Map | Type::MapIndef)) {
                    return Err(malformed("attestationObject: attStmt must be a map"));
                }
                d.skip().map_err(|e| bad("attStmt", e))?;
                att_stmt = true;
            }
            _ => d.skip().map_err(|e| bad(key, e))?,
        }
    }
    if d.position() != bytes.len() {
        return Err(malformed("attestationObject: trailing bytes"));
    }
    let fmt = fmt.ok_or_else(|| malformed("attestationObject: fmt is missing"))?;
    let auth_data = auth_data.ok_or_else(|| malformed("attestationObject: authData is missing"))?;
    if !att_stmt {
        return Err(malformed("attestationObject: attStmt is missing"));
    }
    if fmt.is_empty() || fmt.len() > 32 || !fmt.is_ascii() {
        return Err(malformed("attestationObject: fmt is not a format name"));
    }
    Ok(AttestationObject { fmt, auth_data })
}

// ---------------------------------------------------------------------------
// Ceremonies

/// The relying party: its RP ID and the origins its pages are served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    id: String,
    id_hash: [u8; 32],
    origins: Vec<String>,
}

impl RelyingParty {
    /// An RP ID (a domain, e.g. `example.org`) and the exact origins
    /// (`https://example.org`, `http://localhost:3001`, …) allowed.
    #[must_use]
    pub fn new(id: &str, origins: &[String]) -> Self {
        RelyingParty {
            id: id.to_string(),
            id_hash: Sha256::digest(id.as_bytes()).into(),
            origins: origins.to_vec(),
        }
    }

    /// The RP ID.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The allowed origins.
    #[must_use]
    pub fn origins(&self) -> &[String] {
        &self.origins
    }
}

/// What the relying party asked for in the options of a ceremony.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// The challenge issued (and now spent) for this ceremony.
    pub challenge: &'a [u8],
    /// Whether user verification was `required` (UV must be set).
    pub user_verification: bool,
}

fn check_client_data(
    rp: &RelyingParty,
    client_data_json: &[u8],
    typ: &'static str,
    expected: &Expected<'_>,
) -> Result<(), WebauthnError> {
    let cd = parse_client_data(client_data_json)?;
    if cd.typ != typ {
        return Err(WebauthnError::WrongType { expected: typ });
    }
    if !ct_eq(&cd.challenge, expected.challenge) {
        return Err(WebauthnError::ChallengeMismatch);
    }
    if !rp.origins.contains(&cd.origin) {
        return Err(WebauthnError::OriginNotAllowed(cd.origin));
    }
    if cd.cross_origin {
        return Err(WebauthnError::CrossOrigin);
    }
    Ok(())
}

fn check_auth_data(
    rp: &RelyingParty,
    ad: &AuthenticatorData<'_>,
    expected: &Expected<'_>,
) -> Result<(), WebauthnError> {
    if !ct_eq(ad.rp_id_hash, &rp.id_hash) {
        return Err(WebauthnError::RpIdMismatch);
    }
    if !ad.flags.has(Flags::UP) {
        return Err(WebauthnError::UserNotPresent);
    }
    if expected.user_verification && !ad.flags.has(Flags::UV) {
        return Err(WebauthnError::UserNotVerified);
    }
    if ad.flags.has(Flags::BS) && !ad.flags.has(Flags::BE) {
        return Err(WebauthnError::InvalidBackupFlags(
            "BS (backed up) is set without BE (backup eligible)",
        ));
    }
    Ok(())
}

/// A verified new credential: what to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCredential {
    /// The credential ID.
    pub credential_id: Vec<u8>,
    /// The public key as COSE bytes (give it back in [`StoredCredential`]).
    pub public_key: Vec<u8>,
    /// Its COSE algorithm (-7, -8 or -257).
    pub algorithm: i64,
    /// The initial signature counter.
    pub sign_count: u32,
    /// The authenticator model (AAGUID).
    pub aaguid: [u8; 16],
    /// UV was set.
    pub user_verified: bool,
    /// BE: the credential may be synced (a multi-device passkey).
    pub backup_eligible: bool,
    /// BS: the credential is backed up now.
    pub backed_up: bool,
    /// The attestation format sent (its statement is not verified).
    pub attestation_format: String,
    /// Transports, unmodified from the response.
    pub transports: Vec<String>,
    /// `authenticatorAttachment`, if given.
    pub authenticator_attachment: Option<String>,
    /// `credProps.rk`, if the client reported it.
    pub resident_key: Option<bool>,
}

/// Verifies a registration response (WebAuthn §7.1) against the challenge
/// issued for it.
pub fn verify_registration(
    rp: &RelyingParty,
    response: &RegistrationResponse,
    expected: &Expected<'_>,
) -> Result<NewCredential, WebauthnError> {
    check_client_data(rp, &response.client_data_json, "webauthn.create", expected)?;
    let att = parse_attestation_object(&response.attestation_object)?;
    let ad = parse_authenticator_data(att.auth_data)?;
    check_auth_data(rp, &ad, expected)?;
    let attested = ad
        .attested
        .as_ref()
        .ok_or_else(|| malformed("authenticatorData has no attested credential data (AT flag)"))?;
    if attested.credential_id != response.raw_id.as_slice() {
        return Err(WebauthnError::CredentialMismatch(
            "rawId is not the credential ID in authenticatorData",
        ));
    }
    let key = parse_cose_key(attested.public_key)?;
    Ok(NewCredential {
        credential_id: attested.credential_id.to_vec(),
        public_key: attested.public_key.to_vec(),
        algorithm: key.algorithm(),
        sign_count: ad.sign_count,
        aaguid: attested.aaguid,
        user_verified: ad.flags.has(Flags::UV),
        backup_eligible: ad.flags.has(Flags::BE),
        backed_up: ad.flags.has(Flags::BS),
        attestation_format: att.fmt.to_string(),
        transports: response.transports.clone(),
        authenticator_attachment: response.authenticator_attachment.clone(),
        resident_key: response.resident_key,
    })
}

/// A stored credential, as an assertion is checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredCredential<'a> {
    /// The credential ID.
    pub credential_id: &'a [u8],
    /// The COSE public key from [`NewCredential::public_key`].
    pub public_key: &'a [u8],
    /// The last signature counter stored.
    pub sign_count: u32,
    /// BE as recorded at registration.
    pub backup_eligible: bool,
    /// The user handle (`user.id` of the creation options) of its owner.
    pub user_handle: &'a [u8],
}

/// A verified assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assertion {
    /// The counter to store now: the new one, or the stored one if the
    /// authenticator reported 0 (it may have stopped counting; the stored
    /// value keeps protecting against a clone that still counts).
    pub sign_count: u32,
    /// UV was set.
    pub user_verified: bool,
    /// BS now.
    pub backed_up: bool,
}

/// Verifies an assertion (WebAuthn §7.2) made with `stored`.
/// `user_handle_required`: the user was not identified before the ceremony
/// (passwordless), so the response must name it.
pub fn verify_authentication(
    rp: &RelyingParty,
    response: &AuthenticationResponse,
    expected: &Expected<'_>,
    stored: &StoredCredential<'_>,
    user_handle_required: bool,
) -> Result<Assertion, WebauthnError> {
    if response.raw_id.as_slice() != stored.credential_id {
        return Err(WebauthnError::CredentialMismatch(
            "the assertion is made with another credential",
        ));
    }
    match &response.user_handle {
        Some(h) if !ct_eq(h, stored.user_handle) => {
            return Err(WebauthnError::CredentialMismatch(
                "the user handle is not the credential owner's",
            ))
        }
        None if user_handle_required => {
            return Err(malformed(
                "credential.response.userHandle is required (discoverable credential)",
            ))
        }
        _ => {}
    }
    check_client_data(rp, &response.client_data_json, "webauthn.get", expected)?;
    let ad = parse_authenticator_data(&response.authenticator_data)?;
    check_auth_data(rp, &ad, expected)?;
    if ad.flags.has(Flags::BE) != stored.backup_eligible {
        return Err(WebauthnError::InvalidBackupFlags(
            "BE (backup eligible) changed since registration",
        ));
    }
    let key: PublicKey = parse_cose_key(stored.public_key)?;
    let mut message = response.authenticator_data.clone();
    message.extend_from_slice(&Sha256::digest(&response.client_data_json));
    key.verify(&message, &response.signature)?;
    let received = ad.sign_count;
    if stored.sign_count != 0 && received != 0 && received <= stored.sign_count {
        return Err(WebauthnError::CounterRegression {
            stored: stored.sign_count,
            received,
        });
    }
    Ok(Assertion {
        sign_count: received.max(stored.sign_count),
        user_verified: ad.flags.has(Flags::UV),
        backed_up: ad.flags.has(Flags::BS),
    })
}

/// Reads a COSE key from the start of `bytes` (re-exported for callers that
/// hold only the key, e.g. to show its algorithm).
pub fn cose_algorithm(public_key: &[u8]) -> Result<i64, WebauthnError> {
    parse_cose_key_prefix(public_key).map(|(k, _)| k.algorithm())
}
