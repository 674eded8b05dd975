//! Decoding what a browser sends for a passkey, nothing verified yet:
//! the `toJSON()` form of a registration or authentication response
//! (base64url fields), `clientDataJSON`, the authenticator data and the
//! attestation object (CBOR). Every malformed input is a
//! [`WebauthnError::Malformed`] naming the field; the checks of the
//! ceremonies are in the parent module.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use minicbor::data::Type;
use minicbor::Decoder;
use serde_json::Value;

use super::{malformed, WebauthnError, MAX_CREDENTIAL_ID_LEN, MAX_FIELD_CHARS, MAX_TRANSPORTS};

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
