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
//!
//! Layout: the private `parse` module decodes the browser's JSON, `clientDataJSON`, the
//! authenticator data and the attestation object (nothing verified
//! there); this module holds the errors and the two ceremonies that
//! check them.

use std::fmt;

use sha2::{Digest, Sha256};

use super::codes::ct_eq;
use super::cose::{parse_cose_key, parse_cose_key_prefix, PublicKey};

mod parse;

pub use parse::{
    b64url_decode, b64url_encode, parse_attestation_object, parse_authenticator_data,
    parse_client_data, AttestationObject, AttestedCredential, AuthenticationResponse,
    AuthenticatorData, ClientData, Flags, RegistrationResponse,
};

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
