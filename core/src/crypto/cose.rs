//! COSE public keys of WebAuthn credentials (RFC 9052/9053, RFC 8230) and the
//! signature checks made with them, on a CBOR decoder that never panics.
//!
//! What it does:
//! - [`parse_cose_key`] reads a `COSE_Key` map as authenticators write it into
//!   the attested credential data, and accepts exactly three algorithms:
//!   ES256 (-7: EC2, P-256, uncompressed x/y), EdDSA (-8: OKP, Ed25519) and
//!   RS256 (-257: RSA, RSASSA-PKCS1-v1_5 with SHA-256, a modulus of 2048 to
//!   4096 bits). Any other algorithm is [`WebauthnError::UnsupportedAlgorithm`];
//!   a key whose parameters do not fit its algorithm (wrong key type or curve,
//!   wrong coordinate length, a point not on the curve, a weak Ed25519 point,
//!   a short RSA modulus) is [`WebauthnError::UnsupportedKey`].
//! - [`PublicKey::verify`] checks a signature over a message: ECDSA P-256 with
//!   SHA-256 and a DER signature (high-S accepted, as WebAuthn does not
//!   require low-S), Ed25519 in the strict mode of `ed25519-dalek` (no
//!   malleable or small-order signatures), RSA PKCS#1 v1.5 with SHA-256.
//!
//! The credential's key is stored as the COSE bytes the authenticator sent
//! and parsed again for every assertion, so what is stored is exactly what
//! was attested and no second encoding can drift from it.
//!
//! What it does not do: it reads no other COSE structure (no `COSE_Sign1`),
//! and it does not look at `key_ops` or `kid`.

use minicbor::data::Type;
use minicbor::Decoder;

use super::webauthn::WebauthnError;

/// COSE algorithm identifier of ES256 (ECDSA P-256 with SHA-256).
pub const ES256: i64 = -7;
/// COSE algorithm identifier of EdDSA (here: Ed25519 only).
pub const EDDSA: i64 = -8;
/// COSE algorithm identifier of RS256 (RSASSA-PKCS1-v1_5 with SHA-256).
pub const RS256: i64 = -257;
/// The algorithms offered in `pubKeyCredParams`, in order of preference.
pub const SUPPORTED_ALGORITHMS: [i64; 3] = [ES256, EDDSA, RS256];

/// Smallest RSA modulus accepted, in bits.
pub const RSA_MIN_BITS: usize = 2048;

// COSE key parameters (RFC 9052 §7, RFC 9053 §7, RFC 8230 §4).
const LABEL_KTY: i64 = 1;
const LABEL_ALG: i64 = 3;
const LABEL_CRV_OR_N: i64 = -1;
const LABEL_X_OR_E: i64 = -2;
const LABEL_Y: i64 = -3;
const KTY_OKP: i64 = 1;
const KTY_EC2: i64 = 2;
const KTY_RSA: i64 = 3;
const CRV_P256: i64 = 1;
const CRV_ED25519: i64 = 6;

/// A credential public key of one of the [`SUPPORTED_ALGORITHMS`].
#[derive(Debug, Clone)]
pub enum PublicKey {
    /// ES256.
    Es256(p256::ecdsa::VerifyingKey),
    /// EdDSA over Ed25519.
    Ed25519(ed25519_dalek::VerifyingKey),
    /// RS256.
    Rs256(Box<rsa::RsaPublicKey>),
}

impl PublicKey {
    /// The COSE algorithm identifier.
    #[must_use]
    pub fn algorithm(&self) -> i64 {
        match self {
            PublicKey::Es256(_) => ES256,
            PublicKey::Ed25519(_) => EDDSA,
            PublicKey::Rs256(_) => RS256,
        }
    }

    /// Checks `signature` over `message`;
    /// [`WebauthnError::InvalidSignature`] when it does not verify or is not
    /// even well-formed for the algorithm.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), WebauthnError> {
        let ok = match self {
            PublicKey::Es256(key) => {
                use p256::ecdsa::signature::Verifier;
                p256::ecdsa::Signature::from_der(signature)
                    .is_ok_and(|sig| key.verify(message, &sig).is_ok())
            }
            PublicKey::Ed25519(key) => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|sig| key.verify_strict(message, &sig).is_ok()),
            PublicKey::Rs256(key) => {
                use rsa::signature::Verifier;
                // rsa 0.9's own sha2 (0.10): its verifier takes that
                // version's `Digest`, not the workspace's sha2 0.11.
                let verifier =
                    rsa::pkcs1v15::VerifyingKey::<rsa::sha2::Sha256>::new((**key).clone());
                rsa::pkcs1v15::Signature::try_from(signature)
                    .is_ok_and(|sig| verifier.verify(message, &sig).is_ok())
            }
        };
        if ok {
            Ok(())
        } else {
            Err(WebauthnError::InvalidSignature)
        }
    }
}

/// A value of a key parameter whose meaning depends on the key type.
#[derive(Clone, Copy)]
enum Param<'a> {
    Int(i64),
    Bytes(&'a [u8]),
}

fn malformed(what: impl std::fmt::Display) -> WebauthnError {
    WebauthnError::Malformed(format!("credential public key: {what}"))
}

fn unsupported(what: impl Into<String>) -> WebauthnError {
    WebauthnError::UnsupportedKey(what.into())
}

/// Reads one COSE key map from the start of `bytes` and returns the key and
/// the number of bytes the map takes (the COSE key in authenticator data has
/// no length prefix: what follows it are the extensions).
pub fn parse_cose_key_prefix(bytes: &[u8]) -> Result<(PublicKey, usize), WebauthnError> {
    let mut d = Decoder::new(bytes);
    let n = match d.map() {
        Ok(Some(n)) => n,
        Ok(None) => return Err(malformed("an indefinite-length map")),
        Err(e) => return Err(malformed(format_args!("not a CBOR map ({e})"))),
    };
    let mut kty: Option<i64> = None;
    let mut alg: Option<i64> = None;
    let mut params: [Option<Param<'_>>; 3] = [None; 3];
    for _ in 0..n {
        let label = match d.datatype() {
            Ok(Type::String | Type::StringIndef) => {
                // Text labels are private-use parameters: skipped.
                d.skip().map_err(malformed)?;
                d.skip().map_err(malformed)?;
                continue;
            }
            Ok(_) => d
                .i64()
                .map_err(|e| malformed(format_args!("a map label is not an integer ({e})")))?,
            Err(e) => return Err(malformed(e)),
        };
        let int = |d: &mut Decoder<'_>, name: &str| {
            d.i64()
                .map_err(|e| malformed(format_args!("{name} is not an integer ({e})")))
        };
        match label {
            LABEL_KTY => set_once(&mut kty, int(&mut d, "kty")?, "kty")?,
            LABEL_ALG => set_once(&mut alg, int(&mut d, "alg")?, "alg")?,
            LABEL_CRV_OR_N | LABEL_X_OR_E | LABEL_Y => {
                let value = match d.datatype() {
                    Ok(Type::Bytes) => Param::Bytes(d.bytes().map_err(malformed)?),
                    Ok(_) => Param::Int(int(&mut d, &format!("parameter {label}"))?),
                    Err(e) => return Err(malformed(e)),
                };
                let slot = usize::try_from(-label - 1).unwrap_or(0);
                set_once(&mut params[slot], value, &format!("parameter {label}"))?;
            }
            _ => d.skip().map_err(malformed)?,
        }
    }
    let used = d.position();
    let kty = kty.ok_or_else(|| malformed("no key type (kty)"))?;
    let alg = alg.ok_or_else(|| malformed("no algorithm (alg)"))?;
    if !SUPPORTED_ALGORITHMS.contains(&alg) {
        return Err(WebauthnError::UnsupportedAlgorithm(alg));
    }
    let [p1, p2, p3] = params;
    let key = match alg {
        ES256 => {
            expect_kty(kty, KTY_EC2, "ES256", "EC2")?;
            expect_curve(p1, CRV_P256, "ES256", "P-256")?;
            let x = coordinate(p2, "x")?;
            let y = coordinate(p3, "y")?;
            let point = p256::EncodedPoint::from_affine_coordinates(&x.into(), &y.into(), false);
            let key = p256::ecdsa::VerifyingKey::from_encoded_point(&point)
                .map_err(|_| unsupported("the ES256 key is not a point on P-256"))?;
            PublicKey::Es256(key)
        }
        EDDSA => {
            expect_kty(kty, KTY_OKP, "EdDSA", "OKP")?;
            expect_curve(p1, CRV_ED25519, "EdDSA", "Ed25519")?;
            let x = coordinate(p2, "x")?;
            let key = ed25519_dalek::VerifyingKey::from_bytes(&x)
                .map_err(|_| unsupported("the Ed25519 key is not a valid point"))?;
            if key.is_weak() {
                return Err(unsupported("the Ed25519 key is a small-order point"));
            }
            PublicKey::Ed25519(key)
        }
        _ => {
            expect_kty(kty, KTY_RSA, "RS256", "RSA")?;
            let (Some(Param::Bytes(n)), Some(Param::Bytes(e))) = (p1, p2) else {
                return Err(malformed("an RSA key needs n and e as byte strings"));
            };
            let n = rsa::BigUint::from_bytes_be(n);
            let e = rsa::BigUint::from_bytes_be(e);
            let bits = n.bits();
            if bits < RSA_MIN_BITS {
                return Err(unsupported(format!(
                    "the RSA modulus has {bits} bits; at least {RSA_MIN_BITS} are required"
                )));
            }
            let key = rsa::RsaPublicKey::new(n, e)
                .map_err(|e| unsupported(format!("the RSA key is not usable ({e})")))?;
            PublicKey::Rs256(Box::new(key))
        }
    };
    Ok((key, used))
}

/// Reads a COSE key that must fill `bytes` exactly (a stored key).
pub fn parse_cose_key(bytes: &[u8]) -> Result<PublicKey, WebauthnError> {
    let (key, used) = parse_cose_key_prefix(bytes)?;
    if used != bytes.len() {
        return Err(malformed("trailing bytes after the key"));
    }
    Ok(key)
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: &str) -> Result<(), WebauthnError> {
    if slot.is_some() {
        return Err(malformed(format_args!("{name} appears twice")));
    }
    *slot = Some(value);
    Ok(())
}

fn expect_kty(kty: i64, want: i64, alg: &str, name: &str) -> Result<(), WebauthnError> {
    if kty == want {
        Ok(())
    } else {
        Err(unsupported(format!(
            "an {alg} key must have key type {name} ({want}), not {kty}"
        )))
    }
}

fn expect_curve(
    crv: Option<Param<'_>>,
    want: i64,
    alg: &str,
    name: &str,
) -> Result<(), WebauthnError> {
    match crv {
        Some(Param::Int(c)) if c == want => Ok(()),
        Some(Param::Int(c)) => Err(unsupported(format!(
            "an {alg} key must be on curve {name} ({want}), not {c}"
        ))),
        _ => Err(malformed(format_args!(
            "an {alg} key needs its curve (crv)"
        ))),
    }
}

fn coordinate(p: Option<Param<'_>>, name: &str) -> Result<[u8; 32], WebauthnError> {
    match p {
        Some(Param::Bytes(b)) => <[u8; 32]>::try_from(b).map_err(|_| {
            unsupported(format!(
                "coordinate {name} has {} bytes; 32 are required",
                b.len()
            ))
        }),
        _ => Err(malformed(format_args!(
            "coordinate {name} is missing or not a byte string"
        ))),
    }
}
